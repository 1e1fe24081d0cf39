"""The per-loop notifier: coalescing per stream, exact wake-ups, the watchdog under load."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem._notifier import Notifier, Point
from aiocudasem._notifier._loops import Sleeper
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, workloads
from tests.conftest import StallWatch

pytestmark = pytest.mark.anyio


async def test_a_crowd_on_one_stream_costs_one_host_function(sim: SimDriver, parked: None) -> None:
    """200 waits that began before the stream's work was found busy share one point: one
    event, one host function, and 200 parked coroutines woken by it."""
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        woke = 0

        async def waiter() -> None:
            nonlocal woke
            await s.wait_complete()
            woke += 1

        before = statistics().fired
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert statistics().chained == 1
            assert statistics().parked == 200
            gate.set()
        assert woke == 200
        assert statistics().fired - before == 1
        assert statistics().chained == 0


async def test_chained_points_wake_exactly_not_early(sim: SimDriver, parked: None) -> None:
    async with acs.open_stream(driver=sim) as s:
        first = hold(s)
        woke: list[str] = []

        async def wait(name: str) -> None:
            await s.wait_complete()
            woke.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, "a")  # waits for `first` only
            await anyio.wait_all_tasks_blocked()
            second = hold(s)
            tg.start_soon(wait, "b")  # waits for `second` as well
            await anyio.wait_all_tasks_blocked()
            first.set()
            with anyio.fail_after(5):
                while woke != ["a"]:
                    await anyio.sleep(0.001)
            await anyio.sleep(0.02)
            assert woke == ["a"]  # b's work is still gated: not woken early
            second.set()
        assert woke == ["a", "b"]


async def test_cancelling_the_chain_head_keeps_the_rest(sim: SimDriver, parked: None) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        head = anyio.CancelScope()
        woke: list[int] = []

        async def wait(i: int, scope: anyio.CancelScope | None = None) -> None:
            with scope or anyio.CancelScope():
                await s.wait_complete()
                woke.append(i)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, 0, head)
            await anyio.wait_all_tasks_blocked()
            for i in range(1, 5):
                tg.start_soon(wait, i)
            await anyio.wait_all_tasks_blocked()
            head.cancel()
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert sorted(woke) == [1, 2, 3, 4]


async def test_watchdog_is_not_postponed_by_a_busy_device(
    sim: SimDriver, parked: None, fault_watchdog: float
) -> None:
    faulted = acs.open_stream(0, driver=sim)
    busy = acs.open_stream(1, driver=sim)
    hold(faulted)
    caught: list[float] = []

    async def victim() -> None:
        with pytest.raises(acs.DeviceFaultError):
            await faulted.wait_complete()
        caught.append(anyio.current_time())

    async def keep_busy() -> None:
        while not caught:
            workloads(sim).launch_spin(busy.handle, 1_000_000)
            await busy.wait_complete()

    with StallWatch() as watch:
        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(keep_busy)
            await anyio.sleep(0.01)
            t0 = anyio.current_time()
            sim.inject_fault(0)
            with anyio.fail_after(5):
                while not caught:
                    await anyio.sleep(0.005)
    # The bound: 100 ms, plus one period (and any stall of the whole process).
    assert caught[0] - t0 < 0.1 + fault_watchdog + watch.stall, watch.stall
    await busy.aclose()
    with pytest.raises(acs.DeviceFaultError):
        await faulted.aclose()


async def test_closing_an_event_with_waiters_is_refused(sim: SimDriver, parked: None) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        ev = s.record()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ev.wait)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.BusyResourceError):
                ev.close()
            gate.set()
        ev.close()
        assert ev.closed


async def test_configure_validates() -> None:
    with pytest.raises(ValueError):
        acs.configure(spin_limit=-1)
    with pytest.raises(ValueError):
        acs.configure(max_spinners=-1)
    with pytest.raises(ValueError):
        acs.configure(watchdog=0)
    assert acs.configure() == acs.configure()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"spin_limit": 10**400}, ValueError),  # was OverflowError
        ({"watchdog": 10**400}, ValueError),  # was OverflowError
        ({"watchdog": float("inf")}, ValueError),  # was accepted
        ({"watchdog": float("nan")}, ValueError),
        ({"spin_limit": float("nan")}, ValueError),
        ({"spin_limit": 61.0}, ValueError),
        ({"watchdog": 0.0001}, ValueError),
        ({"max_spinners": True}, TypeError),  # was accepted
        ({"spin_limit": True}, TypeError),  # was accepted
        ({"watchdog": False}, TypeError),
        ({"max_spinners": 2.0}, TypeError),
        ({"max_spinners": 10**400}, ValueError),
        ({"spin_limit": "0.1"}, TypeError),
        ({"wake": 1}, TypeError),
        ({"wake": b"side_stream"}, TypeError),
        ({"wake": "side"}, ValueError),
        ({"wake": "SIDE_STREAM"}, ValueError),
    ],
)
def test_configure_rejects_bad_values_and_keeps_the_old_ones(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    before = acs.configure()
    with pytest.raises(error):
        acs.configure(**kwargs)  # type: ignore[arg-type]
    assert acs.configure() == before


def test_configure_wake_takes_one_of_two_names() -> None:
    from aiocudasem._notifier import _tuning, _wake

    assert acs.Tuning().wake == "side_stream"
    assert set(_wake.STRATEGIES) == set(_tuning._WAKE_CHOICES)
    try:
        assert acs.configure(wake="work_stream").wake == "work_stream"
        assert acs.configure().wake == "work_stream"
        assert acs.configure(spin_limit=0.001).wake == "work_stream"  # other knobs keep it
        with pytest.raises(ValueError, match="must be 'side_stream' or 'work_stream', got 'host'"):
            acs.configure(wake="host")
        with pytest.raises(TypeError, match="wake must be a str, not int"):
            acs.configure(wake=3)  # type: ignore[arg-type]
        assert acs.configure(wake="side_stream").wake == "side_stream"
    finally:
        acs.configure(wake=acs.Tuning().wake, spin_limit=acs.Tuning().spin_limit)


@pytest.fixture
def work_stream_wake(parked: None) -> Iterator[None]:
    """Host functions on the work stream itself (spinning off, so every wait parks)."""
    acs.configure(wake="work_stream")
    yield
    acs.configure(wake=acs.Tuning().wake)


async def test_work_stream_wake_completes_waits_and_hand_offs(
    sim: SimDriver, work_stream_wake: None
) -> None:
    from aiocudasem._notifier import side_streams

    ready, producer = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    woke = 0
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        ev = s.record()

        async def waiter() -> None:
            nonlocal woke
            await s.wait_complete()
            woke += 1

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(waiter)
                tg.start_soon(ev.wait)
                await anyio.wait_all_tasks_blocked()
                assert statistics().parked == 4
                gate.set()
        assert woke == 3
        assert statistics().fired >= 1  # woken by host functions, not by a query

        async def consumer() -> None:
            async with s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                pass

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer)
                await anyio.wait_all_tasks_blocked()
                assert statistics().parked == 1  # __aexit__ waits for the signal
                producer.signal(1)
        assert observer.value == 1
        with anyio.fail_after(5):
            await ready.wait_value(1)  # a host-side semaphore wait, on a private stream
        assert side_streams.count(sim) == 0  # no side stream was made for any of it
        ev.close()
    await ready.aclose()
    await done.aclose()


@pytest.mark.parametrize(
    ("wake", "refused"),
    [
        # A side stream missing at the launch (evicted, say) and refused: the node is armed,
        # then disarmed.
        ("side_stream", "stream_create"),
        ("side_stream", "launch_host_func"),
        ("work_stream", "launch_host_func"),
    ],
)
async def test_a_refused_launch_fails_the_wait_and_leaves_nothing_armed(
    sim: SimDriver, parked: None, monkeypatch: pytest.MonkeyPatch, wake: str, refused: str
) -> None:
    from aiocudasem._notifier import side_streams

    acs.configure(wake=wake)
    try:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)

            def refuse(*args: object) -> None:
                raise acs.CudaError("refused", 1)

            if refused == "stream_create":
                side_streams.drop(sim, s.handle)  # made by open_stream(): gone again
            with monkeypatch.context() as m:
                m.setattr(sim, refused, refuse)
                with pytest.raises(acs.CudaError, match="refused"), anyio.fail_after(5):
                    await s.wait_complete()
            assert statistics().pending == 0
            assert statistics().armed == 0
            gate.set()
            with anyio.fail_after(5):
                await s.wait_complete()  # the next wait is served as usual
    finally:
        acs.configure(wake=acs.Tuning().wake)


async def test_pools_are_keyed_by_the_driver_object_not_its_id() -> None:
    """A driver's free events must never reach another driver, even one that later gets the
    same id(); and a collected driver's pool must go with it."""
    import gc

    from aiocudasem._notifier import event_pool

    first = SimDriver(devices=1)
    async with acs.open_stream(driver=first) as s:
        workloads(first).launch_spin(s.handle, 2_000_000)
        await s.wait_complete()  # busy: records an event, which it leaves in first's pool
    pool = event_pool.free_list(first, 0)
    assert pool
    second = SimDriver(devices=1)
    assert event_pool.free_list(second, 0) == []
    import weakref

    gone = weakref.ref(first)
    del first, pool, s  # s, the closed stream, still names its driver
    with anyio.fail_after(5):  # the sim's worker threads let go of it as they exit
        while gc.collect() or gone() is not None:
            await anyio.sleep(0.01)
    assert gone() is None  # the pools hold no strong reference to a driver...
    assert len([d for d in event_pool._free if d is second]) == 1  # ...and second has its own
    async with acs.open_stream(driver=second) as s:
        workloads(second).launch_spin(s.handle, 2_000_000)
        await s.wait_complete()  # would fail with an invalid handle if it got first's events


