"""A device fault wakes every waiter with DeviceFaultError in bounded time, never a hang."""

from __future__ import annotations

import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, workloads
from tests.conftest import StallWatch

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("fault_watchdog")]


async def test_fault_wakes_every_parked_waiter(sim: SimDriver) -> None:
    acs.configure(spin_limit=0)
    try:
        s1 = acs.open_stream(driver=sim)
        s2 = acs.open_stream(driver=sim)
        hold(s1)
        hold(s2)
        errors: list[BaseException] = []

        async def wait(stream: acs.Stream) -> None:
            try:
                await stream.wait_complete()
            except acs.DeviceFaultError as exc:
                errors.append(exc)

        with anyio.fail_after(5):  # bounded by the watchdog thread, not a hang
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(wait, s1)
                    tg.start_soon(wait, s2)
                await anyio.wait_all_tasks_blocked()
                sim.inject_fault(0, status=700)
        assert len(errors) == 20
        assert all(e.status == 700 for e in errors)
        assert len({id(e) for e in errors}) == 20  # one exception object per waiter
        with pytest.raises(acs.DeviceFaultError):
            s1.query()
        for s in (s1, s2):
            with pytest.raises(acs.DeviceFaultError):
                await s.aclose()
            assert s.closed
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_trap_kernel_fails_the_wait(sim: SimDriver) -> None:
    s = acs.open_stream(driver=sim)
    workloads(sim).launch_trap(s.handle)
    with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError) as info:
        await s.wait_complete()
    assert info.value.status == 719
    with pytest.raises(acs.DeviceFaultError):
        await s.aclose()  # its wait for the enqueued work fails
    assert s.closed  # but the stream is released all the same


async def test_fault_while_spinning(sim: SimDriver) -> None:
    acs.configure(spin_limit=10.0)
    try:
        s = acs.open_stream(driver=sim)
        hold(s)
        async with anyio.create_task_group() as tg:

            async def fault_soon() -> None:
                await anyio.sleep(0.01)
                sim.inject_fault(0)

            tg.start_soon(fault_soon)
            with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError):
                await s.wait_complete()
        with pytest.raises(acs.DeviceFaultError):
            await s.aclose()
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_fault_fails_a_host_semaphore_wait(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim, device=1)
    async with anyio.create_task_group() as tg:

        async def fault_soon() -> None:
            await anyio.sleep(0.01)
            sim.inject_fault(1, status=719)

        tg.start_soon(fault_soon)
        with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError):
            await sem.wait_value(1)
    await sem.aclose()  # the semaphore went with the context: closing still succeeds
    assert sem.closed


async def test_other_device_keeps_working_after_a_fault(sim: SimDriver) -> None:
    sim.inject_fault(0)
    async with acs.open_stream(1, driver=sim) as s:
        gate = hold(s)
        gate.set()
        with anyio.fail_after(5):
            await s.wait_complete()
    with pytest.raises(acs.DeviceFaultError):
        acs.open_stream(0, driver=sim)


async def test_stuck_producer_times_out_cleanly(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    producer.set_stuck()
    async with acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(sem, 1))
        producer.signal(1)  # lost: the producer is stuck
        with pytest.raises(TimeoutError), anyio.fail_after(0.05):
            await s.wait_complete()
        producer.set_stuck(False)
        producer.signal(1)
        with anyio.fail_after(5):
            await s.wait_complete()
    await sem.aclose()


async def _fault_latency(sim: SimDriver, stream: acs.Stream, *, before_fault: float) -> float:
    """Park three waiters on ``stream``, inject a fault ``before_fault`` seconds later, and
    return how long the last waiter took to get its DeviceFaultError."""
    failed: list[float] = []

    async def wait() -> None:
        with pytest.raises(acs.DeviceFaultError):
            await stream.wait_complete()
        failed.append(time.perf_counter())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(wait)
            await anyio.sleep(before_fault)
            t0 = time.perf_counter()
            sim.inject_fault(0)
    assert len(failed) == 3
    return max(failed) - t0


async def test_a_fault_reaches_parked_waiters_without_a_periodic_check(
    sim: SimDriver, parked: None
) -> None:
    """The watchdog thread sleeps in the driver behind the parked work, so a fault reaches the
    waiters at once even when its periodic check is a minute away."""
    acs.configure(watchdog=60)
    s = acs.open_stream(driver=sim)
    hold(s)
    with StallWatch() as watch:
        took = await _fault_latency(sim, s, before_fault=0.1)
    assert took < 0.1 + watch.stall, (took, watch.stall)
    with pytest.raises(acs.DeviceFaultError):
        await s.aclose()


async def test_the_watchdog_moves_on_when_the_work_it_sleeps_behind_completes(
    sim: SimDriver, parked: None
) -> None:
    """The watchdog sleeps behind the oldest parked point. When that completes it moves behind
    another one within a period, not only checking once a period from then on."""
    period = 0.3
    acs.configure(watchdog=period)
    first = acs.open_stream(driver=sim)
    second = acs.open_stream(driver=sim)
    first_gate = hold(first)
    hold(second)
    took: list[float] = []

    async def fault_second() -> None:
        # A period from now the watchdog sleeps behind `second`; a fault half a period after
        # that is seen at once, where a periodic check would still be a half period away.
        took.append(await _fault_latency(sim, second, before_fault=1.5 * period))

    with StallWatch() as watch:
        async with anyio.create_task_group() as tg:
            tg.start_soon(first.wait_complete)  # the oldest: the watchdog sleeps behind it
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            tg.start_soon(fault_second)
            await anyio.wait_all_tasks_blocked()
            first_gate.set()
    assert took[0] < 0.1 + watch.stall, (took, watch.stall)
    for s in (first, second):
        with pytest.raises(acs.DeviceFaultError):
            await s.aclose()
