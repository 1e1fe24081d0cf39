"""Progress from inside a running kernel, on the simulated device: a persistent kernel publishes
increasing values into a host timeline's word (``launch_progress``, the simulated twin of a
kernel calling ``aiocudasem_publish()``), and the host awaits each one with
``HostTimeline.wait_value()`` while the kernel still runs; a kernel that traps midway fails the
wait with ``DeviceFaultError``; cancelled waits leave nothing behind. Timing figures are printed,
not asserted: the machine may be shared."""

from __future__ import annotations

import ctypes
import gc
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, workloads

pytestmark = pytest.mark.anyio

MS = 1_000_000  # ns


@asynccontextmanager
async def progress_run(
    sim: SimDriver, count: int, ns: int, **kwargs: int
) -> AsyncIterator[tuple[acs.HostTimeline, acs.Stream, np.ndarray]]:
    """A host timeline, and a stream running a progress kernel that publishes 1 to ``count``
    into it over ``ns``; the kernel's stamps (perf_counter_ns before each publish) as an
    array over pinned memory, valid until the run ends. The timeline is released only after
    the stream's work."""
    work = workloads(sim)
    stamps = work.alloc_pinned(8 * count)
    try:
        array = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(stamps))
        async with acs.create_host_timeline(driver=sim) as t:
            s = acs.open_stream(driver=sim)
            try:
                work.launch_progress(s, t.handle, count, ns, stamps=stamps, **kwargs)
                yield t, s, array
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await s.aclose()  # the kernel's end, before the page goes
                    except acs.DeviceFaultError:
                        pass
    finally:
        work.free_pinned(stamps)


async def test_1000_values_over_2_s_are_each_awaited_in_order(sim: SimDriver) -> None:
    """Every value is awaited in turn: each wait returns once its value is published (the
    value is there when it returns, and the kernel's stamp of it comes first), and none is
    skipped. Waiting costs the host no polling: the process's CPU time over the run is a
    fraction of a core, and that includes the simulated kernel and the simulator's own
    polling of the word, which a GPU does in hardware."""
    count = 1000
    woke = np.zeros(count, dtype=np.int64)
    seen = np.zeros(count, dtype=np.int64)
    late = np.zeros(count, dtype=bool)  # published before its wait began: not a wake-up
    async with progress_run(sim, count, 2000 * MS) as (t, s, published):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with anyio.fail_after(60):
            for n in range(1, count + 1):
                late[n - 1] = t.value >= n
                await t.wait_value(n)
                woke[n - 1] = time.perf_counter_ns()
                seen[n - 1] = t.value
            await s.wait_complete()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stamps = published.astype(np.int64)  # a copy: the pinned memory goes with the run
    values = np.arange(1, count + 1)
    assert (seen >= values).all()  # never before its value
    assert (np.diff(seen) >= 0).all()
    assert (stamps > 0).all() and (np.diff(stamps) >= 0).all()
    latency = woke - stamps  # publish to resume
    assert (latency > 0).all()
    woken = latency[~late] / 1e3
    print(
        f"{count} values in {wall:.2f} s: {len(woken)} waits parked, median wake "
        f"{np.median(woken):.0f} us, p99 {np.percentile(woken, 99):.0f} us, max "
        f"{woken.max():.0f} us; CPU {cpu:.2f} s ({100 * cpu / wall:.0f}% of a core)"
    )
    assert wall >= 1.9  # the kernel's pace, not the host's
    assert np.median(latency) < 1e9  # sanity only
    # No host thread polls the word: a poll would take a whole core on top of the simulated
    # kernel's own Python (about a third of one). Loose, for a loaded machine.
    assert cpu < 1.0 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s"


async def test_waits_for_values_ahead_wake_in_order(sim: SimDriver) -> None:
    """Many tasks wait at once for values the kernel publishes later: each wakes once its own
    value is there, in the order the values come."""
    order: list[int] = []
    async with progress_run(sim, 50, 1000 * MS) as (t, _, _):

        async def wait(n: int) -> None:
            await t.wait_value(n)
            assert t.value >= n
            order.append(n)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for n in (50, 10, 30, 1, 20, 40):
                    tg.start_soon(wait, n)
    assert order == [1, 10, 20, 30, 40, 50]


@pytest.mark.usefixtures("fault_watchdog")
async def test_a_kernel_that_traps_midway_fails_the_wait(sim: SimDriver) -> None:
    """The values before the trap arrive; the wait for the value the kernel never publishes
    raises DeviceFaultError (CUDA_ERROR_LAUNCH_FAILED) in bounded time, and so does every
    later one, never a hang. The timeline is still released."""
    async with progress_run(sim, 100, 500 * MS, trap_at=50) as (t, s, _):
        with anyio.fail_after(30):
            for n in range(1, 50):
                await t.wait_value(n)
        started = time.perf_counter()
        with anyio.fail_after(10), pytest.raises(acs.DeviceFaultError) as info:
            await t.wait_value(50)
        took = time.perf_counter() - started
        assert info.value.status == 719
        assert t.value == 49
        with anyio.fail_after(10), pytest.raises(acs.DeviceFaultError):
            await t.wait_value(60)
        with pytest.raises(acs.DeviceFaultError):
            s.query()
        print(f"the wait failed {took * 1e3:.0f} ms after it began (the trap came ~5 ms in)")


