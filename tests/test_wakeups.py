"""Wake-ups come from completions (or faults), promptly, never from a timer; cancelling any
waiter, the drainer included and however often, loses nobody else's wake-up. The suite runs
with the watchdog effectively off (see conftest), so a wake-up that waited for it fails here."""

from __future__ import annotations

import random
import statistics
import threading
import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier import side_streams
from aiocudasem.lowlevel import statistics as notifier_statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import StallWatch, until_parked

pytestmark = pytest.mark.anyio


async def test_a_parked_loop_is_not_woken_by_a_timer(sim: SimDriver, parked: None) -> None:
    acs.configure(watchdog=0.005)  # a busy fault watchdog must still not wake the loop
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            before = notifier_statistics()
            await anyio.to_thread.run_sync(time.sleep, 0.3)
            after = notifier_statistics()
            assert after.drainer_wakeups == before.drainer_wakeups
            assert after.wakeups == before.wakeups
            # anyio's wait_all_tasks_blocked() re-samples every 100 ms on asyncio while any task
            # is runnable: with a parked wait it must return at once.
            took = []
            for _ in range(10):
                t0 = time.perf_counter()
                await anyio.wait_all_tasks_blocked()
                took.append(time.perf_counter() - t0)
            assert statistics.median(took) <= 0.005, took
            assert max(took) < 0.05, took
            gate.set()


async def test_short_timeout_waiters_and_a_busy_cpu_do_not_starve_a_long_waiter(
    sim: SimDriver, fault_watchdog: float
) -> None:
    """64 tasks wait with 0.4-3 ms timeouts while one task burns 2 ms of CPU per step: the
    drainer role keeps moving to waiters that are cancelled before they drain. A long waiter
    whose work completed must still wake, and a device fault must still be reported."""
    rng = random.Random(9)
    busy = [acs.open_stream(0, driver=sim) for _ in range(8)]
    busy_gates = [hold(b) for b in busy]
    long_stream = acs.open_stream(0, driver=sim)
    long_gate = hold(long_stream)
    doomed = acs.open_stream(1, driver=sim)
    hold(doomed)
    stop = anyio.Event()
    woke: dict[str, float] = {}

    async def short(i: int) -> None:
        while not stop.is_set():
            with anyio.move_on_after(rng.uniform(0.0004, 0.003)):
                await busy[i % 8].wait_complete()

    async def cpu() -> None:
        while not stop.is_set():
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
            await anyio.lowlevel.checkpoint()

    async def long_waiter() -> None:
        await long_stream.wait_complete()
        woke["long"] = time.perf_counter()

    async def fault_waiter() -> None:
        with pytest.raises(acs.DeviceFaultError):
            await doomed.wait_complete()
        woke["fault"] = time.perf_counter()

    with anyio.fail_after(10), StallWatch() as watch:
        async with anyio.create_task_group() as tg:
            for i in range(64):
                tg.start_soon(short, i)
            tg.start_soon(cpu)
            tg.start_soon(long_waiter)
            tg.start_soon(fault_waiter)
            await anyio.sleep(0.2)
            t0 = time.perf_counter()
            long_gate.set()
            sim.inject_fault(1)
            while len(woke) < 2 and time.perf_counter() - t0 < 5:
                await anyio.sleep(0.01)
            stop.set()
    for g in busy_gates:
        g.set()
    assert "long" in woke, "the long waiter was not woken within 5 s"
    assert "fault" in woke, "the device fault was not reported within 5 s"
    # Promptly, unless the whole process stood still meanwhile (a 1 s stall was seen in CI).
    assert woke["long"] - t0 < 1.0 + watch.stall, watch.stall
    assert woke["fault"] - t0 < 1.0 + watch.stall, watch.stall
    for b in [*busy, long_stream]:
        await b.aclose()
    with pytest.raises(acs.DeviceFaultError):
        await doomed.aclose()  # released all the same


async def test_a_plain_wait_is_prompt_right_after_a_cancellation_storm(
    sim: SimDriver, parked: None
) -> None:
    sem, producer = import_sim_semaphore(sim)
    rng = random.Random(3)
    async with acs.open_stream(driver=sim) as s:
        n = 0
        # 1,000 waits behind a producer that has not signalled: with the points recorded behind
        # them, about 2,000 operations, within a queue of commands (SimDriver.queue_depth).
        for _ in range(1000):
            n += 1
            s.enqueue_wait(acs.Wait(sem, n))
            with anyio.move_on_after(rng.uniform(0, 0.0002)):
                await s.wait_complete()
        producer.signal(n)
        t0 = time.perf_counter()
        with anyio.fail_after(5), StallWatch() as watch:
            await s.wait_complete()
        assert time.perf_counter() - t0 < 0.5 + watch.stall, watch.stall
        assert notifier_statistics().parked == 0
    await sem.aclose()