def test_no_module_of_the_notifier_copies_the_settings_in_force() -> None:
    """The settings are read as ``_tuning.current`` when used, so that configure() reaches
    every module: none imports ``current`` by name. (The order of the imports is import-linter's
    contract, in pyproject.toml.)"""
    import ast
    from pathlib import Path

    from aiocudasem import _notifier

    root = Path(_notifier.__file__).parent
    modules = sorted(root.rglob("*.py"))
    assert len(modules) >= 10
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_tuning"):
                assert "current" not in {a.name for a in node.names}, path.name


def test_each_loop_of_a_thread_gets_its_own_notifier_even_a_trio_guest_run() -> None:
    """The notifier of the loop that ran last in a thread is remembered, and must not be handed
    to another loop: a later asyncio.run, or a trio run as a guest on the asyncio loop (whose
    tasks see asyncio's running loop too)."""
    import asyncio

    import trio

    from aiocudasem._notifier import current_notifier

    sim = SimDriver(devices=1)
    seen: dict[str, object] = {}

    async def busy_wait(key: str) -> None:
        seen[key] = current_notifier()
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            gate.set()
            with anyio.fail_after(5):
                await s.wait_complete()
        assert current_notifier() is seen[key]

    async def host() -> None:
        await busy_wait("asyncio")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[object] = loop.create_future()
        trio.lowlevel.start_guest_run(
            busy_wait,
            "guest",
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
        )
        (await done).unwrap()  # type: ignore[attr-defined]
        assert current_notifier() is seen["asyncio"]

    asyncio.run(host())
    asyncio.run(busy_wait("second asyncio"))
    trio.run(busy_wait, "trio")
    notifiers = [seen[k] for k in ("asyncio", "guest", "second asyncio", "trio")]
    assert len({id(n) for n in notifiers}) == 4
    assert all(n.closed for n in notifiers)  # type: ignore[attr-defined]


