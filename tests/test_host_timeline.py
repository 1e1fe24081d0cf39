"""Host timelines on the simulated device: a CPU thread (or another process) signals, the GPU
waits; the GPU signals, the host awaits; and the usual rules for bad input, closing and
cancellation. The simulated GPU watches the real shared page, so a value stored by another
thread or process reaches it as it reaches a GPU: by the stream looking at the word."""

from __future__ import annotations

import fcntl
import gc
import itertools
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import open_fds

pytestmark = pytest.mark.anyio


def released(sim: SimDriver, timeline: acs.HostTimeline, timeout: float = 10.0) -> bool:
    """Whether the timeline's page is unregistered from ``sim`` within ``timeout``."""
    address = timeline._page.address
    deadline = time.monotonic() + timeout
    while True:
        with sim._lock:
            if address not in sim._words:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


async def test_a_cpu_thread_hands_frames_to_the_gpu(sim: SimDriver) -> None:
    """The producer thread writes frame n into a ring slot and signals ready = n; each frame's
    kernel, behind Wait(ready, n), checks the slot it reads; the stream signals done = n, and
    the producer reuses a slot only once its frame is done."""
    frames, ring, words = 300, 4, 64
    slots = np.zeros((ring, words), dtype=np.uint64)
    bad: list[int] = []
    ready = acs.create_host_timeline(driver=sim)
    done = acs.create_host_timeline(driver=sim)

    def producer() -> None:
        for n in range(1, frames + 1):
            while done.value < n - ring:  # the slot's previous frame is still in use
                time.sleep(0.0002)
            slots[n % ring] = np.arange(words, dtype=np.uint64) + n * 1000
            ready.signal(n)

    def check(n: int) -> None:
        if not (slots[n % ring] == np.arange(words, dtype=np.uint64) + n * 1000).all():
            bad.append(n)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    async with ready, done, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(30):
            for n in range(1, frames + 1):
                async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                    sim.launch(stream.handle, lambda n=n: check(n))
                assert done.value == n
    thread.join(5)
    assert bad == []
    assert released(sim, ready) and released(sim, done)


async def test_a_gpu_signal_wakes_a_host_wait(sim: SimDriver) -> None:
    async with acs.create_host_timeline(driver=sim) as t, acs.open_stream(driver=sim) as s:
        gate = hold(s)
        s.enqueue_signal(acs.Signal(t, 7))
        with anyio.move_on_after(0.2) as scope:
            await t.wait_value(7)
        assert scope.cancelled_caught and t.value == 0
        gate.set()
        with anyio.fail_after(10):
            await t.wait_value(7)
            await t.wait_value(3)  # reached already
        assert t.value == 7


async def test_a_host_signal_releases_a_gpu_wait_and_the_stream_behind_it(
    sim: SimDriver,
) -> None:
    async with acs.create_host_timeline(5, driver=sim) as t, acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(t, 5))  # satisfied by the initial value
        with anyio.fail_after(10):
            await s.wait_complete()
        s.enqueue_wait(acs.Wait(t, 6))
        await anyio.sleep(0.05)
        assert not s.query()
        threading.Timer(0.05, t.signal, (6,)).start()
        with anyio.fail_after(10):
            await s.wait_complete()


async def test_waits_and_signals_of_both_kinds_mix_in_one_section(sim: SimDriver) -> None:
    ext_ready, producer = import_sim_semaphore(sim)
    ext_done, ext_done_producer = import_sim_semaphore(sim)
    tl_ready = acs.create_host_timeline(driver=sim)
    tl_done = acs.create_host_timeline(driver=sim)
    async with ext_ready, ext_done, tl_ready, tl_done, acs.open_stream(driver=sim) as s:
        for n in range(1, 21):
            producer.signal(n)
            tl_ready.signal(n)
            with anyio.fail_after(10):
                async with s.handoff(
                    [acs.Wait(ext_ready, n), acs.Wait(tl_ready, n)],
                    [acs.Signal(ext_done, n), acs.Signal(tl_done, n)],
                ):
                    pass
            assert ext_done_producer.value == n and tl_done.value == n
        # The async form of the waits takes host timelines too.
        tl_ready.signal(21)
        with anyio.fail_after(10):
            await acs.wait_external_semaphores([acs.Wait(tl_ready, 21)], s)


