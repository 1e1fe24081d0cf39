"""Host timelines on the real GPU: cuStreamWaitValue64 and cuStreamWriteValue64 on a page of
shared, registered host memory, driven by CPU threads, by the GPU and by Vulkan beside them."""

from __future__ import annotations

import ctypes
import threading
import time

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import SEEN, frame_words, workloads
from aiocudasem.vulkan import VulkanDevice
from tests.conftest import open_fds
from tests.gpu.conftest import import_vk, run_script

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MS = 1_000_000  # ns


async def test_a_cpu_thread_hands_1000_frames_to_kernels(cuda: acs.Driver) -> None:
    """The producer thread writes frame n into a pinned ring slot and signals ready = n; the
    frame's kernel, behind Wait(ready, n), checks every word of the slot; the producer reuses
    a slot only once done says its frame was checked."""
    frames, ring, words = 1000, 4, 1024
    work = workloads(cuda)
    buf = work.alloc_pinned(ring * words * 4)
    out = work.alloc_pinned((frames + 2) * 4)
    try:
        slots = np.ctypeslib.as_array((ctypes.c_uint32 * (ring * words)).from_address(buf))
        slots = slots.reshape(ring, words)
        res = np.ctypeslib.as_array((ctypes.c_uint32 * (frames + 2)).from_address(out))
        res[:] = 0
        ready = acs.create_host_timeline(driver=cuda)
        done = acs.create_host_timeline(driver=cuda)
        failed: list[BaseException] = []

        def producer() -> None:
            try:
                for n in range(1, frames + 1):
                    deadline = time.monotonic() + 30
                    while done.value < n - ring:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"frame {n - ring} was never done")
                        time.sleep(0.00005)
                    slots[n % ring] = frame_words(n, words)
                    ready.signal(n)
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=producer, daemon=True)
        async with ready, done, acs.open_stream(driver=cuda) as s:
            thread.start()
            with anyio.fail_after(60):
                for n in range(1, frames + 1):
                    slot = buf + (n % ring) * words * 4
                    async with s.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                        work.launch_check_frame(s.handle, slot, words, n, out)
                    assert done.value >= n  # written by the GPU before the coroutine resumed
            thread.join(10)
            assert failed == []
            bad = [n for n in range(1, frames + 1) if res[n] != SEEN]
            assert bad == []
            # A frame that is wrong is caught: the kernels really read the slots.
            slots[1][7] ^= 1
            ready.signal(frames + 1)
            async with s.handoff(acs.Wait(ready, frames + 1), acs.Signal(done, frames + 1)):
                work.launch_check_frame(s.handle, buf + 1 * words * 4, words, frames + 1, out)
            assert res[frames + 1] == SEEN + words  # frame 997's words, all wrong for 1001
    finally:
        work.free_pinned(buf)
        work.free_pinned(out)


async def test_a_gpu_signal_wakes_a_host_wait(cuda: acs.Driver) -> None:
    async with acs.create_host_timeline(driver=cuda) as t, acs.open_stream(driver=cuda) as s:
        workloads(cuda).launch_spin(s.handle, 50 * MS)
        s.enqueue_signal(acs.Signal(t, 3))
        t0 = time.perf_counter()
        with anyio.fail_after(10):
            await t.wait_value(3)
        assert time.perf_counter() - t0 > 0.03  # not before the kernel ended
        assert t.value == 3
        with anyio.fail_after(10):
            await t.wait_value(2)  # reached already


async def test_the_release_waits_for_a_pending_gpu_wait(cuda: acs.Driver) -> None:
    """cuMemHostUnregister under a pending cuStreamWaitValue64 would pull the page from under
    the GPU: the release waits for the wait, and the device stays healthy."""
    t = acs.create_host_timeline(driver=cuda)
    twin = acs.open_host_timeline(t.export_fd(), driver=cuda)
    async with acs.open_stream(driver=cuda) as s:
        s.enqueue_wait(acs.Wait(t, 1))
        with anyio.move_on_after(0.2) as scope:
            await t.aclose()
        assert scope.cancelled_caught and t.closed
        twin.signal(1)
        with anyio.fail_after(10):
            await s.wait_complete()
    await twin.aclose()
    cuda.check_health(0)


