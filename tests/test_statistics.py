"""statistics(): a frozen snapshot of the running loop's notifier and the process-wide pools,
which creates nothing when read."""

from __future__ import annotations

import dataclasses
import os
import threading

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem._notifier import running_notifier
from aiocudasem._notifier._watchdog import _watchdog
from aiocudasem.lowlevel import Statistics, statistics
from aiocudasem.testing import SimDriver, hold
from tests.conftest import fault_parked_waiters, wait_for_child

_PER_LOOP = (
    "pending",
    "fired",
    "wakeups",
    "armed",
    "chained",
    "parked",
    "spinning",
    "watched",
    "drainer_wakeups",
    "completed",
    "faulted",
    "ahead_caught",
    "ahead_early",
    "ahead_late",
)


def _per_loop(s: Statistics) -> dict[str, int]:
    return {name: getattr(s, name) for name in _PER_LOOP}


def test_statistics_is_frozen_and_slotted() -> None:
    s = statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.parked = 1  # type: ignore[misc]
    assert not hasattr(s, "__dict__")
    assert {f.name for f in dataclasses.fields(Statistics)} == {
        *_PER_LOOP,
        "notifiers",
        "side_streams",
        "pooled_events",
        "watchdog_threads",
        "faults_seen",
        "leaked",
    }
    assert Statistics() == Statistics(**dict.fromkeys(_PER_LOOP, 0))


def test_outside_a_loop_the_loop_counters_are_zero_and_nothing_starts() -> None:
    threads = threading.active_count()
    before = statistics()
    after = statistics()
    assert _per_loop(before) == dict.fromkeys(_PER_LOOP, 0)
    assert after == before
    assert threading.active_count() == threads


@pytest.mark.anyio
async def test_reading_creates_no_notifier(sim: SimDriver) -> None:
    notifiers = statistics().notifiers
    assert _per_loop(statistics()) == dict.fromkeys(_PER_LOOP, 0)
    assert running_notifier() is None
    assert statistics().notifiers == notifiers
    outside = await anyio.to_thread.run_sync(statistics)  # another thread: no running loop
    assert _per_loop(outside) == dict.fromkeys(_PER_LOOP, 0)


@pytest.mark.anyio
async def test_a_parked_waiter_is_counted(sim: SimDriver, parked: None) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.wait_complete)
                await anyio.wait_all_tasks_blocked()
                now = statistics()
                assert (now.parked, now.armed, now.chained, now.pending) == (1, 1, 1, 1)
                assert (now.watched, now.spinning, now.fired, now.wakeups) == (1, 0, 0, 0)
                assert now.notifiers >= 1
                assert now.side_streams >= 1
                assert now.watchdog_threads >= 1
                gate.set()
        done = statistics()
        assert (done.parked, done.armed, done.chained, done.pending, done.watched) == (0,) * 5
        assert (done.fired, done.wakeups) == (1, 1)  # one host function, one fd write
        assert done.drainer_wakeups >= 1
        assert done.pooled_events >= 1  # the point's event went back to the pool


@pytest.mark.anyio
async def test_a_spinning_waiter_is_counted(sim: SimDriver) -> None:
    acs.configure(spin_limit=10.0)
    try:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.wait_complete)
                    while statistics().spinning == 0:
                        await anyio.lowlevel.checkpoint()
                    assert statistics().parked == 0
                    gate.set()
            assert statistics().spinning == 0
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() with threads
def test_a_forked_child_starts_with_empty_pools_and_no_watchdog_threads(parked: None) -> None:
    sim = SimDriver(devices=1)
    s = acs.open_stream(driver=sim)  # kept open: its side stream stays

    async def use() -> None:
        threading.Timer(0.01, hold(s).set).start()
        with anyio.fail_after(5):
            await s.wait_complete()  # parks: a side stream and a watchdog thread
        with anyio.fail_after(5):
            await s.wait_complete()  # leaves events in the pool

    anyio.run(use)
    parent = statistics()
    assert parent.side_streams and parent.pooled_events and parent.watchdog_threads
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 10
        try:
            child = statistics()
            left = (child.side_streams, child.pooled_events, child.watchdog_threads)
            # The parent's threads are gone: the watchdog must not think it still has one.
            code = 0 if left == (0, 0, 0) and not _watchdog._sentries else 11
        finally:
            os._exit(code)
    assert wait_for_child(pid, 30) == 0
    anyio.run(s.aclose)


@pytest.mark.anyio
async def test_completions_and_faults_are_counted(sim: SimDriver, fault_watchdog: float) -> None:
    before = statistics()
    async with acs.open_stream(driver=sim) as s:
        await s.wait_complete()  # idle: complete at once, one
        gate = hold(s)
        ev = s.record()
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # three waiters of one point: three awaits that returned
                tg.start_soon(ev.wait)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        await s.record().wait()  # complete at the first query: one more
    # ...and aclose() waits for the owned stream, idle again: six in all.
    after = statistics()
    assert after.completed - before.completed == 6
    assert after.faulted == before.faulted
    doomed = await fault_parked_waiters(sim, 1, 2)  # two waits, two points
    faulted = statistics()
    assert faulted.faulted - after.faulted == 2
    assert faulted.faults_seen == after.faults_seen + 1
    with pytest.raises(acs.DeviceFaultError):
        await doomed.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("spin", [False, True])
async def test_completed_counts_each_await_that_returned(sim: SimDriver, spin: bool) -> None:
    """One per coroutine whose await returned normally, whatever path it took (the C path
    of finished work, a spin, a park, a shared point); none for a cancelled await."""
    acs.configure(spin_limit=acs.Tuning().spin_limit if spin else 0)
    try:
        async with acs.open_stream(driver=sim) as s:
            before = statistics().completed
            await s.wait_complete()  # idle
            await s.record().wait()  # finished at the first query
            assert statistics().completed - before == 2

            gate = hold(s)
            ev = s.record()
            before = statistics().completed
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for _ in range(5):
                        tg.start_soon(ev.wait)
                    for _ in range(7):
                        tg.start_soon(s.wait_complete)
                    await anyio.wait_all_tasks_blocked()
                    gate.set()
            assert statistics().completed - before == 12

            gate = hold(s)
            before = statistics().completed
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(s.wait_complete)
                    tg.start_soon(s.record().wait)
                    await anyio.wait_all_tasks_blocked()
                    tg.cancel_scope.cancel()
            gate.set()
            assert statistics().completed == before  # cancelled: none returned
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


@pytest.mark.anyio
async def test_the_statistics_are_the_notifiers_own_report(sim: SimDriver, parked: None) -> None:
    from aiocudasem._notifier import current_notifier

    async with acs.open_stream(driver=sim) as s:
        await s.wait_complete()
        report = current_notifier().statistics()
        assert set(report) == set(_PER_LOOP)
        assert _per_loop(statistics()) == report