async def test_a_section_waits_for_the_host_signal(sim: SimDriver) -> None:
    """Nothing after a Wait runs before the value arrives: the kernel sees the signal."""
    seen: list[int] = []
    async with acs.create_host_timeline(driver=sim) as t, acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(t, 1))
        sim.launch(s.handle, lambda: seen.append(t.value))
        await anyio.sleep(0.05)
        assert seen == []
        t.signal(1)
        with anyio.fail_after(10):
            await s.wait_complete()
        assert seen == [1]


async def test_a_cancelled_host_wait_holds_nothing_back(sim: SimDriver) -> None:
    t = acs.create_host_timeline(driver=sim)
    with anyio.move_on_after(0.05) as scope:
        await t.wait_value(3)
    assert scope.cancelled_caught
    # The abandoned GPU wait keeps the page until the value comes; then the release ends.
    t.signal(3)
    with anyio.fail_after(10):
        await t.aclose()
    assert released(sim, t, 0)


async def test_the_release_waits_for_a_pending_gpu_wait(sim: SimDriver) -> None:
    """Unmapping the page under a GPU wait would fault the device: the release waits."""
    t = acs.create_host_timeline(driver=sim)
    twin = acs.open_host_timeline(t.export_fd(), driver=sim)  # signals it once t is closed
    async with acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(t, 1))
        with anyio.move_on_after(0.2) as scope:
            await t.aclose()
        assert scope.cancelled_caught and t.closed
        assert not released(sim, t, 0.1)
        twin.signal(1)
        assert released(sim, t)
        with anyio.fail_after(10):
            await s.wait_complete()
    await twin.aclose()
    sim.check_health(0)  # no fault: the page was never pulled from under the wait


async def test_a_timeline_never_goes_back(sim: SimDriver) -> None:
    async with acs.create_host_timeline(10, driver=sim) as t:
        t.signal(10)  # the same value again does nothing
        with pytest.raises(ValueError, match="never goes back"):
            t.signal(9)
        assert t.value == 10
        t.signal(2**63 - 1)
        with pytest.raises(ValueError, match=r"\[0, 2\*\*63\)"):
            t.signal(2**63)
        with pytest.raises(TypeError):
            t.signal(True)
        with pytest.raises(TypeError):
            t.signal(1.0)  # type: ignore[arg-type]


_SIGNALLER = """
import sys
import aiocudasem as acs
from aiocudasem.testing import SimDriver

t = acs.open_host_timeline(int(sys.argv[1]), driver=SimDriver())
for v in range(int(sys.argv[2]), 200_000, 2):
    try:
        t.signal(v)
    except ValueError:
        pass  # the other process got further: refused, never stored
t.close()
"""


def test_signallers_in_two_processes_only_move_it_forward(sim: SimDriver) -> None:
    """Two processes signal interleaved values as fast as they can while this one watches:
    the value never goes back, and ends at the highest. Within one process the GIL would
    serialise the signals; across processes only the compare-and-swap keeps them in order."""
    t = acs.create_host_timeline(driver=sim)
    fds = [t.export_fd() for _ in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SIGNALLER, str(fd), str(start)], pass_fds=[fd], env=env
        )
        for fd, start in zip(fds, (0, 1), strict=True)
    ]
    for fd in fds:
        os.close(fd)
    seen = [0]
    while any(p.poll() is None for p in procs):
        seen.append(t.value)
    for p in procs:
        assert p.wait(60) == 0
    seen.append(t.value)
    assert all(a <= b for a, b in itertools.pairwise(seen))
    assert seen[-1] == 199_999
    t.close()


