"""The await's own steps in C (``aiocudasem._hotpath``): the running loop's check, the finder of
the loop's notifier, and the wait history. Their integration (a trio guest run, a second
asyncio.run) is tested in test_notifier.py; these pin down each piece on its own."""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import contextvars
import gc
import threading
import time
import types
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import sniffio
import trio

import aiocudasem as acs
from aiocudasem import _hotpath
from aiocudasem._notifier import _tuning
from aiocudasem.testing import workloads

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
        self.serves_running_loop = serves


def test_the_finder_returns_the_remembered_notifier_only_while_it_serves_the_loop() -> None:
    here = threading.local()
    deferred: collections.deque[object] = collections.deque()
    slow_calls: list[int] = []
    serving = {"yes": True, "found": True}
    found = _Notifier(lambda: serving["found"])

    def slow() -> object:
        slow_calls.append(1)
        return found

    find = _hotpath.Finder(here, deferred, slow)
    with pytest.raises(AttributeError):
        find()  # here has no notifier attribute at all: an error, not a silent fallback
    here.notifier = None
    assert find() is found
    assert find() is found and len(slow_calls) == 1  # remembered: no second slow call
    serving["found"] = False  # its loop ended
    assert find() is found and len(slow_calls) == 2  # the slow path, not here.notifier
    serving["found"] = True

    # A fresh finder reads here.notifier first, and remembers what it found there.
    find = _hotpath.Finder(here, deferred, slow)
    yes = _Notifier(lambda: serving["yes"])
    here.notifier = yes
    assert find() is yes and len(slow_calls) == 2
    here.notifier = None
    assert find() is yes and len(slow_calls) == 2  # the remembered one, while it serves
    serving["yes"] = False
    assert find() is found and len(slow_calls) == 3
    serving["yes"] = True
    here.notifier = _Notifier(_hotpath.LoopCheck("asyncio", object(), get_loop, None, None))
    find = _hotpath.Finder(here, deferred, slow)
    assert find() is found  # a C check, called directly: no loop is running here
    deferred.append("a release waiting for a loop")
    assert find() is found and len(slow_calls) == 5  # the slow path runs deferred releases
    deferred.clear()
    assert find() is found and len(slow_calls) == 5
    with pytest.raises(TypeError, match="no arguments"):
        find(1)  # type: ignore[call-arg]


def test_the_finder_remembers_one_thread_and_reads_here_for_another() -> None:
    """The finder remembers the notifier of the thread that called it last. Another thread
    reads its own ``here.notifier``; the first then reads its own again."""
    here = threading.local()
    mine, theirs = _Notifier(lambda: True), _Notifier(lambda: True)
    slow_calls: list[int] = []

    def slow() -> object:
        slow_calls.append(1)
        return None

    find = _hotpath.Finder(here, collections.deque(), slow)
    here.notifier = mine
    assert find() is mine
    seen: list[object] = []

    def other() -> None:
        here.notifier = theirs
        seen.append(find())
        seen.append(find())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [theirs, theirs]
    here.notifier = None  # this thread's here is read again, and says nothing now
    assert find() is None and slow_calls == [1]
    here.notifier = mine
    assert find() is mine and slow_calls == [1]


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
    assert isinstance(n.serves_running_loop, _hotpath.LoopCheck)
    assert n.serves_running_loop() is True
    ctx = contextvars.copy_context()
    assert ctx.run(n.serves_running_loop) is True
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
        check = asyncio_check(loop)
        n = _Notifier(check)
        fallback = _Notifier(check)
        here.notifier = n

        def boom() -> bool:
            raise KeyError

        counted = (n, check, loop, fallback, here)
        before = [sys.getrefcount(o) for o in counted]
        for _ in range(1000):
            here.notifier = n
            finder = _hotpath.Finder(here, deferred, lambda: fallback)
            assert finder() is n  # here.notifier
            assert finder() is n  # the remembered one
            deferred.append(1)
            assert finder() is fallback  # a release waits
            deferred.clear()
            assert finder() is fallback  # remembered now
            fallback.serves_running_loop = boom
            with pytest.raises(KeyError):
                finder()  # the check raises
            fallback.serves_running_loop = check
            del finder
        assert [sys.getrefcount(o) for o in counted] == before

    asyncio.run(main())


# ---------------------------------------------------------------- sniffio's name, per thread


def test_an_asyncio_check_reads_sniffio_s_name_of_its_own_thread() -> None:
    """The check remembers the dict that holds sniffio's thread-local attributes in the thread
    that called it last: a name set in another thread, or in this one after a switch, counts
    only where it was set."""
    check = _hotpath.LoopCheck(
        "asyncio", None, lambda: None, sniffio.thread_local, sniffio.current_async_library_cvar
    )
    assert check() is True  # no loop is the token None here: asyncio, nothing named
    seen: list[bool] = []
    named = threading.Event()
    done = threading.Event()

    def other() -> None:
        sniffio.thread_local.name = "trio"
        seen.append(check())
        named.set()
        done.wait(5)
        seen.append(check())
        del sniffio.thread_local.name  # back to the class's value
        seen.append(check())

    t = threading.Thread(target=other)
    t.start()
    named.wait(5)
    seen.append(check())  # this thread: still nothing named
    done.set()
    t.join()
    assert seen == [False, True, False, True]
    sniffio.thread_local.name = "trio"
    try:
        assert check() is False
    finally:
        sniffio.thread_local.name = None
    assert check() is True


def test_a_check_reads_a_local_s_name_the_generic_way_where_it_must() -> None:
    """A name that a descriptor supplies, a local that is not a threading.local, or one with no
    name at all: read as getattr() reads it, every time."""

    class Computed(threading.local):
        calls = 0

        @property
        def name(self) -> str | None:
            Computed.calls += 1
            return "trio" if Computed.calls % 2 == 0 else None

    local = Computed()
    check = _hotpath.LoopCheck("asyncio", None, lambda: None, local, None)
    assert [check() for _ in range(4)] == [True, False, True, False]

    class Plain:
        name: str | None = None

    plain = Plain()
    check = _hotpath.LoopCheck("asyncio", None, lambda: None, plain, None)
    assert check() is True
    plain.name = "trio"
    assert check() is False

    bare = threading.local()
    check = _hotpath.LoopCheck("asyncio", None, lambda: None, bare, None)
    with pytest.raises(AttributeError):
        check()
    bare.name = None
    assert check() is True


# ---------------------------------------------------------------- the first query


class _Stream:
    """The hooks of a WaitState (closed_error, query_failed, drive)."""

    def closed_error(self) -> BaseException:
        return anyio.ClosedResourceError("the stream was closed")