async def test_one_long_wait_does_not_leave_a_stream_of_short_work_parking() -> None:
    """The spin window follows the stream's recent wait times, and a parked wait's time
    includes its wake-up, which can cost more than spin_limit by itself. So a stream whose
    history says "long" still spins on one wait in 16, and a wait within spin_limit starts the
    history over: one long wait cannot leave short work parking for good."""
    from aiocudasem._notifier import History

    history = History()
    limit = acs.configure().spin_limit
    assert history.spin_window() == limit  # no history yet: the whole limit
    history.learn(1.0)  # one long wait: 1 s
    windows = [history.spin_window() for _ in range(32)]
    assert windows.count(limit) == 2  # the probes
    assert windows.count(0.0) == 30
    history.learn(3 * limit)  # a parked short wait, its wake-up included
    assert history.recent > limit  # still "long" on average
    history.learn(limit / 4)  # a probe caught the work
    assert history.recent == limit / 4
    assert 0 < history.spin_window() <= limit


async def test_a_stream_keeps_its_wait_history_for_its_waits_and_its_events(sim: SimDriver) -> None:
    """The history lives with the Stream: a wait that found the work done at its first
    checkpoint learns from it (a stream that was "long" spins again), and so does a parked
    wait on one of the stream's events."""
    limit = acs.configure().spin_limit
    async with acs.open_stream(driver=sim) as s:
        history = s._history
        history.learn(1.0)  # "long": the next waits would not spin
        assert history.spin_window() == 0.0
        await s.wait_complete()  # idle: done at the first checkpoint
        assert 0 <= history.recent <= limit
        assert history.spin_window() > 0

        history.learn(1.0)  # an average now, not a reset: the last wait was short
        before = history.recent
        gate = hold(s)
        event = s.record()
        assert event._point.history is history
        async with anyio.create_task_group() as tg:
            tg.start_soon(event.wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.02)
            gate.set()
        # Learnt from the event's parked wait, at least 20 ms: a quarter of it, in the average.
        assert 0.75 * before + 0.25 * 0.02 <= history.recent < before
        event.close()