async def test_entries_are_checked_when_made(sim: SimDriver) -> None:
    async with acs.create_host_timeline(driver=sim) as t:
        with pytest.raises(TypeError, match="needs the value to wait for"):
            acs.Wait(t)
        with pytest.raises(TypeError, match="needs the value to set"):
            acs.Signal(t)
        with pytest.raises(ValueError, match=r"\[0, 2\*\*63\)"):
            acs.Wait(t, 2**63)
        with pytest.raises(ValueError, match="do not apply"):
            acs.Wait(t, 1, key=3)
        with pytest.raises(ValueError, match="keyed mutexes only"):
            acs.Wait(t, 1, timeout_ms=5)
        with pytest.raises(ValueError, match="NVSCISYNC"):
            acs.Signal(t, 1, skip_nvscibuf_memsync=True)
        with pytest.raises(TypeError, match="ExternalSemaphore or a HostTimeline"):
            acs.Wait(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(anyio.ClosedResourceError):
        acs.Wait(t, 1)


async def test_a_closed_timeline_refuses_everything(sim: SimDriver) -> None:
    t = acs.create_host_timeline(driver=sim)
    entry = acs.Signal(t, 1)
    await t.aclose()
    await t.aclose()  # idempotent
    assert "closed" in repr(t)
    for call in (lambda: t.value, lambda: t.signal(1), t.export_fd, lambda: t.handle):
        with pytest.raises(anyio.ClosedResourceError):
            call()
    with pytest.raises(anyio.ClosedResourceError):
        await t.wait_value(1)
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(anyio.ClosedResourceError):
            s.enqueue_signal(entry)  # made before the close
        with pytest.raises(anyio.ClosedResourceError):
            async with t:
                pass


async def test_a_timeline_of_another_device_or_driver_is_refused(sim: SimDriver) -> None:
    other = SimDriver()
    async with (
        acs.create_host_timeline(device=1, driver=sim) as t1,
        acs.create_host_timeline(driver=other) as foreign,
        acs.open_stream(0, driver=sim) as s,
    ):
        with pytest.raises(acs.DeviceMismatchError, match="open the host timeline"):
            s.enqueue_wait(acs.Wait(t1, 1))
        with pytest.raises(acs.DeviceMismatchError, match="driver object at"):
            s.enqueue_signal(acs.Signal(foreign, 1))


def test_a_device_without_stream_memory_operations_is_refused() -> None:
    before = open_fds()
    sim = SimDriver(stream_mem_ops=False)
    with pytest.raises(acs.UnsupportedFeatureError, match="64-bit stream memory operations"):
        acs.create_host_timeline(driver=sim)
    assert open_fds() == before  # the page's fd and map are gone again
    with pytest.raises(TypeError):
        SimDriver(stream_mem_ops=1)  # type: ignore[arg-type]


def test_bad_arguments_are_refused(sim: SimDriver) -> None:
    with pytest.raises(TypeError):
        acs.create_host_timeline("1", driver=sim)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*63\)"):
        acs.create_host_timeline(-1, driver=sim)
    with pytest.raises(ValueError, match="does not exist"):
        acs.create_host_timeline(device=2, driver=sim)
    with pytest.raises(TypeError):
        acs.create_host_timeline(device=True, driver=sim)
    with pytest.raises(TypeError):
        acs.HostTimeline()


def test_open_refuses_an_fd_that_is_not_a_timeline_and_leaves_it_open(sim: SimDriver) -> None:
    with pytest.raises(TypeError):
        acs.open_host_timeline("3", driver=sim)  # type: ignore[arg-type]
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(ValueError, match="not an open file descriptor"):
        acs.open_host_timeline(w, driver=sim)
    with tempfile.TemporaryFile() as f:
        f.truncate(mmap.PAGESIZE)
        with pytest.raises(ValueError, match="not sealed"):
            acs.open_host_timeline(f.fileno(), driver=sim)
        os.fstat(f.fileno())  # still open
    with pytest.raises(ValueError, match="not a file of"):
        acs.open_host_timeline(r, driver=sim)
    os.close(r)
    # A sealed page without the marker: the right shape, not a timeline.
    fd = os.memfd_create("not-a-timeline", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, mmap.PAGESIZE)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    with pytest.raises(ValueError, match="marker"):
        acs.open_host_timeline(fd, driver=sim)
    os.close(fd)


