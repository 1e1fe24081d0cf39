"""The demo pipeline: an external producer hands frames to GPU consumers through timeline
semaphores, and coroutines await each hand-off.

- The producer (a host thread, as a camera or renderer thread would be) writes frame n into
  one of ``buffers`` pinned buffers and signals n on the ``ready`` timeline semaphore. On a
  GPU it is Vulkan (host signals and empty queue submissions, alternately); on the simulated
  device it is the simulator's producer handle.
- Consumer coroutines take frames round-robin. Each runs a hand-off section on its own stream:
  the GPU waits for ``ready >= n``, a kernel checks every word of the frame, and the stream
  signals ``done_k = n`` back; the coroutine awaits that.
- Before it overwrites a buffer, the producer waits for the consumer's ``done`` signal of the
  frame that used it last.

Every frame is verified on the GPU and checked again on the host at the end, so an ordering
bug (the GPU reading too early, or the producer overwriting too soon) fails loudly.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import anyio
import numpy as np

from ._driver import Driver, get_driver
from ._errors import AiocudasemError, DriverUnavailableError
from ._handles import HandleType
from ._semaphore import ExternalSemaphore, Signal, Wait, import_semaphore
from ._stream import Stream, open_stream
from .testing import SEEN, frame_words, workloads


class _Producer(Protocol):
    def signal(self, value: int) -> None: ...
    def block_until(self, value: int, timeout: float | None = None) -> bool: ...
    def export_fd(self) -> int: ...


@dataclass
class DemoResult:
    driver: str
    frames: int
    latencies_us: list[float]
    elapsed_s: float


def pick_driver(name: str | None, say: Callable[[str], None]) -> Driver:
    """The demo's driver: the one asked for, else the real GPU, else (saying so) the sim."""
    if name is not None:
        return get_driver(name)
    try:
        return get_driver()
    except DriverUnavailableError as exc:
        say(f"no usable CUDA GPU: {exc.reason}")
        say("falling back to the SIMULATED device; pass --driver cuda to insist on a GPU")
        return get_driver("sim")


@contextlib.contextmanager
def _producers(
    driver: Driver, device: int, consumers: int, say: Callable[[str], None]
) -> Iterator[tuple[str, _Producer, list[_Producer], Callable[[int, _Producer], None]]]:
    """Yield (description, ready, done list, signal_ready)."""
    if driver.simulated:
        from ._driver._sim import SimDriver

        assert isinstance(driver, SimDriver)
        ready = driver.create_semaphore()
        done: list[_Producer] = [driver.create_semaphore() for _ in range(consumers)]

        def signal_sim(n: int, sem: _Producer) -> None:
            sem.signal(n)

        yield "simulated producer (host thread, sim semaphores)", ready, done, signal_sim
        return
    from .vulkan import VulkanDevice

    with VulkanDevice.open(uuid=driver.device_uuid(device)) as vk:
        vready = vk.create_timeline_semaphore()
        vdone: list[_Producer] = [vk.create_timeline_semaphore() for _ in range(consumers)]

        def signal_vk(n: int, sem: _Producer) -> None:
            # Alternate a host signal and an empty queue submission, as a renderer would.
            if n % 2:
                # Vulkan forbids a host signal below a pending queue signal
                # (VUID-VkSemaphoreSignalInfo-value-03259): let the last one land first.
                if n > 1 and not sem.block_until(n - 1, timeout=10.0):
                    raise RuntimeError(f"Vulkan's queue signal of frame {n - 1} never landed")
                sem.signal(n)
            else:
                sem.submit_signal(n)  # type: ignore[attr-defined]

        try:
            yield f"Vulkan on {vk.name} (device UUID matched)", vready, vdone, signal_vk
        finally:
            vk.block_until_idle()


def _import(driver: Driver, device: int, producer: _Producer) -> ExternalSemaphore:
    fd = producer.export_fd()
    try:
        return import_semaphore(HandleType.TIMELINE_SEMAPHORE_FD, fd, device=device, driver=driver)
    except BaseException:
        os.close(fd)  # a failed import leaves the fd ours
        raise