async def test_a_wait_that_begins_after_the_record_does_not_share_the_point(
    sim: SimDriver, parked: None
) -> None:
    """Sharing is for waits that began before the point's event was recorded: a later one
    records its own, even on the same work, so that no wait ever covers work enqueued after
    its first checkpoint."""
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            assert statistics().chained == 1
            tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            assert statistics().chained == 2
            assert statistics().parked == 2
            gate.set()
        assert statistics().chained == 0


async def test_waits_share_only_a_live_point_of_their_own_loop(sim: SimDriver) -> None:
    """The predicate itself: no point, an older point, one that is done, one that nobody
    awaits any more (its event may be back in the pool), one of another loop."""
    from aiocudasem._notifier import History, Point, current_notifier

    notifier = current_notifier()
    history = History()
    assert notifier.shared_point(history, 1.0) is None
    point = Point(sim, 0, 7, 99, None, history)
    point.recorded = 2.0
    point.waiting = 1
    point.owner = notifier._ref
    history.newest = point
    assert notifier.shared_point(history, 1.0) is point
    assert notifier.shared_point(history, 2.5) is None  # began after the record
    assert notifier.shared_point(history, 2.0) is None  # the same reading: maybe after it
    point.waiting = 0
    assert notifier.shared_point(history, 1.0) is None
    point.waiting = 1
    point.owner = None
    assert notifier.shared_point(history, 1.0) is None
    point.owner = notifier._ref
    point.done = True
    assert notifier.shared_point(history, 1.0) is None


@contextlib.asynccontextmanager
async def _a_parked_point(sim: SimDriver, waiters: int) -> AsyncIterator[tuple[Notifier, Point]]:
    """A stream held busy, with ``waiters`` waits parked on its one armed point: this loop's
    notifier and the point. The stream's work completes, and the waits end, on leaving."""
    from aiocudasem._notifier import current_notifier

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            for _ in range(waiters):
                tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            point = s._history.newest
            assert point is not None and point.token and point.waiting == waiters
            try:
                yield current_notifier(), point
            finally:
                gate.set()


async def test_the_waiters_of_an_armed_point_park_on_it_directly(
    sim: SimDriver, parked: None
) -> None:
    """A crowd's waiters that share an armed point are parked by ``_park()`` itself: one
    coroutine per waiter fewer for the loop to resume when the crowd wakes. The waiter joins
    the point only once it runs: a coroutine closed unstarted leaves no trace."""
    from aiocudasem._notifier import Notifier

    async with _a_parked_point(sim, 5) as (notifier, point):
        direct = notifier.wait(point)
        assert direct.cr_code is Notifier._park.__code__
        direct.close()
        assert point.waiting == 5
    assert point.done
    later = notifier.wait(point)  # done: the general path, which passes a checkpoint
    assert later.cr_code is Notifier._wait.__code__
    await later