class _Drv:
    """What the wait calls of a driver: the stream's query, and the event calls, recorded."""

    def __init__(self, query: Any, ready: list[bool] | None = None) -> None:
        self.stream_query = query
        self.ready = ready if ready is not None else []  # answers of event_query, in turn
        self.calls: list[tuple[Any, ...]] = []
        self.fail_record: BaseException | None = None
        self.fail_query: BaseException | None = None
        self.created = 100

    def event_create(self, device: int) -> int:
        self.created += 1
        self.calls.append(("create", device))
        return self.created

    def event_record(self, event: int, stream: int) -> None:
        self.calls.append(("record", event, stream))
        if self.fail_record is not None:
            raise self.fail_record

    def event_query(self, event: int) -> bool:
        self.calls.append(("query", event))
        if self.fail_query is not None:
            raise self.fail_query
        return self.ready.pop(0) if self.ready else False

    def event_destroy(self, event: int) -> None:
        self.calls.append(("destroy", event))


def test_the_first_query_learns_only_an_idle_stream() -> None:
    history, n = _hotpath.History(), _WaitNotifier()
    asked: list[int] = []

    def busy(h: int) -> bool:
        asked.append(h)
        return False

    assert history.closed is False
    for query, done in ((busy, False), (lambda h: 1, True), (lambda h: [], False)):
        w = _wait(_WaitStream(), query, n, history)
        next(w)
        if done:
            with pytest.raises(StopIteration):
                next(w)
            assert 0 <= history.recent < 1.0  # the same clock as time.perf_counter()
        else:
            assert next(w) == "busy"
            w.close()
    assert asked == [7]
    with pytest.raises(TypeError, match="expected a WaitState"):
        _hotpath.wait_complete(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _hotpath.WaitState(_Drv(bool), 0, 7, [], object(), _Stream(), _finder(n))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _hotpath.WaitState(_Drv(bool), 0, 7, [], history, _Stream(), lambda: n)  # type: ignore[arg-type]

    class NotAnError(_WaitStream):
        def closed_error(self) -> Any:
            return "closed"

    history.closed = True
    with pytest.raises(TypeError, match="not an exception"):
        next(_wait(NotAnError(), bool, n, history))


def test_a_stream_s_history_says_when_it_is_closed_or_detached(sim: acs.Driver) -> None:
    s = acs.open_stream(driver=sim)
    assert s._history.closed is False
    s.close()
    assert s._history.closed is True
    s = acs.open_stream(driver=sim)
    handle = s.detach()
    assert s._history.closed is True
    sim.stream_destroy(handle)


class _WaitNotifier:
    """What wait_complete() reads of a notifier: its checkpoint kind, its counters, the test
    of the running loop that the finder makes, and what the busy path calls. It never lets a
    wait spin unless told to (`spin`); its park is the stream's _wait_busy()."""

    def __init__(self, checkpoint: Any = None, spin: bool = False) -> None:
        self.bare_yield = checkpoint is None
        if checkpoint is not None:
            self.checkpoint = checkpoint
        self.counters = _hotpath.Counters()
        self.serves_running_loop = lambda: True
        self.spin = spin
        self.ready_queue: Any = None
        self.parked_by: Any = None
        self.parked: list[tuple[Any, ...]] = []

    def shared_point(self, history: Any, started: float) -> Any:
        return None

    def may_spin(self) -> bool:
        return self.spin

    def wait_recorded(self, *args: Any) -> Any:
        self.parked.append(args)
        return self.parked_by._wait_busy(self, args[6])


def _finder(n: _WaitNotifier) -> _hotpath.Finder:
    return _hotpath.Finder(types.SimpleNamespace(notifier=n), [], lambda: n)


class _WaitStream(_Stream):
    """The busy path and the error path of a stream, recorded: the busy path yields "busy"
    twice, answering with what it is sent, then returns."""

    def __init__(self) -> None:
        self.busy: list[tuple[Any, float]] = []
        self.sent: list[Any] = []
        self.failed: list[BaseException] = []

    async def _wait_busy(self, notifier: Any, started: float) -> None:
        self.busy.append((notifier, started))
        self.sent.append(await _yield("busy"))
        self.sent.append(await _yield("busy"))

    def query_failed(self, state: Any, exc: BaseException) -> None:
        self.failed.append(exc)
        raise exc

    @staticmethod
    async def drive(wait: Any) -> None:
        step = wait.step
        try:
            while (todo := step()) is not None:
                await todo
        except BaseException:
            wait.close()
            raise


@types.coroutine
def _yield(value: Any) -> Any:
    return (yield value)


def _state(
    stream: Any,
    query: Any,
    n: _WaitNotifier,
    history: _hotpath.History | None = None,
    finder: Any = None,
    drv: Any = None,
    pool: list[int] | None = None,
) -> _hotpath.WaitState:
    history = history if history is not None else _hotpath.History()
    n.parked_by = stream
    drv = drv if drv is not None else _Drv(query)
    pool = pool if pool is not None else [11]
    return _hotpath.WaitState(drv, 0, 7, pool, history, stream, finder or _finder(n))


def _wait(
    stream: Any, query: Any, n: _WaitNotifier, history: _hotpath.History | None = None
) -> Any:
    return _hotpath.wait_complete(_state(stream, query, n, history))


def test_wait_complete_yields_once_then_settles_and_counts() -> None:
    stream, history, n = _WaitStream(), _hotpath.History(), _WaitNotifier()
    w = _wait(stream, lambda h: True, n, history)
    assert isinstance(w, collections.abc.Coroutine) and w.__await__() is w
    assert next(w) is None  # the one bare yield
    with pytest.raises(StopIteration) as stop:
        next(w)
    assert stop.value.value is None and history.recent >= 0
    assert n.counters.completed == 1 and stream.busy == []
    with pytest.raises(RuntimeError, match="cannot reuse"):
        next(w)  # awaited once, as a coroutine

    history = _hotpath.History()
    before = time.perf_counter()
    w = _wait(stream, lambda h: False, n, history)
    assert w.send(None) is None
    assert w.send("ignored") == "busy"  # the busy path's first yield, in the same step
    ((notifier, started),) = stream.busy
    assert notifier is n and before <= started <= time.perf_counter()  # when the wait began
    assert w.send("one") == "busy"
    with pytest.raises(StopIteration):
        w.send("two")
    assert stream.sent == ["one", "two"]
    assert history.recent < 0 and n.counters.completed == 1  # the busy path counts its own

    w = _wait(stream, bool, n)
    with pytest.raises(TypeError, match="non-None"):
        w.send(1)
    w.close()


def test_wait_complete_raises_the_closed_error_before_and_after_its_checkpoint() -> None:
    stream, n = _WaitStream(), _WaitNotifier()
    asked: list[int] = []
    history = _hotpath.History()
    history.closed = True
    w = _wait(stream, asked.append, n, history)
    with pytest.raises(anyio.ClosedResourceError):
        next(w)  # no checkpoint
    history = _hotpath.History()
    w = _wait(stream, asked.append, n, history)
    next(w)
    history.closed = True  # closed during the checkpoint
    with pytest.raises(anyio.ClosedResourceError):
        next(w)
    w = _wait(stream, asked.append, n)
    next(w)
    w.close()  # ends it without a query
    with pytest.raises(RuntimeError, match="cannot reuse"):
        next(w)
    assert asked == [] and n.counters.completed == 0
    # the closed error of the settle goes the way of the query's errors; the one before the
    # checkpoint is raised directly
    assert [type(e) for e in stream.failed] == [anyio.ClosedResourceError]


def test_wait_complete_delegates_to_a_loop_s_own_checkpoint() -> None:
    """On trio: what trio.lowlevel.checkpoint() yields goes to the loop, and what the loop sends
    back goes to it, as `yield from` would pass them."""
    got: list[Any] = []

    async def checkpoint() -> None:
        got.append(await _yield("trap"))

    stream, n = _WaitStream(), _WaitNotifier(checkpoint)
    asked: list[int] = []

    def idle(h: int) -> bool:
        asked.append(h)
        return True

    w = _wait(stream, idle, n)
    assert w.send(None) == "trap" and asked == []
    with pytest.raises(StopIteration):
        w.send("outcome")
    assert got == ["outcome"] and asked == [7] and n.counters.completed == 1

    # a checkpoint that raises (a cancellation) ends the wait before its query
    async def cancelled() -> None:
        await _yield("trap")
        raise KeyError("cancelled")

    n = _WaitNotifier(cancelled)
    w = _wait(stream, idle, n)
    w.send(None)
    with pytest.raises(KeyError):
        w.send(None)
    assert asked == [7] and n.counters.completed == 0

    # and one that is done without yielding goes straight on to the query
    async def at_once() -> None:
        pass

    w = _wait(stream, idle, _WaitNotifier(at_once))
    with pytest.raises(StopIteration):
        w.send(None)
    assert asked == [7, 7]


def test_wait_complete_throws_into_what_it_delegates_to() -> None:
    stream, n = _WaitStream(), _WaitNotifier()
    asked: list[int] = []

    # at its bare yield: raised there, with no query
    w = _wait(stream, asked.append, n)
    next(w)
    with pytest.raises(KeyError):
        w.throw(KeyError("x"))
    with pytest.raises(RuntimeError, match="cannot reuse"):
        next(w)

    # never started: raised at once, as into a coroutine
    w = _wait(stream, asked.append, n)
    with pytest.raises(ValueError, match="v"):
        w.throw(ValueError, ValueError("v"), None)
    assert asked == []

    # in the loop's checkpoint: into it; one that swallows it goes on to the query
    thrown: list[BaseException] = []

    async def swallowing() -> None:
        try:
            await _yield("trap")
        except KeyError as exc:
            thrown.append(exc)

    w = _wait(stream, lambda h: True, _WaitNotifier(swallowing))
    assert w.send(None) == "trap"
    with pytest.raises(StopIteration):
        w.throw(KeyError("k"))
    assert len(thrown) == 1

    # ... and one whose stream is busy then, with a busy path that ends at once, is over
    class Quick(_WaitStream):
        async def _wait_busy(self, notifier: Any, started: float) -> None:
            self.busy.append((notifier, started))

    quick = Quick()
    w = _wait(quick, lambda h: False, _WaitNotifier(swallowing))
    assert w.send(None) == "trap"
    with pytest.raises(StopIteration):
        w.throw(KeyError("k"))
    assert len(quick.busy) == 1
    with pytest.raises(RuntimeError, match="cannot reuse"):
        next(w)

    # in the busy path: into it
    w = _wait(stream, lambda h: False, n)
    next(w)
    assert next(w) == "busy"
    with pytest.raises(IndexError):
        w.throw(IndexError("i"))
    with pytest.raises(TypeError, match="1 to 3"):
        w.throw()
    with pytest.raises(TypeError, match="deriving from BaseException"):
        _wait(stream, bool, n).throw(42)


def test_wait_complete_raises_a_failed_query_through_the_stream() -> None:
    stream, n = _WaitStream(), _WaitNotifier()

    def boom(h: int) -> bool:
        raise KeyError(h)

    w = _wait(stream, boom, n)
    next(w)
    with pytest.raises(KeyError):
        next(w)
    assert [type(e) for e in stream.failed] == [KeyError] and n.counters.completed == 0

    class Quiet(_WaitStream):
        def query_failed(self, state: Any, exc: BaseException) -> None:
            return None  # returns instead of raising: a bug, reported as one

    w = _wait(Quiet(), boom, n)
    next(w)
    with pytest.raises(SystemError, match="instead of raising"):
        next(w)


def test_wait_complete_turns_a_stop_iteration_of_the_query_into_runtime_error() -> None:
    """Through next() a StopIteration would end the await with its value; PEP 479 makes it a
    RuntimeError, as here."""
    stream, n = _WaitStream(), _WaitNotifier()

    def odd(h: int) -> bool:
        raise StopIteration(42.0)

    w = _wait(stream, odd, n)
    next(w)
    with pytest.raises(RuntimeError, match="StopIteration") as info:
        next(w)
    assert isinstance(info.value.__cause__, StopIteration)

    async def main() -> None:
        await _wait(stream, odd, n)

    with pytest.raises(RuntimeError):
        asyncio.run(main())


def test_wait_complete_refuses_to_be_resumed_from_inside_its_query() -> None:
    stream, n = _WaitStream(), _WaitNotifier()
    seen: list[BaseException] = []

    def reenter(h: int) -> bool:
        for step in (lambda: next(w), lambda: w.send(None), w.close, lambda: w.throw(KeyError)):
            try:
                step()
            except ValueError as exc:
                seen.append(exc)
        return True

    w = _wait(stream, reenter, n)
    next(w)
    with pytest.raises(StopIteration):
        next(w)
    assert len(seen) == 4 and all("already executing" in str(e) for e in seen)


def test_wait_complete_on_asyncio_is_a_task_s_coroutine_and_is_cancelled_at_its_yield() -> None:
    async def main() -> tuple[list[int], bool, int]:
        stream, n = _WaitStream(), _WaitNotifier()
        asked: list[int] = []
        task = asyncio.create_task(_wait(stream, asked.append, n))
        await asyncio.sleep(0)  # the task is at its yield now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        done = asyncio.create_task(_wait(stream, lambda h: True, n))
        await done
        return asked, task.cancelled(), n.counters.completed

    assert asyncio.run(main()) == ([], True, 1)


def test_wait_complete_never_awaited_is_warned_about_as_a_coroutine() -> None:
    w = _wait(_WaitStream(), bool, _WaitNotifier())
    with pytest.warns(RuntimeWarning, match="never awaited"):
        del w
        gc.collect()


def test_wait_complete_keeps_reference_counts_and_is_collected_in_a_cycle() -> None:
    import sys

    stream, history, n = _WaitStream(), _hotpath.History(), _WaitNotifier()
    finder = _finder(n)

    def boom(h: int) -> bool:
        raise KeyError(h)

    def idle(h: int) -> bool:
        return True

    def busy(h: int) -> bool:
        return False

    finder()  # remembers n: from here on it holds it
    states = {q: _state(stream, q, n, history, finder) for q in (idle, boom, busy)}
    with pytest.raises(StopIteration):
        w = _hotpath.wait_complete(states[idle])
        next(w)
        next(w)
    del w
    counted = (stream, history, idle, boom, busy, finder, n, *states.values())
    before = [sys.getrefcount(o) for o in counted]
    for query in [idle, boom, busy, idle] * 300:
        w = _hotpath.wait_complete(states[query])
        next(w)
        if query is busy:
            next(w)
            w.close()  # in the busy path
        else:
            with pytest.raises(StopIteration if query is idle else KeyError):
                next(w)
        del w
        w = _hotpath.wait_complete(states[query])
        w.close()  # never stepped
        del w
    del query
    stream.busy.clear()
    stream.failed.clear()
    n.parked.clear()
    gc.collect()  # the failed queries' tracebacks hold their frames in cycles
    assert [sys.getrefcount(o) for o in counted] == before

    class Holder(_WaitStream):
        pass

    holder = Holder()
    holder.wait = _hotpath.wait_complete(_state(holder, busy, n, history, finder))  # type: ignore[attr-defined]
    next(holder.wait)  # type: ignore[attr-defined]
    next(holder.wait)  # type: ignore[attr-defined]  (suspended in the busy path)
    n.parked_by = None  # the park was called: only the wait holds the holder now
    n.parked.clear()
    gone = weakref.ref(holder)
    del holder
    gc.collect()
    assert gone() is None


# ---------------------------------------------------------------- trio's run context


def test_a_trio_check_on_the_run_context_holds_only_in_its_own_run() -> None:
    from aiocudasem._notifier._loops._trio import trio_run_context as _trio_run_context

    def check_of_this_run() -> _hotpath.LoopCheck:
        token = trio.lowlevel.current_trio_token()
        known = _trio_run_context(token)
        assert known is not None  # the trio this suite runs keeps its context as expected
        context, runner = known
        assert _trio_run_context(object()) is None  # not this run's token
        return _hotpath.LoopCheck(
            "trio",
            token,
            trio.lowlevel.current_trio_token,
            sniffio.thread_local,
            None,
            context=context,
            runner=runner,
        )

    async def first() -> tuple[_hotpath.LoopCheck, bool]:
        check = check_of_this_run()
        return check, check()

    check, inside = trio.run(first)
    assert inside is True
    assert check() is False  # outside any run (sniffio names nothing)

    async def second() -> list[bool]:
        seen = [check()]  # another run: another runner
        result: list[bool] = []
        await trio.to_thread.run_sync(lambda: result.append(check()))
        return seen + result  # a worker thread: no run there

    assert trio.run(second) == [False, False]
    sniffio.thread_local.name = "trio"  # as in a run, but there is none: no runner in the context
    try:
        assert check() is False
    finally:
        sniffio.thread_local.name = None


def test_a_trio_check_refuses_a_run_context_it_cannot_read() -> None:
    local = sniffio.thread_local
    probe = trio.lowlevel.current_trio_token
    with pytest.raises(TypeError, match="go together"):
        _hotpath.LoopCheck("trio", object(), probe, local, None, context=threading.local())
    with pytest.raises(TypeError, match="only for trio"):
        _hotpath.LoopCheck(
            "asyncio", object(), get_loop, None, None, context=threading.local(), runner=1
        )
    with pytest.raises(TypeError, match=r"plain threading\.local"):
        _hotpath.LoopCheck("trio", object(), probe, local, None, context=object(), runner=1)

    class Odd(threading.local):
        def __getattribute__(self, name: str) -> Any:
            return super().__getattribute__(name)

    with pytest.raises(TypeError, match=r"plain threading\.local"):
        _hotpath.LoopCheck("trio", object(), probe, local, None, context=Odd(), runner=1)


async def test_the_notifier_of_a_trio_run_checks_the_run_context(anyio_backend_name: str) -> None:
    """The notifier's loop test reads trio's run context in this suite's trio (the fast test
    is exercised by every trio test); it still says no in a worker thread."""
    if anyio_backend_name != "trio":
        pytest.skip("trio's run context")
    from aiocudasem._notifier import current_notifier
    from aiocudasem._notifier._loops._trio import trio_run_context as _trio_run_context

    assert _trio_run_context(trio.lowlevel.current_trio_token()) is not None
    check = current_notifier().serves_running_loop
    assert check() is True
    assert await trio.to_thread.run_sync(check) is False


# ---------------------------------------------------------------- review cases


def test_a_check_keeps_each_thread_s_own_dict_while_a_dead_thread_s_is_freed() -> None:
    """Freeing the remembered dict of a thread that ended can run Python code, during which
    another thread calls the same check: this thread must still read its own dict after."""

    class Local(threading.local):
        name: str | None = None

    local = Local()

    class Slow:
        def __del__(self) -> None:
            time.sleep(0.2)  # the GIL goes to the other thread meanwhile

    async def main() -> list[bool]:
        loop = asyncio.get_running_loop()
        check = _hotpath.LoopCheck("asyncio", loop, get_loop, local, None)
        seen = [check()]

        def dead() -> None:
            local.junk = Slow()  # in this thread's dict only
            check()  # the check now remembers this thread's dict

        t = threading.Thread(target=dead)
        t.start()
        t.join()
        go = threading.Event()

        def other() -> None:
            local.name = "trio"
            go.wait(5)
            check()  # while this thread frees the dead thread's dict

        b = threading.Thread(target=other)
        b.start()
        threading.Timer(0.05, go.set).start()
        seen.append(check())
        b.join()
        return seen + [check() for _ in range(3)]

    assert asyncio.run(main()) == [True] * 5


def test_a_check_follows_a_change_of_the_local_class_s_name() -> None:
    class Local(threading.local):
        name: str | None = None

    local = Local()
    check = _hotpath.LoopCheck("asyncio", None, lambda: None, local, None)
    assert check() is True
    Local.name = "trio"  # a thread that never set one reads the class's
    try:
        assert check() is False
    finally:
        Local.name = None
    assert check() is True


# ------------------------------------------------------------------ the busy path: spin, park


@pytest.fixture
def long_spin() -> Iterator[None]:
    """A spin limit that no pause of the test machine outlasts."""
    acs.configure(spin_limit=30.0)
    yield
    acs.configure(spin_limit=acs.Tuning().spin_limit)


def _spinning(
    ready: list[bool], pool: list[int] | None = None, checkpoint: Any = None
) -> tuple[Any, _Drv, _WaitNotifier, _WaitStream, list[int]]:
    """A wait whose first query finds the stream busy, on a notifier that lets it spin, with
    the event's answers `ready`."""
    stream, n = _WaitStream(), _WaitNotifier(checkpoint, spin=True)
    drv = _Drv(lambda h: False, ready)
    pool = pool if pool is not None else [5, 6]
    w = _hotpath.wait_complete(_state(stream, None, n, drv=drv, pool=pool))
    return w, drv, n, stream, pool


@pytest.mark.usefixtures("long_spin")
def test_a_busy_stream_s_wait_records_an_event_then_queries_it_between_yields() -> None:
    w, drv, n, stream, pool = _spinning([False, True])
    assert next(w) is None  # the first checkpoint
    assert next(w) is None  # busy: recorded, and the spin's first yield
    assert drv.calls == [("record", 6, 7)] and pool == [5] and n.counters.spinning == 1
    assert next(w) is None  # not done yet
    with pytest.raises(StopIteration):
        next(w)  # done: learnt, given back, counted
    assert drv.calls[1:] == [("query", 6), ("query", 6)] and pool == [5, 6]
    assert n.counters.spinning == 0 and n.counters.completed == 1 and stream.busy == []

    # an empty pool: a new event
    w, drv, n, stream, pool = _spinning([True], pool=[])
    next(w)
    next(w)
    with pytest.raises(StopIteration):
        next(w)
    assert drv.calls == [("create", 0), ("record", 101, 7), ("query", 101)] and pool == [101]

    # a full pool: the event is destroyed
    _hotpath.set_pool_limit(1)
    try:
        w, drv, n, stream, pool = _spinning([True], pool=[5, 6])
        next(w)
        next(w)
        with pytest.raises(StopIteration):
            next(w)
        assert drv.calls[-1] == ("destroy", 6) and pool == [5]
    finally:
        _hotpath.set_pool_limit(4096)


def test_a_busy_stream_s_wait_parks_when_it_may_not_spin_or_its_window_passes() -> None:
    # no spinning allowed: recorded, then parked at once
    stream, n = _WaitStream(), _WaitNotifier()
    w = _wait(stream, lambda h: False, n)
    next(w)
    assert next(w) == "busy"
    ((_drv, device, handle, event, pool, history, started, recorded),) = n.parked
    assert (device, handle, event, pool) == (0, 7, 11, [])
    assert started <= recorded <= time.perf_counter() and n.counters.spinning == 0
    w.close()

    # no spin window (a stream whose waits are long): parked, the event the park's
    stream, n = _WaitStream(), _WaitNotifier(spin=True)
    history = _hotpath.History()
    history.recent = 100.0
    pool = [5, 6]
    w = _hotpath.wait_complete(_state(stream, lambda h: False, n, history, pool=pool))
    next(w)
    assert next(w) == "busy"
    assert len(n.parked) == 1 and n.parked[0][3] == 6 and pool == [5]
    assert n.counters.spinning == 0
    w.close()


@pytest.mark.usefixtures("long_spin")
def test_a_spinning_wait_gives_its_event_back_on_every_way_out() -> None:
    def spinning() -> tuple[Any, _Drv, _WaitNotifier, list[int]]:
        w, drv, n, _, pool = _spinning([])
        next(w)
        next(w)
        assert pool == [5] and n.counters.spinning == 1
        return w, drv, n, pool

    w, drv, n, pool = spinning()
    w.close()
    assert pool == [5, 6] and n.counters.spinning == 0
    w, drv, n, pool = spinning()
    with pytest.raises(KeyError):
        w.throw(KeyError("cancelled"))
    assert pool == [5, 6] and n.counters.spinning == 0
    w, drv, n, pool = spinning()
    drv.fail_query = ValueError("query")
    with pytest.raises(ValueError):
        next(w)
    assert pool == [5, 6] and n.counters.spinning == 0
    w, drv, n, pool = spinning()
    del w
    gc.collect()  # dropped half-way
    assert pool == [5, 6] and n.counters.spinning == 0
    # a failed record: the event goes back, nothing spins
    stream, n = _WaitStream(), _WaitNotifier(spin=True)
    drv = _Drv(lambda h: False)
    drv.fail_record = OSError("record")
    w = _hotpath.wait_complete(_state(stream, None, n, drv=drv, pool=[5]))
    next(w)
    with pytest.raises(OSError):
        next(w)
    assert n.counters.spinning == 0


@pytest.mark.usefixtures("long_spin")
def test_a_spinning_wait_queries_without_yielding_only_while_the_loop_is_idle() -> None:
    w, drv, n, _, _ = _spinning([False, False, True])
    n.ready_queue = collections.deque()  # asyncio's, empty
    next(w)
    with pytest.raises(StopIteration):
        next(w)  # busy, then three queries in a row: no yield
    assert [c[0] for c in drv.calls] == ["record", "query", "query", "query"]
    w, drv, n, _stream, _pool = _spinning([False, True])
    n.ready_queue = collections.deque([1])  # something else is ready
    next(w)
    assert next(w) is None  # busy: recorded, then a yield
    assert next(w) is None  # one query per step
    with pytest.raises(StopIteration):
        next(w)
    assert [c[0] for c in drv.calls] == ["record", "query", "query"]


@pytest.mark.usefixtures("long_spin")
def test_a_spinning_wait_awaits_a_loop_s_checkpoint_coroutine_each_time() -> None:
    async def checkpoint() -> None:
        await _yield("trap")

    w, _drv, n, _stream, pool = _spinning([False, True], checkpoint=checkpoint)
    assert w.send(None) == "trap"  # the first checkpoint
    assert w.send(None) == "trap"  # busy: the spin's
    assert w.send(None) == "trap"
    with pytest.raises(StopIteration):
        w.send(None)
    assert n.counters.completed == 1 and pool == [5, 6]


@pytest.mark.usefixtures("long_spin")
def test_a_wait_driven_from_python_takes_the_same_steps() -> None:
    async def checkpoint() -> None:
        await _yield("trap")

    w, _, n, _, pool = _spinning([False, True], checkpoint=checkpoint)
    co = _WaitStream.drive(w)
    assert [co.send(None) for _ in range(3)] == ["trap"] * 3
    with pytest.raises(StopIteration):
        co.send(None)
    assert n.counters.completed == 1 and pool == [5, 6] and n.counters.spinning == 0
    # cancelled in the spin: the driver closes the wait, which gives the event back
    w, _drv, n, _stream, pool = _spinning([], checkpoint=checkpoint)
    co = _WaitStream.drive(w)
    co.send(None)
    co.send(None)
    assert pool == [5] and n.counters.spinning == 1
    with pytest.raises(KeyError):
        co.throw(KeyError("cancelled"))
    assert pool == [5, 6] and n.counters.spinning == 0


def test_the_notifier_of_each_loop_reads_the_ready_queue_only_where_it_is_asyncio_s() -> None:
    import uvloop

    from aiocudasem._notifier import current_notifier

    async def queue() -> Any:
        return current_notifier().ready_queue

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(queue()) is loop._ready  # type: ignore[attr-defined]
    finally:
        loop.close()
    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(queue()) is None
    finally:
        loop.close()
    assert trio.run(queue) is None


@pytest.mark.usefixtures("long_spin")
def test_a_spinning_wait_on_asyncio_gives_its_event_back_when_cancelled() -> None:
    async def main() -> tuple[list[int], bool, int]:
        w, _drv, n, _stream, pool = _spinning([])
        task = asyncio.ensure_future(w)
        for _ in range(3):
            await asyncio.sleep(0)  # the task spins
        assert pool == [5]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pool, task.cancelled(), n.counters.spinning

    assert asyncio.run(main()) == ([5, 6], True, 0)


# ------------------------------------------------------------------ waking a crowd on asyncio


def _loops() -> list[Any]:
    import uvloop

    return [asyncio.new_event_loop, uvloop.new_event_loop]


def _run(main: Any, new_loop: Any) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


_FUTURES = [asyncio.Future, asyncio.futures._PyFuture]  # type: ignore[attr-defined]


@pytest.mark.parametrize("future", _FUTURES, ids=["c-future", "py-future"])
@pytest.mark.parametrize("new_loop", _loops(), ids=["asyncio", "uvloop"])
def test_a_woken_crowd_resumes_in_order_inside_one_callback(new_loop: Any, future: Any) -> None:
    """wake_in_turn() takes the futures in the list's order: each is marked done as
    set_result() does, and its task resumes at once, in its own context, before the next future
    is marked, all inside the one callback; nothing is scheduled. Futures done already
    (cancelled, or woken otherwise) and futures that nobody awaits are skipped."""
    cvar: contextvars.ContextVar[str] = contextvars.ContextVar("cvar", default="unset")

    async def main() -> tuple[list[int], list[bool], list[str], list[list[int]], list[int]]:
        loop = asyncio.get_running_loop()
        futures = [future(loop=loop) for _ in range(7)]
        order: list[int] = []
        inside: list[bool] = []
        contexts: list[str] = []
        pending: list[list[int]] = []  # the futures still pending as each task resumes
        running = False

        async def sleep(i: int) -> None:
            cvar.set(f"task {i}")
            await futures[i]
            order.append(i)
            inside.append(running)
            contexts.append(cvar.get())
            pending.append([j for j, f in enumerate(futures) if not f.done()])

        tasks = [asyncio.create_task(sleep(i)) for i in range(6)]  # the 7th: nobody awaits
        await asyncio.sleep(0)
        tasks[4].cancel()
        futures[2].set_result(None)  # woken otherwise: through call_soon()

        def run(futs: Any) -> None:
            nonlocal running
            running = True
            try:
                assert _hotpath.wake_in_turn(futs) is None
            finally:
                running = False

        crowd = [futures[i] for i in (6, 5, 3, 4, 2, 1, 0)]
        loop.call_soon(run, crowd)
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(f.done() for f in futures)
        assert [f.cancelled() for f in futures] == [False] * 4 + [True] + [False] * 2
        return order, inside, contexts, pending, [i for i, d in enumerate(done) if d is not None]

    order, inside, contexts, pending, failed = _run(main, new_loop)
    assert order == [2, 5, 3, 1, 0]
    assert inside == [False, True, True, True, True]
    assert contexts == ["task 2", "task 5", "task 3", "task 1", "task 0"]
    # Each future is marked as its turn comes: later ones are still pending.
    assert pending[1:] == [[0, 1, 3], [0, 1], [0], []]
    assert failed == [4]


def test_a_task_of_a_woken_crowd_cancelled_before_its_turn_raises_and_is_skipped() -> None:
    """A task cancelled before its turn, from outside or by a task of the same crowd that
    resumed before it, has its future cancelled and raises CancelledError at its await, as
    with set_result(); its turn skips it, and the others return."""

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(4)]
        tasks: list[asyncio.Task[None]] = []

        async def first() -> None:
            await futures[0]
            tasks[2].cancel()  # a later task of the same crowd

        tasks.append(asyncio.create_task(first()))
        tasks.extend(asyncio.create_task(_await(f)) for f in futures[1:])
        await asyncio.sleep(0)
        loop.call_soon(_hotpath.wake_in_turn, futures)
        assert tasks[3].cancel()  # before the crowd's callback runs
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert futures[2].cancelled() and futures[3].cancelled()
        return res

    res = asyncio.run(main())
    assert res[0] is None and res[1] is None
    assert isinstance(res[2], asyncio.CancelledError)
    assert isinstance(res[3], asyncio.CancelledError)


