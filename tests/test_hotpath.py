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
        _hotpath.LoopCheck("curio", 1, get_loop, None, None)
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
    gone = [weakref.ref(token), weakref.ref(here)]
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
    history.newest = point
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
    history.newest = point
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