async def test_a_direct_park_awaited_after_its_point_finished_is_still_a_checkpoint(
    sim: SimDriver, parked: None
) -> None:
    """wait() looks at the point when it is called; a caller that awaits the coroutine later
    (``start_soon(notifier.wait, point)``) may find the point done by then. The wait still
    passes a checkpoint, and leaves no sleeper on the finished point."""
    async with _a_parked_point(sim, 1) as (notifier, point):
        late = notifier.wait(point)
    assert point.done
    with anyio.CancelScope() as scope:
        scope.cancel()
        await late
    assert scope.cancelled_caught  # the checkpoint saw the cancellation
    assert not point.sleepers
    assert point.waiting == 0


async def test_a_direct_park_that_fails_to_start_leaves_the_point(
    sim: SimDriver, parked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_memory() -> None:
        raise MemoryError

    async with _a_parked_point(sim, 1) as (notifier, point):
        with monkeypatch.context() as m:
            m.setattr(notifier, "_new_sleeper", no_memory)
            with pytest.raises(MemoryError):
                await notifier.wait(point)
        assert point.waiting == 1


async def test_cancelling_the_waiter_that_recorded_a_shared_point_keeps_the_others(
    sim: SimDriver, parked: None
) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        first = anyio.CancelScope()
        woke = 0

        async def wait(scope: anyio.CancelScope) -> None:
            nonlocal woke
            with scope:
                await s.wait_complete()
                woke += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, first)
            for _ in range(20):
                tg.start_soon(wait, anyio.CancelScope())
            await anyio.wait_all_tasks_blocked()
            assert statistics().chained == 1
            first.cancel()
            await anyio.wait_all_tasks_blocked()
            assert statistics().chained == 1  # still armed, for the 20 others
            assert woke == 0
            gate.set()
        assert woke == 20
        assert statistics().chained == 0


async def test_a_crowd_leaving_wakes_one_heir_for_the_drainer_role(
    sim: SimDriver, parked: None
) -> None:
    """When the drainer's own point completes and its crowd leaves while other coroutines
    stay parked, one of those is woken to take the role over, not one per leaving
    coroutine."""
    from aiocudasem._notifier import current_notifier

    notifier = current_notifier()
    created = 0
    real = notifier._new_sleeper

    def counting() -> Sleeper:
        nonlocal created
        created += 1
        return real()

    notifier._new_sleeper = counting
    try:
        async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
            gate_a, gate_b = hold(a), hold(b)
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(a.wait_complete)  # the first of them drains
                await anyio.wait_all_tasks_blocked()
                for _ in range(50):
                    tg.start_soon(b.wait_complete)
                await anyio.wait_all_tasks_blocked()
                assert created == 100  # one sleeper each
                gate_a.set()
                with anyio.fail_after(5):
                    while statistics().parked > 50:
                        await anyio.sleep(0.001)
                await anyio.wait_all_tasks_blocked()
                # One of b's coroutines was woken and drains now; none slept again.
                assert created == 100
                assert notifier._draining
                gate_b.set()
    finally:
        notifier._new_sleeper = real


async def test_with_spinning_on_a_crowd_makes_a_point_per_spinner_at_most(sim: SimDriver) -> None:
    """Spinners wait on events of their own, so a crowd on a fresh stream with the default
    settings makes one point per spinner that parks, and one that all the others share."""
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            chained = statistics().chained
            assert 1 <= chained <= acs.configure().max_spinners + 1
            gate.set()
        assert statistics().chained == 0


async def test_a_large_crowd_over_several_streams_all_wakes(sim: SimDriver, parked: None) -> None:
    """Every coroutine of a crowd of hundreds over two streams wakes, and none stays parked."""
    n = 785
    woke = 0

    async def one(s: acs.Stream) -> None:
        nonlocal woke
        await s.wait_complete()
        woke += 1

    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        gates = [hold(a), hold(b)]
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, (a, b)[i % 2])
            await anyio.wait_all_tasks_blocked()
            assert statistics().parked == n
            for g in gates:
                g.set()
            with anyio.fail_after(10):
                while woke < n:
                    await anyio.sleep(0.001)
        assert statistics().parked == 0