async def _await(f: Any) -> None:
    await f


def test_wake_in_turn_hands_on_the_rest_when_a_wake_up_raises() -> None:
    """A callback that raises propagates out of wake_in_turn(), after its future's callbacks
    that have not run are scheduled and the futures after it handed to a new call of the loop:
    none is lost. Bad input raises TypeError, and a future whose callbacks cannot be read is
    woken with plain set_result()."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        calls: list[str] = []
        futures = [loop.create_future() for _ in range(3)]
        futures[0].add_done_callback(lambda f: calls.append("first"))

        def boom(_f: object) -> None:
            calls.append("boom")
            raise KeyError("boom")

        futures[1].add_done_callback(boom)
        futures[1].add_done_callback(lambda f: calls.append("after boom"))
        futures[2].add_done_callback(lambda f: calls.append("third"))
        with pytest.raises(KeyError):
            _hotpath.wake_in_turn(futures)  # plain callbacks: no task to enter
        assert calls == ["first", "boom"]
        assert futures[1].done() and not futures[2].done()
        await asyncio.sleep(0)
        assert calls == ["first", "boom", "after boom", "third"]
        with pytest.raises(TypeError):
            _hotpath.wake_in_turn((futures[0],))  # type: ignore[arg-type]

        class Plain:
            """A future-like object without _callbacks."""

            def __init__(self) -> None:
                self.result: object = "unset"

            def done(self) -> bool:
                return self.result != "unset"

            def set_result(self, r: object) -> None:
                self.result = r

        plain = Plain()
        _hotpath.wake_in_turn([plain])  # type: ignore[list-item]
        assert plain.result is None
        return calls

    assert asyncio.run(main()) == ["first", "boom", "after boom", "third"]


@pytest.mark.parametrize("future", _FUTURES, ids=["c-future", "py-future"])
def test_waking_a_future_whose_first_callback_was_removed_runs_the_others_once(
    future: Any,
) -> None:
    """asyncio's C future builds a fresh list of its callbacks while its first slot is set,
    and hands out its live list once that callback is removed, as a Python future always does:
    the live list is copied, not taken, and only the remaining callbacks run, once each."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        ran: list[str] = []
        f = future(loop=loop)
        for name in ("first", "second", "third"):
            f.add_done_callback(lambda _f, name=name: ran.append(name))
        f.remove_done_callback(f._callbacks[0][0])  # type: ignore[attr-defined]
        live = f._callbacks  # type: ignore[attr-defined]
        assert f._callbacks is live  # type: ignore[attr-defined]  # the live list: no copy
        _hotpath.wake_in_turn([f])
        assert f.done() and f.result() is None
        await asyncio.sleep(0)
        return ran

    assert asyncio.run(main()) == ["second", "third"]


