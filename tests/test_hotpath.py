"""The await's own steps in C (``aiocudasem._hotpath``): the running loop's check, the finder of
the loop's notifier, and the wait history. Their integration (a trio guest run, a second
asyncio.run) is tested in test_notifier.py; these pin down each piece on its own."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import gc
import threading
import weakref
from typing import Any

import anyio
import pytest
import sniffio
import trio

import aiocudasem as acs
from aiocudasem import _hotpath
from aiocudasem._notifier import _tuning

get_loop = asyncio.events._get_running_loop


def asyncio_check(token: object) -> _hotpath.LoopCheck:
    return _hotpath.LoopCheck(
        "asyncio", token, get_loop, sniffio.thread_local, sniffio.current_async_library_cvar
    )


def test_an_asyncio_check_holds_only_in_its_own_loop() -> None:
    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        return asyncio_check(loop)(), asyncio_check(object())()

    assert asyncio.run(main()) == (True, False)
    assert asyncio_check(object())() is False  # outside any loop


def test_an_asyncio_check_fails_while_sniffio_names_another_library() -> None:
    """A trio guest run on an asyncio loop sets sniffio's thread-local name, and its tasks see
    asyncio's running loop too: the check must not hand them the asyncio loop's notifier."""

    async def main() -> list[bool]:
        check = asyncio_check(asyncio.get_running_loop())
        seen = [check()]
        sniffio.thread_local.name = "trio"
        try:
            seen.append(check())
        finally:
            sniffio.thread_local.name = None
        token = sniffio.current_async_library_cvar.set("trio")
        try:
            seen.append(check())
        finally:
            sniffio.current_async_library_cvar.reset(token)
        token = sniffio.current_async_library_cvar.set("asyncio")
        try:
            seen.append(check())
        finally:
            sniffio.current_async_library_cvar.reset(token)
        return seen

    assert asyncio.run(main()) == [True, False, False, True]


def test_an_asyncio_check_without_sniffio_asks_only_the_loop() -> None:
    async def main() -> tuple[bool, bool]:
        check = _hotpath.LoopCheck("asyncio", asyncio.get_running_loop(), get_loop, None, None)
        sniffio.thread_local.name = "trio"
        try:
            return check(), _hotpath.LoopCheck("asyncio", 1, get_loop, None, None)()
        finally:
            sniffio.thread_local.name = None

    assert asyncio.run(main()) == (True, False)


def test_a_trio_check_holds_only_in_its_own_run() -> None:
    def check_of(token: object) -> _hotpath.LoopCheck:
        return _hotpath.LoopCheck(
            "trio", token, trio.lowlevel.current_trio_token, sniffio.thread_local, None
        )

    async def main() -> tuple[Any, bool, bool]:
        token = trio.lowlevel.current_trio_token()
        return token, check_of(token)(), check_of(object())()

    token, mine, other = trio.run(main)
    assert (mine, other) == (True, False)
    assert check_of(token)() is False  # outside trio.run: RuntimeError inside, not raised
    assert trio.run(lambda: _call_async(check_of(token))) is False  # a later run


async def _call_async(check: _hotpath.LoopCheck) -> bool:
    return check()


def test_a_check_passes_on_what_its_probe_raises_but_trio_s_outside_a_run() -> None:
    class Boom(Exception):
        pass

    def probe() -> object:
        raise Boom

    with pytest.raises(Boom):
        _hotpath.LoopCheck("asyncio", 1, probe, None, None)()
    sniffio.thread_local.name = "trio"
    try:
        with pytest.raises(Boom):
            _hotpath.LoopCheck("trio", 1, probe, sniffio.thread_local, None)()
    finally:
        sniffio.thread_local.name = None


def test_a_loop_check_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="asyncio' or 'trio"):
        _hotpath.LoopCheck("curio", 1, get_loop, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _hotpath.LoopCheck(b"asyncio", 1, get_loop, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        _hotpath.LoopCheck("asyncio", 1, 42, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ContextVar"):
        _hotpath.LoopCheck("asyncio", 1, get_loop, None, "cvar")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thread-local"):
        _hotpath.LoopCheck("trio", 1, get_loop, None, None)
    check = _hotpath.LoopCheck("asyncio", 1, get_loop, None, None)
    with pytest.raises(TypeError, match="no arguments"):
        check(1)  # type: ignore[call-arg]


class _Notifier:
    def __init__(self, serves: Any) -> None:
        self._serves_running_loop = serves


def test_the_finder_returns_the_remembered_notifier_only_while_it_serves_the_loop() -> None:
    here = threading.local()
    deferred: collections.deque[object] = collections.deque()
    slow_calls: list[int] = []
    fallback = object()

    def slow() -> object:
        slow_calls.append(1)
        return fallback

    find = _hotpath.Finder(here, deferred, slow)
    with pytest.raises(AttributeError):
        find()  # here has no notifier attribute at all: an error, not a silent fallback
    here.notifier = None
    assert find() is fallback
    yes = _Notifier(lambda: True)
    here.notifier = yes
    assert find() is yes
    here.notifier = _Notifier(lambda: False)
    assert find() is fallback
    here.notifier = _Notifier(_hotpath.LoopCheck("asyncio", object(), get_loop, None, None))
    assert find() is fallback  # a C check, called directly: no loop is running here
    here.notifier = yes
    deferred.append("a release waiting for a loop")
    assert find() is fallback  # the slow path runs deferred releases first
    deferred.clear()
    assert find() is yes
    assert len(slow_calls) == 4
    with pytest.raises(TypeError, match="no arguments"):
        find(1)  # type: ignore[call-arg]


def test_the_finder_passes_on_errors_of_the_check_and_of_the_slow_path() -> None:
    here = threading.local()

    def boom() -> bool:
        raise KeyError("check")

    here.notifier = _Notifier(boom)
    with pytest.raises(KeyError, match="check"):
        _hotpath.Finder(here, collections.deque(), lambda: None)()
    here.notifier = None

    def slow() -> object:
        raise LookupError("slow")

    with pytest.raises(LookupError, match="slow"):
        _hotpath.Finder(here, collections.deque(), slow)()
    with pytest.raises(TypeError, match="callable"):
        _hotpath.Finder(here, collections.deque(), None)  # type: ignore[arg-type]


def test_the_finder_and_check_are_collected_with_the_cycles_they_sit_in() -> None:
    """Each holds its collaborators strongly, and a notifier holds its check, whose token (an
    asyncio loop) can lead back to the notifier: the collector must see through both."""

    class Token:
        pass

    token = Token()
    check = _hotpath.LoopCheck("asyncio", token, get_loop, None, None)
    token.check = check  # type: ignore[attr-defined]
    here = threading.local()
    finder = _hotpath.Finder(here, collections.deque(), lambda: None)
    here.finder = finder
    gone: list[weakref.ref[Any]] = [weakref.ref(token), weakref.ref(here)]
    del token, check, here, finder
    gc.collect()
    assert [r() for r in gone] == [None, None]


def test_the_history_follows_the_spin_limit_that_configure_sets() -> None:
    saved = acs.configure()
    try:
        assert _hotpath.get_spin_limit() == saved.spin_limit
        history = _hotpath.History()
        acs.configure(spin_limit=0.001)
        assert _hotpath.get_spin_limit() == _tuning.current.spin_limit == 0.001
        assert history.spin_window() == 0.001  # no history yet: the whole limit
        history.learn(0.0002)
        assert history.spin_window() == pytest.approx(2 * 0.0002 + 20e-6)
        acs.configure(spin_limit=0.0003)
        assert history.spin_window() == 0.0003  # 2 x 0.2 ms + 20 us, capped by the new limit
        acs.configure(spin_limit=0.0001)
        assert history.spin_window() == 0.0  # 0.2 ms is "long" for the new limit
        with pytest.raises(ValueError):
            acs.configure(spin_limit=-1)
        assert _hotpath.get_spin_limit() == 0.0001  # a refused configure() changes nothing
    finally:
        acs.configure(spin_limit=saved.spin_limit)
    assert _hotpath.get_spin_limit() == saved.spin_limit
    with pytest.raises(ValueError):
        _hotpath.set_spin_limit(float("nan"))
    with pytest.raises(TypeError):
        _hotpath.set_spin_limit("1")  # type: ignore[arg-type]


def test_a_history_keeps_its_newest_point_and_refuses_bad_input() -> None:
    history = _hotpath.History()
    assert (history.newest, history.recent, history.unspun) == (None, -1.0, 0)
    point = object()
    history.newest = point  # type: ignore[assignment]
    assert history.newest is point
    history.newest = None
    assert history.newest is None
    with pytest.raises(AttributeError, match="None"):
        del history.newest
    with pytest.raises(TypeError):
        history.learn("slow")  # type: ignore[arg-type]
    history.learn(3)  # an int is seconds too
    assert history.recent == 3.0
    with pytest.raises(TypeError, match="no arguments"):
        _hotpath.History(1)  # type: ignore[call-arg]


def test_a_history_and_the_point_it_names_are_collected_together() -> None:
    class Point:
        pass

    history = _hotpath.History()
    point = Point()
    point.history = history  # type: ignore[attr-defined]
    history.newest = point  # type: ignore[assignment]
    gone = weakref.ref(point)
    del history, point
    gc.collect()
    assert gone() is None


@pytest.mark.anyio
async def test_the_running_notifier_is_found_by_the_c_finder() -> None:
    from aiocudasem._notifier import current_notifier

    assert isinstance(current_notifier, _hotpath.Finder)
    n = current_notifier()
    assert current_notifier() is n
    assert isinstance(n._serves_running_loop, _hotpath.LoopCheck)
    assert n._serves_running_loop() is True
    ctx = contextvars.copy_context()
    assert ctx.run(n._serves_running_loop) is True
    await anyio.lowlevel.checkpoint()


class _PythonHistory:
    """The Python History that the C type replaced, kept here as the reference."""

    def __init__(self) -> None:
        self.recent = -1.0
        self.unspun = 0

    def learn(self, took: float) -> None:
        old = self.recent
        if old < 0 or old > _tuning.current.spin_limit >= took:
            self.recent = took
        else:
            self.recent = 0.75 * old + 0.25 * took

    def spin_window(self) -> float:
        limit = _tuning.current.spin_limit
        recent = self.recent
        if recent < 0:
            return limit
        if recent > limit:
            self.unspun += 1
            if self.unspun < _hotpath.PROBE_EVERY:
                return 0.0
            self.unspun = 0
            return limit
        return min(limit, 2.0 * recent + 20e-6)


def test_the_c_history_matches_the_python_one_it_replaced() -> None:
    import math
    import random

    def same(a: float, b: float) -> bool:
        return a == b or (math.isnan(a) and math.isnan(b))

    saved = acs.configure()
    rng = random.Random(8)
    limit = saved.spin_limit
    special = [0.0, limit, limit * 2, 1.0, 3, float("nan"), float("inf"), 1e-7]
    try:
        for _ in range(200):
            c, p = _hotpath.History(), _PythonHistory()
            for _ in range(60):
                step = rng.random()
                if step < 0.05:
                    acs.configure(spin_limit=rng.choice([0.0, 1e-4, 250e-6, 0.01]))
                elif step < 0.55:
                    took = rng.choice(special) if rng.random() < 0.2 else rng.expovariate(3e3)
                    c.learn(took)
                    p.learn(took)
                    assert same(c.recent, p.recent)
                else:
                    assert same(c.spin_window(), p.spin_window())
                    assert c.unspun == p.unspun
    finally:
        acs.configure(spin_limit=saved.spin_limit)


def test_a_history_set_from_outside_still_probes() -> None:
    history = _hotpath.History()
    history.learn(1.0)  # long
    history.unspun = 2**31 - 1
    assert history.spin_window() == _hotpath.get_spin_limit()  # the probe, and a fresh count
    assert history.unspun == 0
    history.unspun = -3
    assert history.spin_window() == 0.0
    assert history.unspun == -2


def test_an_asyncio_check_on_a_context_variable_without_default_raises_as_get_would() -> None:
    cvar: contextvars.ContextVar[str] = contextvars.ContextVar("no_default")

    async def main() -> bool:
        check = _hotpath.LoopCheck("asyncio", asyncio.get_running_loop(), get_loop, None, cvar)  # type: ignore[arg-type]
        with pytest.raises(LookupError):
            check()
        cvar.set("asyncio")
        return check()

    assert asyncio.run(main()) is True


def test_the_finder_falls_back_for_a_trio_notifier_outside_its_run() -> None:
    here = threading.local()
    check = _hotpath.LoopCheck(
        "trio", object(), trio.lowlevel.current_trio_token, sniffio.thread_local, None
    )
    here.notifier = _Notifier(check)
    fallback = object()
    sniffio.thread_local.name = "trio"  # as in a run, but there is none: RuntimeError inside
    try:
        assert _hotpath.Finder(here, collections.deque(), lambda: fallback)() is fallback
    finally:
        sniffio.thread_local.name = None


def test_the_finder_and_check_keep_reference_counts_on_every_path() -> None:
    import sys

    async def main() -> None:
        loop = asyncio.get_running_loop()
        here = threading.local()
        deferred: collections.deque[object] = collections.deque()
        fallback = object()
        check = asyncio_check(loop)
        n = _Notifier(check)
        here.notifier = n

        def boom() -> bool:
            raise KeyError

        finder = _hotpath.Finder(here, deferred, lambda: fallback)
        counted = (n, check, loop, fallback, here)
        before = [sys.getrefcount(o) for o in counted]
        for _ in range(1000):
            assert finder() is n  # the fast path
            deferred.append(1)
            assert finder() is fallback  # a release waits
            deferred.clear()
            n._serves_running_loop = boom
            with pytest.raises(KeyError):
                finder()  # the check raises
            n._serves_running_loop = check
        assert [sys.getrefcount(o) for o in counted] == before

    asyncio.run(main())