async def test_on_asyncio_a_finished_crowd_resumes_inside_one_callback_of_the_loop(
    sim: SimDriver, parked: None, anyio_backend_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On asyncio the sleepers of a batch of finished points are woken by one callback of the
    loop, which resumes their coroutines in turn, in the order in which they parked: each wait
    returns while that callback runs. Elsewhere each sleeper is woken in turn."""
    from aiocudasem import _hotpath

    if anyio_backend_name != "asyncio":
        pytest.skip("asyncio's sleepers")
    calls: list[int] = []
    running = False
    real = _hotpath.wake_in_turn

    def recording(futures: list[Any]) -> None:
        nonlocal running
        calls.append(len(futures))
        running = True
        try:
            real(futures)
        finally:
            running = False

    monkeypatch.setattr(_hotpath, "wake_in_turn", recording)
    n = 300
    returned: list[tuple[int, bool]] = []

    async def one(i: int, s: acs.Stream) -> None:
        await s.wait_complete()
        returned.append((i, running))

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i, s)
            await anyio.wait_all_tasks_blocked()
            assert statistics().parked == n
            gate.set()
    assert calls == [n]  # one batch, the drainer's future with the rest: nobody awaits it
    # The drainer returns from its own step, not from the callback; all others inside it, in
    # the order they parked.
    inside = [i for i, r in returned if r]
    assert len(inside) == n - 1
    assert inside == sorted(inside)


async def test_cancelling_part_of_a_woken_crowd_loses_no_wake_up(
    sim: SimDriver, parked: None
) -> None:
    """Coroutines whose scopes are cancelled after their crowd's points finished, before the
    crowd resumes, leave or return; all the others wake, and nobody stays parked. (Their
    sleepers are woken already, as a future after set_result(): the loop delivers the
    cancellation at their next checkpoint, if any.)"""
    from aiocudasem._notifier import current_notifier

    notifier = current_notifier()
    n = 600
    scopes: list[anyio.CancelScope] = []
    woke = cancelled = 0
    complete = notifier._complete
    batches = 0

    def complete_then_cancel(tokens: list[int]) -> None:
        nonlocal batches
        complete(tokens)
        batches += 1
        for sc in scopes[::3]:
            sc.cancel()

    async def one(s: acs.Stream, scope: anyio.CancelScope) -> None:
        nonlocal woke, cancelled
        with scope:
            await s.wait_complete()
            woke += 1
        if scope.cancelled_caught:
            cancelled += 1

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                scopes.append(anyio.CancelScope())
                tg.start_soon(one, s, scopes[-1])
            await anyio.wait_all_tasks_blocked()
            notifier._complete = complete_then_cancel  # type: ignore[method-assign]
            try:
                gate.set()
                with anyio.fail_after(10):
                    while woke + cancelled < n:
                        await anyio.sleep(0.001)
            finally:
                del notifier._complete
        assert batches == 1
        assert woke + cancelled == n
        assert statistics().parked == 0


async def test_a_drainer_that_parked_late_in_its_crowd_leaves_it_all_woken(
    sim: SimDriver, parked: None
) -> None:
    """A drainer whose sleeper comes late in its crowd leaves before the crowd reaches it:
    the whole crowd still wakes."""
    from aiocudasem._notifier import current_notifier

    notifier = current_notifier()
    sentinel: Any = object()  # stands for an heir woken already: no other is woken
    n = 512
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        for _ in range(3):
            gate_a, gate_b = hold(a), hold(b)
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.wait_complete)  # the drainer
                await anyio.wait_all_tasks_blocked()
                for _ in range(n):
                    tg.start_soon(b.wait_complete)
                await anyio.wait_all_tasks_blocked()
                # The drainer leaves, and (no heir woken) the next to park drains: it parked
                # after the whole crowd of b.
                notifier._heir = sentinel
                gate_a.set()
                with anyio.fail_after(5):
                    while notifier._draining:
                        await anyio.lowlevel.checkpoint()
                tg.start_soon(b.wait_complete)
                await anyio.wait_all_tasks_blocked()
                assert notifier._draining
                notifier._heir = None
                gate_b.set()
            assert statistics().parked == 0


async def test_a_batch_of_finished_points_wakes_its_sleepers_in_the_order_they_parked(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sleepers of several points finished by one delivery of completions are woken in the
    order of parking, not point by point, and in one crowd."""
    from aiocudasem._hotpath import History
    from aiocudasem._notifier import current_notifier
    from aiocudasem._notifier._points import Point

    notifier = current_notifier()
    woken: list[list[int]] = []

    class Recording:
        def __init__(self, i: int) -> None:
            self.i = i

    monkeypatch.setattr(notifier, "_wake_crowd", lambda ss: woken.append([s.i for s in ss]))
    sleepers = [Recording(i) for i in range(9)]
    points = [Point(sim, 0, 1000 + k, 0, None, History()) for k in range(3)]
    tokens = [10**9 + k for k in range(3)]
    for k, (p, t) in enumerate(zip(points, tokens, strict=True)):
        p.sleepers = {s: s.i for s in sleepers if s.i % 3 == k}  # type: ignore[misc]
        p.token = t
        notifier._armed[t] = p
    notifier._complete(tokens)
    assert woken == [list(range(9))]
    assert all(p.done and not p.sleepers for p in points)


async def test_a_leaving_coroutine_delivers_completions_while_the_drainer_waits_for_its_fd(
    sim: SimDriver, parked: None
) -> None:
    """The drainer sleeps on the fd, which the loop looks at only between its passes; a
    coroutine that leaves its park meanwhile delivers what is queued. Here the drainer's fd
    wait is held until the end, so only the leaving coroutine can deliver."""
    from aiocudasem._notifier import current_notifier

    notifier = current_notifier()
    real, unblock = notifier._backend, anyio.Event()

    class HeldFd:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        async def wait_readable(self, fd: int) -> None:
            await unblock.wait()

    notifier._backend = HeldFd()  # type: ignore[assignment]
    woke_b = 0

    async def wait_b(s: acs.Stream) -> None:
        nonlocal woke_b
        await s.wait_complete()
        woke_b += 1

    try:
        async with (
            acs.open_stream(driver=sim) as a,
            acs.open_stream(driver=sim) as b,
            acs.open_stream(driver=sim) as c,
        ):
            gates = [hold(a), hold(b), hold(c)]
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.wait_complete)  # the drainer
                await anyio.wait_all_tasks_blocked()
                assert notifier._draining
                for _ in range(3):
                    tg.start_soon(wait_b, b)
                leaver = anyio.CancelScope()

                async def wait_c() -> None:
                    with leaver:
                        await c.wait_complete()

                tg.start_soon(wait_c)
                await anyio.wait_all_tasks_blocked()
                gates[1].set()  # b's completion reaches the queue; nobody reads the fd
                with anyio.fail_after(5):
                    while not notifier._c.queued():
                        await anyio.sleep(0.001)
                assert woke_b == 0
                leaver.cancel()  # c's coroutine leaves, and delivers b's completion
                with anyio.fail_after(5):
                    while woke_b < 3:
                        await anyio.sleep(0.001)
                assert notifier._draining  # the drainer never woke
                unblock.set()
                gates[0].set()
                gates[2].set()
    finally:
        notifier._backend = real