def test_waking_a_crowd_keeps_reference_counts() -> None:
    import sys

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def cb(_f: object) -> None:
            pass

        before = sys.getrefcount(cb)
        for _ in range(200):
            futures = [loop.create_future() for _ in range(5)]
            for f in futures:
                f.add_done_callback(cb)
            _hotpath.wake_in_turn(futures)
            del futures, f
        assert sys.getrefcount(cb) == before

        def boom(_f: object) -> None:
            raise KeyError("boom")

        before = sys.getrefcount(boom)
        for _ in range(50):
            futures = [loop.create_future() for _ in range(3)]
            for f in futures:
                f.add_done_callback(boom)
            with pytest.raises(KeyError):
                _hotpath.wake_in_turn(futures)
            del futures, f
        await asyncio.sleep(0.01)  # the rest, handed on, raise into the loop's handler
        gc.collect()  # the tracebacks' frames hold the function
        assert sys.getrefcount(boom) == before

    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, _ctx: None)
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def test_in_park_order_merges_the_batches_of_a_crowd_by_place() -> None:
    a, b, c, d, e = (object() for _ in range(5))
    assert _hotpath.in_park_order([{a: 4, c: 9}, {b: 0, d: 5}, {e: 7}]) == [b, a, d, e, c]
    assert _hotpath.in_park_order([{c: 9, a: 4}]) == [c, a]  # one batch: as it is
    assert _hotpath.in_park_order([]) == []
    with pytest.raises(TypeError):
        _hotpath.in_park_order([{a: 1}, {b: "2"}])  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        _hotpath.in_park_order([[a]])  # type: ignore[list-item]


