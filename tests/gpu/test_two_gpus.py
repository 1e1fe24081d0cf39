"""The multi-device rules on two real GPUs (the two-device simulator checks them on the CPU).

Skipped, with the reason, on a machine with fewer than two CUDA devices."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import SEEN, frame_word, workloads
from aiocudasem.vulkan import VulkanDevice
from tests.gpu.conftest import import_vk, run_script

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MS = 1_000_000


@pytest.fixture(scope="module")
def two(cuda: acs.Driver) -> acs.Driver:
    if cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA devices; this machine has {cuda.device_count()}")
    return cuda


@pytest.fixture(scope="module")
def vks(two: acs.Driver) -> Iterator[list[VulkanDevice]]:
    """The Vulkan device of each CUDA device, matched by UUID."""
    devs = [VulkanDevice.open(uuid=two.device_uuid(d)) for d in (0, 1)]
    yield devs
    for d in devs:
        d.close()


async def test_vulkan_devices_match_cuda_devices_by_uuid(
    two: acs.Driver, vks: list[VulkanDevice]
) -> None:
    assert [v.uuid for v in vks] == [two.device_uuid(0), two.device_uuid(1)]
    assert vks[0].uuid != vks[1].uuid


async def test_a_device_0_semaphore_on_a_device_1_stream_is_refused_before_enqueueing(
    two: acs.Driver, vks: list[VulkanDevice]
) -> None:
    vsem = vks[0].create_timeline_semaphore()
    sem0 = import_vk(vsem, two, 0)
    assert sem0.device == 0
    async with acs.open_stream(1, driver=two) as s1, acs.open_stream(0, driver=two) as s0:
        with pytest.raises(acs.DeviceMismatchError, match="device 0"):
            s1.enqueue_wait(acs.Wait(sem0, 1))
        with pytest.raises(acs.DeviceMismatchError, match="device 0"):
            s1.enqueue_signal(acs.Signal(sem0, 1))
        with pytest.raises(acs.DeviceMismatchError):
            async with s1.handoff(acs.Wait(sem0, 1), acs.Signal(sem0, 2)):
                pytest.fail("a hand-off with another device's semaphore was entered")
        with pytest.raises(acs.DeviceMismatchError):
            await acs.wait_external_semaphores([acs.Wait(sem0, 1)], s1)
        # Nothing was enqueued on s1: its work completes although nobody signalled sem0.
        workloads(two).launch_spin(s1.handle, MS)
        with anyio.fail_after(10):
            await s1.wait_complete()
        assert vsem.value == 0
        # Both streams stay usable, and the semaphore works on its own device.
        s0.enqueue_wait(acs.Wait(sem0, 1))
        workloads(two).launch_spin(s0.handle, MS)
        s0.enqueue_signal(acs.Signal(sem0, 2))
        await anyio.sleep(0.02)
        assert not s0.query()
        vsem.signal(1)
        with anyio.fail_after(10):
            await s0.wait_complete()
        assert vsem.value == 2
        workloads(two).launch_spin(s1.handle, MS)
        with anyio.fail_after(10):
            await s1.wait_complete()
    await sem0.aclose()
    vsem.close()


async def test_a_handoff_on_each_device_at_once_from_one_loop(
    two: acs.Driver, vks: list[VulkanDevice]
) -> None:
    """Each device has its own Vulkan producer; one event loop runs a hand-off pipeline on both
    at once, and a kernel on each device checks every frame its producer wrote."""
    frames, words = 200, 1024
    seen: dict[int, list[int]] = {}

    async def pipeline(device: int) -> None:
        vk = vks[device]
        vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        ready, done = import_vk(vready, two, device), import_vk(vdone, two, device)
        buf = workloads(two).alloc_pinned(words * 4)
        out = workloads(two).alloc_pinned(4 * (frames + 1))
        try:
            data = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(buf))
            res = np.ctypeslib.as_array((ctypes.c_uint32 * (frames + 1)).from_address(out))
            res[:] = 0
            async with acs.open_stream(device, driver=two) as s:
                assert s.device == device
                for n in range(1, frames + 1):
                    data[:] = [frame_word(n, i) for i in range(words)]
                    vready.signal(n)
                    async with s.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                        workloads(two).launch_check_frame(s.handle, buf, words, n, out)
                    assert vdone.value == n  # signalled before the coroutine resumed
            seen[device] = [int(x) for x in res[1:]]
        finally:
            workloads(two).free_pinned(buf)
            workloads(two).free_pinned(out)
            await ready.aclose()
            await done.aclose()
            vready.close()
            vdone.close()

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline, 0)
            tg.start_soon(pipeline, 1)
    assert seen[0] == [SEEN] * frames
    assert seen[1] == [SEEN] * frames


async def test_an_event_of_device_0_waited_on_by_a_device_1_stream(two: acs.Driver) -> None:
    async with acs.open_stream(0, driver=two) as s0, acs.open_stream(1, driver=two) as s1:
        workloads(two).launch_spin(s0.handle, 300 * MS)
        ev = s0.record()
        s1.enqueue_event_wait(ev)  # across devices: allowed
        workloads(two).launch_spin(s1.handle, MS)
        after = s1.record()
        await anyio.sleep(0.1)
        assert not s1.query()  # device 1 waits for device 0's kernel
        with anyio.fail_after(10):
            await ev.wait()  # the event, awaited from the host
            assert ev.query()
            await after.wait()
        assert ev.query()
        assert s1.query()
        ev.close()
        after.close()


async def test_a_foreign_device_1_stream_is_awaited_while_device_0_is_busy(
    two: acs.Driver,
) -> None:
    torch = pytest.importorskip("torch")
    async with acs.open_stream(0, driver=two) as busy:
        workloads(two).launch_spin(busy.handle, 3_000 * MS)
        with torch.cuda.device(1):
            ts = torch.cuda.Stream()
            a = torch.rand(2048, 2048, device="cuda:1")
            torch.cuda.synchronize(1)
            with torch.cuda.stream(ts):
                for _ in range(20):
                    b = a @ a
        adopted = acs.Stream.adopt(ts, driver=two)
        assert adopted.device == 1 and not adopted.owned
        t0 = time.perf_counter()
        with anyio.fail_after(30):
            await adopted.wait_complete()
        took = time.perf_counter() - t0
        assert ts.query()
        assert not busy.query(), "device 0's 3 s kernel finished: the test proves nothing"
        assert took < 2.0, took
        assert bool(torch.isfinite(b).all())
        await adopted.aclose()

        core = pytest.importorskip("cuda.core")
        dev = core.Device(1)
        dev.set_current()
        cs = dev.create_stream()
        theirs = acs.Stream.adopt(cs, driver=two)
        assert theirs.device == 1
        workloads(two).launch_spin(theirs.handle, 20 * MS)
        with anyio.fail_after(30):
            await theirs.wait_complete()
        assert not busy.query()
        await theirs.aclose()
        cs.close()
        two.stream_synchronize(busy.handle)


_FAULT_SCRIPT = """
import anyio, sys, time
import aiocudasem as acs
from aiocudasem.testing import workloads
acs.configure(spin_limit=0)
drv = acs.get_driver("cuda")
async def main():
    faulting = acs.open_stream(0, driver=drv)
    parked0 = acs.open_stream(0, driver=drv)
    on1 = [acs.open_stream(1, driver=drv) for _ in range(2)]
    for s in (faulting, *on1):
        workloads(drv).launch_spin(s.handle, 1_000)  # the kernels are loaded on both devices first
        await s.wait_complete()
    workloads(drv).launch_spin(parked0.handle, 5_000_000_000)
    for s in on1:
        workloads(drv).launch_spin(s.handle, 3_000_000_000)  # outlasts the fault's spread
    faults, fine = [], []
    async def wait(s, device):
        try:
            await s.wait_complete()
            fine.append(device)
        except acs.DeviceFaultError as exc:
            faults.append((device, exc.status))
    t0 = time.perf_counter()
    with anyio.fail_after(30):  # nobody hangs, whatever the driver decides about device 1
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(wait, parked0, 0)
                for s in on1:
                    tg.start_soon(wait, s, 1)
            await anyio.sleep(0.2)
            workloads(drv).launch_trap(faulting.handle)
    took = time.perf_counter() - t0
    print("faults", sorted(set(faults)), len(faults), "fine", sorted(set(fine)), len(fine),
          f"in {took:.2f} s")
    assert sorted(d for d, _ in faults if d == 0) == [0] * 4, faults
    try:
        drv.check_health(1)
        device1 = "healthy"
    except acs.DeviceFaultError as exc:
        device1 = f"faulted ({exc.name})"
    print("after the trap on device 0, the driver reports device 1", device1)
    if device1 == "healthy":
        # Waiters of a healthy device complete normally, and the device goes on working.
        assert fine == [1] * 8, (faults, fine)
        async with acs.open_stream(1, driver=drv) as s:
            workloads(drv).launch_spin(s.handle, 1_000_000)
            with anyio.fail_after(10):
                await s.wait_complete()
    else:
        # The driver poisoned device 1's context too: its waiters fail the same way, none hangs.
        assert fine == [] and sorted(d for d, _ in faults) == [0] * 4 + [1] * 8, faults
    try:
        acs.open_stream(0, driver=drv)
    except acs.DeviceFaultError:
        print("device 0 refuses new streams")
    else:
        raise AssertionError("device 0 accepted a stream after its fault")
anyio.run(main, backend=sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_fault_on_device_0_wakes_its_waiters_and_device_1_follows_the_driver(
    two: acs.Driver, backend: str
) -> None:
    """Device 0's waiters fail with DeviceFaultError. Device 1's waiters complete normally if
    the driver still reports device 1 healthy, and fail the same way if it reports device 1
    faulted too (an H200 pair with driver 580 does: a trap on one device poisons the primary
    contexts of both). Either way nobody hangs. A fault is for the life of the process: this
    runs in a process of its own."""
    proc = run_script(_FAULT_SCRIPT, backend, timeout=90)
    assert "device 0 refuses new streams" in proc.stdout, proc.stdout