def test_open_refuses_an_fd_out_of_range_or_not_open_for_reading_and_writing(
    sim: SimDriver,
) -> None:
    for bad in (-1, 2**31, 2**40):
        with pytest.raises(ValueError, match=r"fd must be in \[0, 2\*\*31\)"):
            acs.open_host_timeline(bad, driver=sim)
    t = acs.create_host_timeline(3, driver=sim)
    fd = t.export_fd()
    before = open_fds()
    for flags in (os.O_RDONLY, os.O_WRONLY):
        # The same page, reopened with one access mode only: it passes every other check.
        other = os.open(f"/proc/self/fd/{fd}", flags)
        try:
            with pytest.raises(ValueError, match="not open for reading and writing"):
                acs.open_host_timeline(other, driver=sim)
            os.fstat(other)  # the caller's fd is left open
        finally:
            os.close(other)
    assert open_fds() == before
    os.close(fd)
    t.close()


async def test_an_exported_page_is_shared_and_owned_once_opened(sim: SimDriver) -> None:
    before = open_fds()
    t = acs.create_host_timeline(4, driver=sim)
    fd = t.export_fd()
    assert not os.get_inheritable(fd)
    twin = acs.open_host_timeline(fd, device=1, driver=sim)
    assert twin.value == 4 and twin.device == 1
    twin.signal(9)
    assert t.value == 9
    await t.aclose()
    assert twin.value == 9  # the page outlives the other end's release
    await twin.aclose()
    with pytest.raises(OSError):
        os.fstat(fd)  # the timeline owned it, and closed it
    assert open_fds() == before


def test_a_collected_timeline_is_released_with_a_warning(sim: SimDriver) -> None:
    before = open_fds()
    t = acs.create_host_timeline(driver=sim)
    address = t._page.address
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del t
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    acs.open_stream(driver=sim).close()  # the library's next use releases it
    deadline = time.monotonic() + 10
    while (address in sim._words or open_fds() != before) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert address not in sim._words
    assert open_fds() == before


async def test_a_fault_under_a_pending_wait_still_releases_the_page(sim: SimDriver) -> None:
    before = open_fds()
    t = acs.create_host_timeline(driver=sim)
    s = acs.open_stream(driver=sim)
    s.enqueue_wait(acs.Wait(t, 1))
    sim.inject_fault(0)
    with anyio.fail_after(10):
        await t.aclose()  # the device's context is gone: nothing can still read the page
    s.close()
    assert open_fds() == before
    assert released(sim, t, 0)  # the simulator lets a faulted context unregister it


async def test_a_failure_before_the_operation_leaves_nothing_unfenced(sim: SimDriver) -> None:
    """The timeline's event for a stream is made before the operation is enqueued: if making
    it fails, nothing was enqueued, and the release cannot pull the page from under a wait."""
    t = acs.create_host_timeline(driver=sim)
    create = sim.event_create

    def refuse(*args: object, **kwargs: object) -> int:
        raise acs.CudaError("cuEventCreate failed [test]", 2, "CUDA_ERROR_OUT_OF_MEMORY")

    async with acs.open_stream(driver=sim) as s:
        sim.event_create = refuse  # type: ignore[method-assign]
        try:
            with pytest.raises(acs.CudaError, match="test"):
                s.enqueue_wait(acs.Wait(t, 1))
        finally:
            sim.event_create = create  # type: ignore[method-assign]
        with anyio.fail_after(10):
            await t.aclose()
            await s.wait_complete()  # nothing was left waiting on the stream
    sim.check_health(0)


async def test_many_timelines_leak_no_fd(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        await s.wait_complete()  # the loop's notifier (its fd lives with the loop) exists now
        before = open_fds()
        for i in range(50):
            async with acs.create_host_timeline(driver=sim) as t:
                s.enqueue_signal(acs.Signal(t, i + 1))
                with anyio.fail_after(10):
                    await t.wait_value(i + 1)
    assert open_fds() == before


def test_a_detached_timeline_keeps_its_page(sim: SimDriver) -> None:
    from aiocudasem import _hostword

    t = acs.create_host_timeline(7, driver=sim)
    address = t._page.address
    assert t.detach() == address  # on the simulated device, the device address is the host's
    assert t.closed
    with pytest.raises(anyio.ClosedResourceError):
        t.detach()
    del t
    gc.collect()
    time.sleep(0.05)
    with sim._lock:
        assert address in sim._words  # still registered
    assert _hostword.load(address) == 7  # and still mapped