def _in_park_order_collecting(batches: list[dict[Any, int]]) -> list[Any]:
    """in_park_order() with a collection due at every allocation (Python 3.11 runs it at
    once), so that the finalizers of garbage made just before may run inside it."""
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        return _hotpath.in_park_order(batches)
    finally:
        gc.set_threshold(*threshold)


def test_in_park_order_survives_a_collection_that_runs_finalizers() -> None:
    """The result list is made before the keys are read: a collection that an allocation
    starts (Python 3.11 runs one at once) cannot free a key while it is borrowed."""

    class Cycle:
        def __init__(self, batches: list[dict[Any, int]]) -> None:
            self.me = self
            self.batches = batches

        def __del__(self) -> None:
            for b in self.batches:
                b.clear()

    keys = [object() for _ in range(4)]
    d1, d2 = {keys[0]: 2, keys[1]: 0}, {keys[2]: 3, keys[3]: 1}
    Cycle([d1, d2])
    del keys
    out = _in_park_order_collecting([d1, d2])
    assert len(out) in (0, 4)


def test_in_park_order_survives_a_finalizer_that_shrinks_a_batch() -> None:
    """A collection that the result's allocation starts may run a finalizer that removes a
    key from a batch: the keys read are held, and the result has no empty place."""
    keys = [object() for _ in range(5)]
    d1, d2 = {k: i for i, k in enumerate(keys)}, {object(): 10}
    first = keys[0]

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            d1.pop(first, None)

    gc.collect()
    Cycle()
    out = _in_park_order_collecting([d1, d2])
    assert all(o is not None for o in out) and len(out) in (5, 6)