@pytest.mark.parametrize("how", ["aclose cancelled", "error exit"])
async def test_waiters_of_a_stream_closed_under_them_all_wake(
    sim: SimDriver, parked: None, how: str
) -> None:
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    woke = 0

    async def waiter() -> None:
        nonlocal woke
        with anyio.fail_after(5):
            await s.wait_complete()
        woke += 1

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        if how == "aclose cancelled":
            with anyio.move_on_after(0.01):
                await s.aclose()  # its wait is cancelled: the stream is destroyed anyway
        else:
            with pytest.raises(KeyError):
                async with s:
                    raise KeyError("the body failed")
        assert s.closed
        gate.set()
    assert woke == 5


async def test_surplus_host_wait_streams_take_their_side_streams_along(
    sim: SimDriver, parked: None
) -> None:
    pairs = [import_sim_semaphore(sim) for _ in range(100)]
    async with anyio.create_task_group() as tg:
        for sem, _ in pairs:
            tg.start_soon(sem.wait_value, 1)
        await anyio.wait_all_tasks_blocked()
        assert side_streams.count(sim) == 100  # one private stream (and side stream) each
        for _, producer in pairs:
            producer.signal(1)
    # 64 private streams are kept for reuse; the 36 others were destroyed, and their side
    # streams with them (they were orphaned: 100 remained).
    assert side_streams.count(sim) <= 64
    for sem, _ in pairs:
        await sem.aclose()


async def test_the_first_host_side_wait_of_a_semaphore_or_timeline_creates_no_stream(
    sim: SimDriver, parked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing a semaphore or making a host timeline reserves a private stream, with its side
    stream, for host-side waits: the first such wait parks without creating a stream, which
    could block the loop (see ``side_streams.ensure``)."""
    from aiocudasem._notifier import host_wait_streams

    host_wait_streams._free.pop(sim, None)  # none left over from other tests
    sem, producer = import_sim_semaphore(sim)
    timeline = acs.create_host_timeline(driver=sim)

    def no_new_streams(*args: object) -> int:
        raise AssertionError("a stream was created during a wait")

    monkeypatch.setattr(sim, "stream_create", no_new_streams)
    for waitable, release in ((sem, producer.signal), (timeline, timeline.signal)):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waitable.wait_value, 1)
            await until_parked()
            release(1)
    monkeypatch.undo()
    await sem.aclose()
    await timeline.aclose()


def _times_scheduled(thread: threading.Thread) -> int:
    """How often Linux has run ``thread`` (schedstat's third field): one per wake-up."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[2])


async def test_a_parked_device_costs_the_watchdog_no_wake_ups(sim: SimDriver, parked: None) -> None:
    """The fault watchdog sleeps in the driver behind the parked work: however short its period,
    its thread is not woken while nothing completes (a periodic check would wake 60 times
    here)."""
    from aiocudasem._notifier._watchdog import _watchdog

    acs.configure(watchdog=0.005)
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.05)  # the thread has started and gone to sleep
            thread = _watchdog._sentries[sim][0].thread
            assert thread is not None and thread.native_id is not None
            before = _times_scheduled(thread)
            await anyio.sleep(0.3)
            assert _times_scheduled(thread) - before <= 1
            gate.set()


async def test_an_idle_watchdog_thread_ends_and_releases_its_event(
    sim: SimDriver, parked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiocudasem._notifier._watchdog import _watchdog
    from tests.conftest import watchdog_events

    monkeypatch.setattr(_watchdog, "_IDLE", 0.05)
    acs.configure(watchdog=0.01)
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.wait_all_tasks_blocked()
            sentry = _watchdog._sentries[sim][0]
            thread = sentry.thread
            assert thread is not None
            await anyio.sleep(0.05)
            assert watchdog_events(sim)  # it sleeps behind the parked work, on its event
            gate.set()
        with anyio.fail_after(5):
            while thread.is_alive():
                await anyio.sleep(0.01)
        assert sentry.event is None
        assert not watchdog_events(sim)
        assert not _watchdog._sentries.get(sim)