async def test_a_cancelled_host_wait_then_the_release(cuda: acs.Driver) -> None:
    async with acs.open_stream(driver=cuda) as s:
        await s.wait_complete()  # the loop's notifier (its fd lives with the loop) exists now
    before = open_fds()
    t = acs.create_host_timeline(driver=cuda)
    with anyio.move_on_after(0.05) as scope:
        await t.wait_value(5)
    assert scope.cancelled_caught
    t.signal(5)  # the abandoned private stream's wait passes; the release can go on
    with anyio.fail_after(10):
        await t.aclose()
    cuda.check_health(0)
    assert open_fds() == before  # the page's fd is closed


async def test_vulkan_and_host_timelines_in_one_section(cuda: acs.Driver, vk: VulkanDevice) -> None:
    vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    ready, done = import_vk(vready, cuda), import_vk(vdone, cuda)
    hready = acs.create_host_timeline(driver=cuda)
    hdone = acs.create_host_timeline(driver=cuda)
    async with ready, done, hready, hdone, acs.open_stream(driver=cuda) as s:
        for n in range(1, 101):
            vready.signal(n)
            threading.Timer(0.0005, hready.signal, (n,)).start()
            with anyio.fail_after(10):
                async with s.handoff(
                    [acs.Wait(ready, n), acs.Wait(hready, n)],
                    [acs.Signal(done, n), acs.Signal(hdone, n)],
                ):
                    workloads(cuda).launch_spin(s.handle, 10_000)
            assert vdone.value == n and hdone.value == n
    vready.close()
    vdone.close()


_FIRST_WAIT = """
import anyio, aiocudasem as acs
from aiocudasem.testing import workloads

drv = acs.get_driver("cuda")
work = workloads(drv)  # its kernels load ahead of the device's first wait, not at first launch


async def main() -> None:
    async with acs.create_host_timeline(driver=drv) as t, acs.open_stream(driver=drv) as s:
        s.enqueue_wait(acs.Wait(t, 1))  # the device's first wait of any kind
        work.launch_spin(s.handle, 1000)  # the kernel's first launch, behind a blocked stream
        t.signal(1)
        with anyio.fail_after(20):
            await s.wait_complete()
    print("ok")


anyio.run(main)
"""


def test_a_first_wait_on_a_host_timeline_loads_kernels_ahead_under_lazy_loading() -> None:
    """Lazy loading loads a kernel at its first launch, and loading waits until no stream of
    the context is blocked: a first launch behind a pending memory wait that only the host
    will satisfy afterwards would never return. The library loads the workload kernels before
    the device's first wait, memory waits included. A fresh process, with the driver's
    default loading mode."""
    proc = run_script(_FIRST_WAIT, timeout=60)
    assert proc.stdout.strip().endswith("ok")


_MANY_BLOCKED_STREAMS = """
import sys
import anyio
import aiocudasem as acs
from aiocudasem.lowlevel import statistics

backend, uvloop = sys.argv[1], sys.argv[2] == "uvloop"

async def main():
    drv = acs.get_driver("cuda")
    tl = acs.create_host_timeline(driver=drv)
    streams = [acs.open_stream(driver=drv) for _ in range(64)]
    for s in streams:
        s.enqueue_wait(acs.Wait(tl, 1))
    woke = 0

    async def waiter(s):
        nonlocal woke
        await s.wait_complete()
        woke += 1

    async with anyio.create_task_group() as tg:
        for s in streams:
            for _ in range(4):
                tg.start_soon(waiter, s)
        with anyio.fail_after(20):
            while statistics().parked < 256:
                await anyio.sleep(0.01)
        tl.signal(1)  # the loop itself is the producer
    assert woke == 256, woke
    for s in streams:
        await s.aclose()
    await tl.aclose()
    print("woke", woke)

anyio.run(main, backend=backend, backend_options={"use_uvloop": True} if uvloop else {})
"""


@pytest.mark.parametrize(
    ("backend", "uvloop"), [("asyncio", False), ("asyncio", True), ("trio", False)]
)
def test_64_streams_blocked_on_the_loops_own_signal_all_wake(backend: str, uvloop: bool) -> None:
    """Waits parked on 64 streams that wait for a host timeline which the loop itself signals
    afterwards. Each stream's first parked wait launches a host function behind blocked work;
    a side stream made at that moment blocks in cuStreamCreate once about 13 are queued (H200,
    driver 580), with the loop's thread inside it, so the signal never came. Streams make their
    side streams when they are opened, and this completes. A fresh process: a hang fails by
    the timeout instead of holding the suite."""
    proc = run_script(_MANY_BLOCKED_STREAMS, backend, "uvloop" if uvloop else "plain", timeout=90)
    assert "woke 256" in proc.stdout