def test_wake_in_turn_wakes_every_future_even_when_one_fails() -> None:
    """An error while one future is marked (here a callback whose __eq__ raises, while its
    task's wake-up is taken off) propagates, but nobody is lost: the tasks before it have
    resumed, that future gets its callbacks back and plain set_result(), and the futures after
    it are handed to a new call of the loop."""

    class Bad:
        def __call__(self, _f: object) -> None:
            pass

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("eq")

        __hash__ = object.__hash__

    async def main() -> dict[int, str]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        out: dict[int, str] = {}
        errors: list[BaseException | None] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx.get("exception")))

        async def wait(i: int) -> None:
            await futures[i]
            out[i] = "woke"

        tasks = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0)
        futures[1].add_done_callback(Bad())

        def run() -> None:
            try:
                _hotpath.wake_in_turn(futures)
            finally:
                assert out == {0: "woke"}
                assert futures[1].done() and not futures[2].done()

        loop.call_soon(run)
        with anyio.fail_after(5):
            await asyncio.gather(*tasks)
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        return out

    assert asyncio.run(main()) == {0: "woke", 1: "woke", 2: "woke"}


# ------------------------------------------------------------------ wait_complete() as a coroutine


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
def test_wait_complete_is_a_coroutine_that_every_loop_s_task_spawning_takes(
    sim: acs.Driver, loop: str
) -> None:
    """The object that Stream.wait_complete() returns is C, not an async def's coroutine: the
    ways of starting a task that users hand it to take it all the same."""
    import inspect
    import sys

    if sys.version_info >= (3, 12):
        assert inspect.iscoroutinefunction(acs.Stream.wait_complete)
    work = workloads(sim)
    waited: list[str] = []

    async def main() -> None:
        async with acs.open_stream(driver=sim) as s:
            assert isinstance(s.wait_complete(), collections.abc.Coroutine)  # closed below
            work.launch_spin(s.handle, 2_000_000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.wait_complete)
            waited.append("anyio")
            if loop == "trio":
                work.launch_spin(s.handle, 2_000_000)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(s.wait_complete)
                waited.append("trio")
            else:
                work.launch_spin(s.handle, 2_000_000)
                await asyncio.create_task(s.wait_complete())
                await asyncio.wait_for(s.wait_complete(), 30)
                waited.append("asyncio")
            assert s.query()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the one never awaited
        if loop == "uvloop":
            uvloop = pytest.importorskip("uvloop")
            anyio.run(
                main, backend="asyncio", backend_options={"loop_factory": uvloop.new_event_loop}
            )
        else:
            anyio.run(main, backend=loop)
        gc.collect()
    assert waited == ["anyio", "trio" if loop == "trio" else "asyncio"]