async def test_a_sleeper_keeps_the_future_contract_that_parking_relies_on() -> None:
    """On every loop: woken before its await, an await returns at once; a cancelled await
    leaves the sleeper done (so nobody wakes or hands a role to a leaving coroutine); one that
    nobody awaits can be cancelled, and is then done."""
    from aiocudasem._notifier import current_notifier

    new = current_notifier()._new_sleeper
    s = new()
    assert not s.done()
    s.set_result(None)
    assert s.done()
    with anyio.fail_after(1):
        await s

    s = new()
    with anyio.move_on_after(0.01) as scope:
        await s
    assert scope.cancelled_caught
    assert s.done()

    s = new()
    assert s.cancel()
    assert s.done()

    s = new()
    woke = False

    async def sleep() -> None:
        nonlocal woke
        await s
        woke = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleep)
        await anyio.wait_all_tasks_blocked()
        assert not woke
        s.set_result(None)
    assert woke


async def test_an_asyncio_timeout_and_a_cancel_scope_at_once_on_a_parked_wait(
    sim: SimDriver, parked: None, anyio_backend_name: str
) -> None:
    """A wait parked on its sleeper under ``asyncio.timeout()`` inside an anyio cancel scope,
    both ending in one pass of the loop: the timeout cancels the task first, then the scope
    does. anyio sees the sleeper as a cancelled future and does not cancel the task a second
    time, so the timeout raises TimeoutError and nothing escapes the scope, as with any
    future of the loop."""
    import asyncio

    if anyio_backend_name != "asyncio":
        pytest.skip("asyncio.timeout")
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        outcome = "returned"
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)  # parks first: the drainer, on the fd
            with anyio.fail_after(5):
                while statistics().parked < 1:
                    await anyio.sleep(0.001)
            try:
                with anyio.CancelScope() as scope:
                    try:
                        async with asyncio.timeout(None) as timeout:

                            def expire() -> None:
                                timeout.reschedule(loop.time() - 1)  # its handler: next
                                loop.call_soon(scope.cancel)  # then the scope's

                            loop.call_later(0.02, expire)
                            await s.wait_complete()  # parks on its sleeper
                    except TimeoutError:
                        outcome = "timeout"
            finally:
                gate.set()
        assert outcome == "timeout"
        assert task.cancelling() == 0


