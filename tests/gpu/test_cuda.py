"""The library on the real CUDA driver, with Vulkan as the external producer."""

from __future__ import annotations

import ctypes
import os
import threading
import time

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem._notifier import current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SEEN, frame_word, workloads
from aiocudasem.vulkan import VulkanDevice
from tests.conftest import open_fds
from tests.gpu.conftest import import_vk, run_script

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MS = 1_000_000  # ns


async def test_wait_complete_waits_for_a_kernel(cuda: acs.Driver) -> None:
    async with acs.open_stream(driver=cuda) as s:
        workloads(cuda).launch_spin(s.handle, 20 * MS)
        t0 = time.perf_counter()
        assert not s.query()
        with anyio.fail_after(10):
            await s.wait_complete()
        assert time.perf_counter() - t0 >= 0.019
        assert s.query()
        ev = s.record()
        with anyio.fail_after(10):
            await ev.wait()
        assert ev.query()
        ev.close()


async def test_parked_path_and_spin_path_both_complete(cuda: acs.Driver) -> None:
    async with acs.open_stream(driver=cuda) as s:
        for spin in (0.0, acs.Tuning().spin_limit):
            acs.configure(spin_limit=spin)
            before = statistics().fired
            # Spinning off, the kernel must outlast the wait's first checkpoint, which a
            # collection or a busy host can stretch past 0.3 ms (1 wait in 50 once did on trio).
            kernel_ns = 3_000_000 if spin == 0 else 300_000
            for _ in range(50):
                workloads(cuda).launch_spin(s.handle, kernel_ns)
                with anyio.fail_after(10):
                    await s.wait_complete()
            fired = statistics().fired - before
            if spin == 0:
                assert fired == 50  # every wait parked on the host function
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_timeline_host_signal_gpu_wait_kernel_signal_vulkan_observes(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    vready = vk.create_timeline_semaphore()
    vdone = vk.create_timeline_semaphore()
    ready = import_vk(vready, cuda)
    done = import_vk(vdone, cuda)
    async with acs.open_stream(driver=cuda) as s:
        s.enqueue_wait(acs.Wait(ready, 1))
        workloads(cuda).launch_spin(s.handle, MS)
        s.enqueue_signal(acs.Signal(done, 2))
        await anyio.sleep(0.02)
        assert not s.query()  # the GPU waits for Vulkan
        assert vdone.value == 0
        vready.signal(1)
        with anyio.fail_after(10):
            await s.wait_complete()
        assert vdone.block_until(2, timeout=5)
        assert vdone.value == 2
    await ready.aclose()
    await done.aclose()
    vready.close()
    vdone.close()


async def test_binary_queue_signal_gpu_wait_signal_vulkan_queue_waits(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    vin = vk.create_binary_semaphore()
    vout = vk.create_binary_semaphore()
    vseen = vk.create_timeline_semaphore()
    sin = import_vk(vin, cuda)
    sout = import_vk(vout, cuda)
    async with acs.open_stream(driver=cuda) as s:
        vin.submit_signal()  # an empty queue submission, as a renderer's frame
        s.enqueue_wait(acs.Wait(sin))
        workloads(cuda).launch_spin(s.handle, 100_000)
        s.enqueue_signal(acs.Signal(sout))
        vout.submit_wait(then_signal=vseen, then_signal_value=1)  # Vulkan's queue waits on CUDA
        with anyio.fail_after(10):
            await s.wait_complete()
        assert vseen.block_until(1, timeout=5)
    await sin.aclose()
    await sout.aclose()
    vk.block_until_idle()
    for v in (vin, vout, vseen):
        v.close()


async def test_batch_wait_over_three_semaphores(cuda: acs.Driver, vk: VulkanDevice) -> None:
    va, vb = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    vc = vk.create_binary_semaphore()
    a, b, c = (import_vk(v, cuda) for v in (va, vb, vc))
    async with acs.open_stream(driver=cuda) as s:
        s.enqueue_wait(acs.Wait(a, 5), acs.Wait(b, 7), acs.Wait(c))
        va.signal(5)
        vc.submit_signal()
        await anyio.sleep(0.02)
        assert not s.query()  # b is still short of 7
        vb.signal(7)
        with anyio.fail_after(10):
            await s.wait_complete()
    for sem in (a, b, c):
        await sem.aclose()
    vk.block_until_idle()
    for v in (va, vb, vc):
        v.close()


async def test_wait_external_semaphores_facade(cuda: acs.Driver, vk: VulkanDevice) -> None:
    va = vk.create_timeline_semaphore()
    a = import_vk(va, cuda)
    async with acs.open_stream(driver=cuda) as s:
        threading.Timer(0.02, va.signal, (3,)).start()
        t0 = time.perf_counter()
        with anyio.fail_after(10):
            await acs.wait_external_semaphores([acs.Wait(a, 3)], s)
        assert time.perf_counter() - t0 >= 0.015
    await a.aclose()
    va.close()


async def test_host_side_awaits(cuda: acs.Driver, vk: VulkanDevice) -> None:
    vt = vk.create_timeline_semaphore()
    vb = vk.create_binary_semaphore()
    t, b = import_vk(vt, cuda), import_vk(vb, cuda)
    threading.Timer(0.02, vt.signal, (9,)).start()
    with anyio.fail_after(10):
        await t.wait_value(9)
    assert vt.value == 9
    vb.submit_signal()
    with anyio.fail_after(10):
        await b.wait_signaled()
    # A cancelled host wait neither hangs nor breaks the next one.
    with anyio.move_on_after(0.01):
        await t.wait_value(20)
    vt.signal(20)
    with anyio.fail_after(10):
        await t.wait_value(20)
    await t.aclose()
    await b.aclose()
    vk.block_until_idle()
    vt.close()
    vb.close()


async def test_handoff_with_a_kernel_reading_the_producer_buffer(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    words = 4096
    vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    ready, done = import_vk(vready, cuda), import_vk(vdone, cuda)
    buf = workloads(cuda).alloc_pinned(words * 4)
    out = workloads(cuda).alloc_pinned(4 * 8)
    try:
        data = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(buf))
        res = np.ctypeslib.as_array((ctypes.c_uint32 * 8).from_address(out))
        res[:] = 0
        async with acs.open_stream(driver=cuda) as s:
            for n in (1, 2, 3):
                data[:] = [frame_word(n, i) for i in range(words)]
                vready.signal(n)
                async with s.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                    workloads(cuda).launch_check_frame(s.handle, buf, words, n, out)
                assert vdone.value == n  # signalled before the coroutine resumed
            assert list(res[1:4]) == [SEEN] * 3
            # A frame that is wrong is caught: the kernel really reads the buffer.
            data[5] ^= 1
            vready.signal(4)
            async with s.handoff(acs.Wait(ready, 4), acs.Signal(done, 4)):
                workloads(cuda).launch_check_frame(s.handle, buf, words, 4, out)
            assert res[4] == SEEN + words  # frame 3's words are all wrong for frame 4
    finally:
        workloads(cuda).free_pinned(buf)
        workloads(cuda).free_pinned(out)
    await ready.aclose()
    await done.aclose()
    vready.close()
    vdone.close()


async def test_cancel_mid_wait_then_stream_and_fds_fine(cuda: acs.Driver) -> None:
    current_notifier()
    # CUDA opens its device files with the first context and stream of the process: let that
    # happen before the count, so that this test counts only what the wait itself might leak
    # (it runs first when the suite is filtered).
    async with acs.open_stream(driver=cuda) as warm:
        await warm.wait_complete()
    fds = open_fds()
    async with acs.open_stream(driver=cuda) as s:
        workloads(cuda).launch_spin(s.handle, 200 * MS)
        with anyio.move_on_after(0.02) as scope:
            await s.wait_complete()
        assert scope.cancelled_caught
        workloads(cuda).launch_spin(s.handle, MS)
        with anyio.fail_after(10):
            await s.wait_complete()
    assert open_fds() == fds


async def test_ten_thousand_awaiters_on_64_streams(cuda: acs.Driver) -> None:
    fds = open_fds()
    streams = [acs.open_stream(driver=cuda) for _ in range(64)]
    woke = 0

    async def waiter(s: acs.Stream) -> None:
        nonlocal woke
        await s.wait_complete()
        woke += 1

    for s in streams:
        workloads(cuda).launch_spin(s.handle, 50 * MS)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(10_000):
                tg.start_soon(waiter, streams[i % 64])
    assert woke == 10_000
    for s in streams:
        await s.aclose()
    assert len(open_fds() - fds) <= 1


def test_failed_import_leaves_fd_open(cuda: acs.Driver) -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(acs.CudaError):
            acs.import_semaphore(acs.HandleType.OPAQUE_FD, r, driver=cuda)
        os.fstat(r)  # still ours
    finally:
        os.close(r)
        os.close(w)


def test_unsupported_types_are_clear(cuda: acs.Driver) -> None:
    with pytest.raises(acs.UnsupportedHandleTypeError):
        acs.import_semaphore(acs.HandleType.D3D12_FENCE, 0x10, driver=cuda)
    with pytest.raises((acs.UnsupportedHandleTypeError, acs.CudaError)):
        acs.import_semaphore(acs.HandleType.NVSCISYNC, 0x1000, driver=cuda)


def test_the_wait_path_calls_are_c_and_translate_errors(cuda: acs.Driver) -> None:
    """The real driver's wait-path methods are the C functions of _cucalls; a failure comes back
    as the library's error, with CUDA's status and name."""
    for name in ("event_record", "event_query", "stream_query", "stream_wait_event"):
        assert type(getattr(cuda, name)).__name__ == "builtin_function_or_method", name
    with pytest.raises(acs.CudaError) as info:
        cuda.event_query(0)  # NULL: the driver refuses it
    assert info.value.status == 400
    assert info.value.name == "CUDA_ERROR_INVALID_HANDLE"
    assert "cuEventQuery" in str(info.value)
    s = cuda.stream_create(0, True, 0)
    try:
        with pytest.raises(acs.CudaError) as info:
            cuda.stream_wait_event(s, 0)
        assert info.value.status == 400
        with pytest.raises(ValueError, match="NULL"):
            cuda.launch_host_func(s, 0, 0)
        with pytest.raises(TypeError):
            cuda.event_record("event", s)  # type: ignore[arg-type]
        assert cuda.stream_query(s)
    finally:
        cuda.stream_destroy(s)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() with threads
def test_a_forked_child_refuses_the_c_calls_taken_before_the_fork(cuda: acs.Driver) -> None:
    """A wait path that held the C query across the fork (a spinning coroutine does) must get
    the driver's fork error in the child, not call CUDA with the parent's handles."""
    from tests.conftest import wait_for_child

    query = cuda.event_query
    ev = cuda.event_create(0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 10
        try:
            query(ev)
        except acs.DriverUnavailableError as exc:
            code = 0 if "fork" in str(exc) else 11
        except BaseException:
            code = 12
        os._exit(code)
    assert wait_for_child(pid, 30) == 0
    cuda.event_destroy(ev)
    assert cuda.event_query is query  # the parent's calls are untouched


def test_bad_device_ordinal(cuda: acs.Driver) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        acs.open_stream(cuda.device_count(), driver=cuda)


_TRAP_SCRIPT = """
import anyio, sys, time
import aiocudasem as acs
from aiocudasem.testing import workloads
drv = acs.get_driver("cuda")
async def main():
    s = acs.open_stream(driver=drv)
    workloads(drv).launch_spin(s.handle, 30_000_000)
    workloads(drv).launch_trap(s.handle)
    errors = []
    async def wait():
        try:
            await s.wait_complete()
        except acs.DeviceFaultError as exc:
            errors.append(exc.status)
    t0 = time.perf_counter()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(wait)
    took = round(time.perf_counter() - t0, 3)
    print("woke", len(errors), "statuses", sorted(set(errors)), "after", took)
    assert len(errors) == 5, errors
anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_trapping_kernel_wakes_waiters_with_an_error(backend: str) -> None:
    # A trap poisons the whole context, so it runs in a process of its own.
    proc = run_script(_TRAP_SCRIPT, backend)
    assert "woke 5" in proc.stdout


_OTHER_STREAM_TRAP_SCRIPT = """
import anyio, logging, sys, time
import aiocudasem as acs
logging.basicConfig(level=logging.INFO, format="log: %(levelname)s %(name)s: %(message)s")
from aiocudasem.testing import workloads
from aiocudasem.vulkan import VulkanDevice
# A fault must reach parked waiters without any periodic check: the watchdog's period is 30 s,
# so only its thread, asleep in cuEventSynchronize behind the parked work, can see it in time.
acs.configure(watchdog=30, spin_limit=0)
drv = acs.get_driver("cuda")
print("module loading", drv.module_loading_mode())
work = workloads(drv)  # before the first wait, so that its kernels load ahead of it
vk = VulkanDevice.open(drv.device_uuid(0))
vsem = vk.create_timeline_semaphore(0)
sem = acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, vsem.export_fd(), driver=drv)
async def main():
    waiting = acs.open_stream(driver=drv)
    waiting.enqueue_wait(acs.Wait(sem, 1))  # Vulkan never signals it
    trapping = acs.open_stream(driver=drv)
    workloads(drv).launch_spin(trapping.handle, 1_000)
    await trapping.wait_complete()  # the trap kernel's module is loaded before anything waits
    errors = []
    async def wait():
        try:
            await waiting.wait_complete()
        except acs.DeviceFaultError as exc:
            errors.append(exc.status)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(wait)
            await anyio.sleep(0.5)  # parked, and the watchdog thread asleep behind them
            t0 = time.perf_counter()
            workloads(drv).launch_trap(trapping.handle)
    took = time.perf_counter() - t0
    print("woke", len(errors), "statuses", sorted(set(errors)), f"after {took:.3f} s")
    assert len(errors) == 5, errors
    # The driver itself takes about 0.35 s to report a trap (an event query loop sees it no
    # sooner); a periodic check would take up to 30 s here.
    assert took < 2.0, took
anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_trap_on_another_stream_wakes_waiters_parked_on_a_semaphore(backend: str) -> None:
    proc = run_script(_OTHER_STREAM_TRAP_SCRIPT, backend)
    assert "woke 5" in proc.stdout, proc.stdout
    # The log records on the real driver: the fault once (five waiters, one device), and under
    # lazy loading the advice once, at the first semaphore wait.
    records = [line for line in proc.stderr.splitlines() if line.startswith("log: ")]
    faults = [r for r in records if r.startswith("log: ERROR aiocudasem: device 0 of the cuda ")]
    assert len(faults) == 1, proc.stderr
    assert "waits on it fail with DeviceFaultError" in faults[0]
    lazy = [r for r in records if "CUDA loads modules lazily" in r]
    assert len(lazy) == (1 if "module loading lazy" in proc.stdout else 0), proc.stderr
    assert all(r.startswith("log: WARNING aiocudasem: ") for r in lazy)


async def test_demo_on_the_gpu_with_vulkan(cuda: acs.Driver) -> None:
    from aiocudasem.cli.demo import run_demo

    lines: list[str] = []
    result = await run_demo(cuda, frames=120, say=lines.append)
    assert result.frames == 120
    assert any("Vulkan" in line for line in lines)
    assert any("real GPU" in line for line in lines)