def test_wait_complete_is_c_on_asyncio_and_python_on_trio_after_the_thread_s_first_wait(
    sim: acs.Driver,
) -> None:
    """On trio the checkpoint is a coroutine, which runs inline only when a Python coroutine
    awaits it: a thread whose last wait ran on trio gets the Python coroutine. Either kind
    serves either loop, so a thread that moves from one loop to the other gets one wait of the
    other kind, and is right all the same."""
    import inspect

    async def kinds() -> list[bool]:
        async with acs.open_stream(driver=sim) as s:
            out = []
            for _ in range(3):
                workloads(sim).launch_spin(s.handle, 1_000_000)
                w = s.wait_complete()
                out.append(inspect.iscoroutine(w))  # an async def's: Python
                await w
                assert s.query()
            return out

    anyio.run(kinds, backend="asyncio")  # whatever the thread's last loop was
    assert anyio.run(kinds, backend="asyncio") == [False, False, False]
    assert anyio.run(kinds, backend="trio") == [False, True, True]
    assert anyio.run(kinds, backend="asyncio") == [True, False, False]


def test_wait_complete_throws_and_awaits_as_a_coroutine_would() -> None:
    stream, n = _WaitStream(), _WaitNotifier()

    # a StopIteration thrown in is a RuntimeError (PEP 479), at the bare yield or before it
    for steps in (0, 1):
        w = _wait(stream, lambda h: True, n)
        for _ in range(steps):
            next(w)
        with pytest.raises(RuntimeError, match="StopIteration"):
            w.throw(StopIteration(5))
        # ... and a finished one refuses a throw as it refuses a step
        with pytest.raises(RuntimeError, match="cannot reuse"):
            w.throw(KeyError("late"))

    # awaited by a second awaiter while suspended: refused
    w = _wait(stream, lambda h: True, n)
    next(w)
    with pytest.raises(RuntimeError, match="awaited already"):
        w.__await__()
    w.close()

    # GeneratorExit thrown in while it delegates: the delegate is closed, as `yield from` has it
    closed: list[str] = []

    async def checkpoint() -> None:
        try:
            await _yield("trap")
        except GeneratorExit:
            closed.append("closed")
            raise

    w = _wait(stream, lambda h: True, _WaitNotifier(checkpoint))
    assert w.send(None) == "trap"
    with pytest.raises(GeneratorExit):
        w.throw(GeneratorExit)
    assert closed == ["closed"]
    assert w.__name__ == "wait_complete" and w.__qualname__ == "Stream.wait_complete"