async def run_demo(
    driver: Driver,
    *,
    frames: int = 240,
    consumers: int = 4,
    buffers: int = 4,
    words: int = 16384,
    device: int = 0,
    say: Callable[[str], None] = print,
    wait_for_reuse: bool = True,
    give_up_after: float | None = None,
) -> DemoResult:
    """Run the pipeline and verify every frame; give up after ``give_up_after`` seconds (default:
    generous for ``frames``). ``wait_for_reuse=False`` breaks the producer's side of the
    protocol on purpose (tests use it to prove the check fails)."""
    if not 1 <= consumers <= 64 or not 1 <= buffers <= 64 or frames < 1:
        raise ValueError("need frames >= 1 and 1..64 consumers and buffers")
    if not 0 < words < SEEN:
        raise ValueError(f"words must be in [1, {SEEN})")
    kind = "SIMULATED device" if driver.simulated else f"real GPU: {driver.device_name(device)}"
    say(f"driver: {driver.name} ({kind}), device {device}")
    nbytes = buffers * words * 4
    work = workloads(driver)
    buf_ptr = work.alloc_pinned(nbytes)
    out_ptr = work.alloc_pinned(4 * (frames + 1))
    try:
        bufs = np.ctypeslib.as_array((ctypes.c_uint32 * (buffers * words)).from_address(buf_ptr))
        bufs = bufs.reshape(buffers, words)
        out = np.ctypeslib.as_array((ctypes.c_uint32 * (frames + 1)).from_address(out_ptr))

        def warm_up() -> None:
            # Load (on a GPU: compile) the kernel before any frame is timed. Frame 0 is unused.
            stream = driver.stream_create(device, True, 0)
            try:
                work.launch_check_frame(stream, buf_ptr, words, 0, out_ptr)
                driver.stream_synchronize(stream)
            finally:
                driver.stream_destroy(stream)

        await anyio.to_thread.run_sync(warm_up)
        out[:] = 0
        with _producers(driver, device, consumers, say) as (desc, ready, done, signal_ready):
            say(f"producer: {desc}")
            say(
                f"{frames} frames of {words} words through {buffers} pinned buffers, "
                f"{consumers} consumer coroutines on their own streams"
            )
            return await _pipeline(
                driver,
                device,
                frames,
                consumers,
                buffers,
                words,
                bufs,
                buf_ptr,
                out_ptr,
                out,
                ready,
                done,
                signal_ready,
                say,
                wait_for_reuse,
                max(60.0, frames * 0.05) if give_up_after is None else give_up_after,
            )
    finally:
        work.free_pinned(buf_ptr)
        work.free_pinned(out_ptr)