@pytest.mark.usefixtures("fault_watchdog")
async def test_stamps_outside_pinned_memory_fault_the_device(sim: SimDriver) -> None:
    """A stamps address that is no pinned memory of the workloads faults the device, as the
    GPU's store would, and the wait raises: no crash of the process."""
    async with acs.create_host_timeline(driver=sim) as t:
        s = acs.open_stream(driver=sim)
        workloads(sim).launch_progress(s, t.handle, 2, MS, stamps=8)
        with anyio.fail_after(10), pytest.raises(acs.DeviceFaultError):
            await s.wait_complete()
        with pytest.raises(acs.DeviceFaultError):
            await s.aclose()


@pytest.mark.usefixtures("fault_watchdog")
async def test_a_trap_wakes_every_task_parked_on_later_values(sim: SimDriver) -> None:
    errors: list[int] = []
    async with progress_run(sim, 100, 200 * MS, trap_at=30) as (t, _, _):

        async def wait(n: int) -> None:
            try:
                await t.wait_value(n)
            except acs.DeviceFaultError as exc:
                errors.append(exc.status)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for n in range(30, 101, 10):
                    tg.start_soon(wait, n)
    assert errors == [719] * 8


async def test_cancelled_progress_waits_leave_nothing_behind(sim: SimDriver) -> None:
    """Waits for values the kernel has not published yet, cancelled: once the kernel has
    published them, the private streams of those waits go back, and the side streams, pooled
    events and parked coroutines are back to what they were."""
    async with acs.open_stream(driver=sim) as warm:
        await warm.wait_complete()  # the notifier and its first pooled event
    async with progress_run(sim, 200, 400 * MS) as (t, s, _):
        await t.wait_value(1)  # what a completed wait keeps
        gc.collect()
        before, threads = statistics(), threading.active_count()
        cancelled = 0
        with anyio.fail_after(30):
            for n in range(2, 180, 3):
                with anyio.move_on_after(0.001) as scope:
                    # Further ahead than 1 ms of the kernel, and a value it publishes: the
                    # timeline's release waits for the abandoned GPU waits.
                    await t.wait_value(n + 20)
                cancelled += scope.cancelled_caught
            await t.wait_value(200)
            await s.wait_complete()
        assert cancelled > 30
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            threading.active_count() > threads or statistics().side_streams > before.side_streams
        ):
            await anyio.sleep(0.02)
            await t.wait_value(200)  # a completed wait sweeps the idle parked streams
        after = statistics()
    assert after.side_streams <= before.side_streams, (before, after)
    assert after.pooled_events <= before.pooled_events + 1, (before, after)
    assert after.parked == 0 and after.armed == 0, after
    assert threading.active_count() <= threads


@pytest.mark.usefixtures("fault_watchdog")
async def test_a_timeline_released_under_the_kernel_faults_the_device(sim: SimDriver) -> None:
    """The timeline's release does not know about the kernel: a page unregistered while the
    kernel still publishes into it faults the device (CUDA_ERROR_ILLEGAL_ADDRESS), as the
    GPU's store would, rather than writing to unmapped memory."""
    t = acs.create_host_timeline(driver=sim)
    async with acs.open_stream(driver=sim) as warm:
        await warm.wait_complete()
    s = acs.open_stream(driver=sim)
    workloads(sim).launch_progress(s, t.handle, 100, 200 * MS)
    with anyio.fail_after(10):
        await t.wait_value(2)
        await t.aclose()
    with anyio.fail_after(10), pytest.raises(acs.DeviceFaultError) as info:
        await s.wait_complete()
    assert info.value.status == 700
    with pytest.raises(acs.DeviceFaultError):
        await s.aclose()


def test_progress_arguments_are_checked(sim: SimDriver) -> None:
    work = workloads(sim)
    t = acs.create_host_timeline(driver=sim)
    s = acs.open_stream(driver=sim)
    word = t.handle
    for bad, error in [
        ({"word": word + 4}, ValueError),
        ({"word": 0}, ValueError),
        ({"word": float(word)}, TypeError),
        ({"count": 0}, ValueError),
        ({"count": 2**32}, ValueError),
        ({"count": True}, TypeError),
        ({"ns": -1}, ValueError),
        ({"start": 2**63 - 10}, ValueError),
        ({"trap_at": 0}, ValueError),
        ({"trap_at": 11}, ValueError),
        ({"stamps": 0}, ValueError),
    ]:
        args = {"word": word, "count": 10, "ns": MS} | bad
        with pytest.raises(error):
            work.launch_progress(s, **args)  # type: ignore[arg-type]
    assert s.query()  # nothing was enqueued
    other = SimDriver()
    with pytest.raises(acs.DeviceMismatchError):
        workloads(other).launch_progress(s, word, 10, MS)
    work.launch_progress(s, word, 10, MS, start=5, trap_at=None)
    deadline = time.monotonic() + 10
    while not s.query() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert t.value == 15
    s.close()
    t.close()