def test_wait_complete_refuses_a_step_from_inside_its_busy_path_s_await() -> None:
    """A busy path whose awaitable steps the wait from its __await__ is refused, not run on a
    half-made delegation."""
    seen: list[BaseException] = []

    class Odd:
        def __await__(self) -> Any:
            try:
                w.send(None)
            except ValueError as exc:
                seen.append(exc)
            return iter(())

    class Stream(_WaitStream):
        def _wait_busy(self, notifier: Any, started: float) -> Any:  # type: ignore[override]
            return Odd()  # what the park returns

    w = _wait(Stream(), lambda h: False, _WaitNotifier())
    next(w)
    with pytest.raises(StopIteration):
        next(w)
    assert len(seen) == 1 and "already executing" in str(seen[0])


def test_wait_complete_keeps_its_notifier_s_kind_when_a_release_runs_another_wait() -> None:
    """The finder remembers the kind and tally of the last notifier a wait found; when letting
    go of the one before runs Python code (its release) that waits on a third notifier, the
    wait that found the new one still gets that one's kind and tally."""
    current: list[Any] = [None]

    class Notifier(_WaitNotifier):
        def __init__(self, checkpoint: Any = None, on_release: Any = None) -> None:
            super().__init__(checkpoint)
            del self.serves_running_loop  # the method below: no cycle, released at once
            self.on_release = on_release

        def serves_running_loop(self) -> bool:
            return current[0] is self

        def __del__(self) -> None:
            if self.on_release is not None:
                self.on_release()

    finder = _hotpath.Finder(types.SimpleNamespace(notifier=None), [], lambda: current[0])

    class Stream(_WaitStream):
        @staticmethod
        async def drive(wait: Any) -> None:  # what a thread whose last wait was trio's gets
            raise AssertionError("not here: the finder's last notifier is bare each time")

    def run(n: Any) -> list[Any]:
        current[0] = n
        w = _hotpath.wait_complete(_state(Stream(), lambda h: True, n, finder=finder))
        out = [w.send(None)]
        with pytest.raises(StopIteration):
            w.send(None)
        return out

    third = Notifier()  # bare
    released: list[list[Any]] = []

    def release() -> None:
        saved = current[0]
        current[0] = third
        finder()  # the finder now remembers the third as the thread's notifier
        released.append(run(third))  # and a wait from the release sees it first
        current[0] = saved

    first = Notifier(on_release=release)
    run(first)  # the finder remembers it
    del first

    async def checkpoint() -> None:
        await _yield("trap")

    second = Notifier(checkpoint)
    assert run(second) == ["trap"]  # its own checkpoint, not a bare yield
    assert released == [[None]]  # the release's wait, on the bare third, ran meanwhile
    assert (second.counters.completed, third.counters.completed) == (1, 1)  # each its own