_ABANDONED_KINDS = [
    "Stream.wait_complete",
    "Event.wait",
    "ExternalSemaphore.wait_value",
    "HostTimeline.wait_value",
    "wait_event",
]


@pytest.mark.parametrize("kind", _ABANDONED_KINDS)
async def test_an_abandoned_waits_notification_is_released_without_the_loop_parking_again(
    sim: SimDriver, parked: None, kind: str
) -> None:
    """The last waiter of the loop leaves with its host function armed; once the GPU gets
    past the point, the notification is collected although nothing of this loop parks again
    (anyio.sleep() does not): armed, chained and pending are back to 0."""
    from tests.test_cancel_kinds import pending

    async with pending(sim, kind) as p:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(p.wait)
                await anyio.wait_all_tasks_blocked()
                now = statistics()
                assert (now.parked, now.armed, now.pending) == (1, 1, 1), now
                tg.cancel_scope.cancel()
        assert statistics().parked == 0
        assert statistics().armed == 1
        p.release()
        with anyio.fail_after(2):
            while statistics().armed or statistics().pending:
                await anyio.sleep(0.001)
        after = statistics()
        assert (after.armed, after.chained, after.pending, after.parked) == (0, 0, 0, 0), after


async def test_another_loop_waits_on_an_event_whose_abandoned_notification_fired(
    sim: SimDriver, parked: None, anyio_backend: Any
) -> None:
    """This loop armed the event's point and gave up on it; its work completed and the host
    function fired while this loop was not running (blocked here, in a call). Another loop's
    wait takes the point over instead of raising BusyResourceError, and this loop, once it
    collects the notification, leaves the point alone."""
    import threading

    name, options = anyio_backend
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        ev = s.record()
        with anyio.move_on_after(0.02):
            await ev.wait()
        from aiocudasem._notifier import current_notifier

        notifier = current_notifier()
        assert statistics().armed == 1
        gate.set()
        deadline = time.monotonic() + 5
        while not notifier._c.stats()["fired"]:  # the loop does not run meanwhile
            assert time.monotonic() < deadline
            time.sleep(0.001)  # noqa: ASYNC251 - keeps this loop from collecting it
        errors: list[BaseException] = []

        def other_loop() -> None:
            try:
                anyio.run(ev.wait, backend=name, backend_options=options)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=other_loop)
        t.start()
        t.join(10)
        assert not t.is_alive()
        assert errors == []
        with anyio.fail_after(2):
            while statistics().armed or statistics().chained:
                await anyio.sleep(0.001)
        await ev.wait()  # done: at once
        ev.close()