async def _pipeline(
    driver: Driver,
    device: int,
    frames: int,
    consumers: int,
    buffers: int,
    words: int,
    bufs: np.ndarray,
    buf_ptr: int,
    out_ptr: int,
    out: np.ndarray,
    ready: _Producer,
    done: list[_Producer],
    signal_ready: Callable[[int, _Producer], None],
    say: Callable[[str], None],
    wait_for_reuse: bool,
    give_up_after: float,
) -> DemoResult:
    work = workloads(driver)
    ready_sem = _import(driver, device, ready)
    done_sems: list[ExternalSemaphore] = []
    streams: list[Stream] = []
    ok = False
    try:
        for d in done:
            done_sems.append(_import(driver, device, d))
        streams = [open_stream(device, driver=driver) for _ in range(consumers)]
        signalled = [0.0] * (frames + 1)
        resumed = [0.0] * (frames + 1)
        stop = threading.Event()
        failure: list[BaseException] = []

        def produce() -> None:
            try:
                for n in range(1, frames + 1):
                    reuse = n - buffers  # the frame that used this buffer last
                    if reuse >= 1 and wait_for_reuse:
                        owner = done[(reuse - 1) % consumers]  # consumer k has k+1, k+1+K, ...
                        while not owner.block_until(reuse, timeout=0.1):
                            if stop.is_set():
                                return
                    bufs[n % buffers] = frame_words(n, words)
                    signalled[n] = time.perf_counter()
                    signal_ready(n, ready)
            except BaseException as exc:
                failure.append(exc)

        async def consume(k: int) -> None:
            stream = streams[k]
            for n in range(k + 1, frames + 1, consumers):
                slot = buf_ptr + (n % buffers) * words * 4
                async with stream.handoff(Wait(ready_sem, n), Signal(done_sems[k], n)):
                    work.launch_check_frame(stream.handle, slot, words, n, out_ptr)
                resumed[n] = time.perf_counter()
                if n % max(1, frames // 8) == 0 or n == frames:
                    say(f"  frame {n:>5}/{frames} handed back")

        thread = threading.Thread(target=produce, name="aiocudasem-demo-producer", daemon=True)
        start = time.perf_counter()
        thread.start()
        try:
            with anyio.fail_after(give_up_after):
                async with anyio.create_task_group() as tg:
                    for k in range(consumers):
                        tg.start_soon(consume, k)
        finally:
            stop.set()
            await anyio.to_thread.run_sync(thread.join, 10.0)
        elapsed = time.perf_counter() - start
        if failure:
            raise RuntimeError(f"the producer failed: {failure[0]!r}") from failure[0]
        bad = [n for n in range(1, frames + 1) if int(out[n]) != SEEN]
        if bad:
            n = bad[0]
            raise RuntimeError(
                f"{len(bad)} frame(s) failed verification, first frame {n}: "
                f"{int(out[n]) & 0xFFFF} bad words, checked {int(out[n]) >> 16} time(s)"
            )
        lat = [(resumed[n] - signalled[n]) * 1e6 for n in range(1, frames + 1)]
        ok = True
        return DemoResult(driver.name, frames, lat, elapsed)
    finally:
        with anyio.CancelScope(shield=True):
            if not ok:
                # GPU waits for frames that never came would outlive us, and CUDA forbids
                # destroying a semaphore with waits outstanding: release them first.
                _release(ready, frames)
            drained = True
            with anyio.move_on_after(5 if ok else 1):
                for st in streams:
                    with contextlib.suppress(AiocudasemError):
                        await st.wait_complete()
            for st in streams:
                with contextlib.suppress(AiocudasemError):  # a fault took them all anyway
                    drained &= st.query()
                st.close()
            for sem in [ready_sem, *done_sems]:
                if drained:
                    await sem.aclose()
                else:
                    # CUDA forbids destroying a semaphore that a GPU wait still uses; a leak
                    # is the safe choice when the producer cannot be released.
                    sem.detach()


def _release(ready: _Producer, frames: int) -> None:
    with contextlib.suppress(Exception):
        vk_device = getattr(ready, "device", None)  # Vulkan: let pending queue signals land
        if vk_device is not None:
            vk_device.block_until_idle()
        if ready.value < frames:  # type: ignore[attr-defined]
            ready.signal(frames)


def report(result: DemoResult, say: Callable[[str], None] = print) -> None:
    lat = sorted(result.latencies_us)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else lat * 99
    say(
        f"all {result.frames} frames verified: each was read by the GPU after its producer "
        "signal and before its buffer was reused"
    )
    say(
        "latency, producer signal -> consumer coroutine resumed (GPU wait + kernel + signal + "
        f"await): median {statistics.median(lat):.0f} us, p90 {q[89]:.0f} us, "
        f"p99 {q[98]:.0f} us, max {lat[-1]:.0f} us"
    )
    say(f"throughput: {result.frames / result.elapsed_s:.0f} frames/s")
    where = "the SIMULATED device" if result.driver == "sim" else "the real GPU"
    say(f"ran on {where} (driver '{result.driver}')")


def main(
    driver_name: str | None,
    backend: str,
    frames: int,
    consumers: int,
    buffers: int,
    words: int,
) -> int:
    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        driver = pick_driver(driver_name, say)

        async def go() -> DemoResult:
            return await run_demo(
                driver, frames=frames, consumers=consumers, buffers=buffers, words=words, say=say
            )

        say(f"event loop: {backend}")
        name, _, opt = backend.partition("+")
        result = anyio.run(go, backend=name, backend_options={"use_uvloop": True} if opt else {})
    except (AiocudasemError, RuntimeError, ValueError, TimeoutError) as exc:
        print(f"demo FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    report(result, say)
    return 0
