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
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import numpy as np

from .. import (
    AiocudasemError,
    Driver,
    ExternalSemaphore,
    HandleType,
    Signal,
    Stream,
    Wait,
    import_semaphore,
    open_stream,
)
from ..testing import SEEN, SimDriver, Workloads, frame_words, workloads
from ._common import EXIT_USAGE, CommandError, missing_loop, open_driver


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


@contextlib.contextmanager
def _producers(
    driver: Driver, device: int, consumers: int, say: Callable[[str], None]
) -> Iterator[tuple[str, _Producer, list[_Producer], Callable[[int, _Producer], None]]]:
    """Yield (description, ready, done list, signal_ready)."""
    if isinstance(driver, SimDriver):
        ready = driver.create_semaphore()
        done: list[_Producer] = [driver.create_semaphore() for _ in range(consumers)]

        def signal_sim(n: int, sem: _Producer) -> None:
            sem.signal(n)

        yield "simulated producer (host thread, sim semaphores)", ready, done, signal_sim
        return
    from ..vulkan import VulkanDevice

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


@dataclass(frozen=True, slots=True)
class DemoParams:
    """What the demo pipeline runs. Raises ``ValueError`` for values out of range."""

    frames: int = 240
    consumers: int = 4
    buffers: int = 4
    words: int = 16384  # per frame, uint32
    device: int = 0
    #: False breaks the producer's side of the protocol on purpose: it overwrites a buffer
    #: without waiting for its consumer (tests use it to prove the check fails).
    wait_for_reuse: bool = True
    #: Seconds before the demo gives up; None: generous for ``frames``.
    give_up_after: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.consumers <= 64 or not 1 <= self.buffers <= 64 or self.frames < 1:
            raise ValueError("need frames >= 1 and 1..64 consumers and buffers")
        if not 0 < self.words < SEEN:
            raise ValueError(f"words must be in [1, {SEEN})")

    @property
    def deadline_s(self) -> float:
        return max(60.0, self.frames * 0.05) if self.give_up_after is None else self.give_up_after


async def run_demo(
    driver: Driver,
    params: DemoParams | None = None,
    *,
    say: Callable[[str], None] = print,
    **fields: Any,
) -> DemoResult:
    """Run the pipeline and verify every frame. ``params``, or the :class:`DemoParams`
    ``fields`` given as keywords (``run_demo(drv, frames=48)``)."""
    if params is None:
        params = DemoParams(**fields)
    elif fields:
        raise TypeError("give params or keyword fields, not both")
    p = params
    kind = "SIMULATED device" if driver.simulated else f"real GPU: {driver.device_name(p.device)}"
    say(f"driver: {driver.name} ({kind}), device {p.device}")
    work = workloads(driver)
    buf_ptr = work.alloc_pinned(p.buffers * p.words * 4)
    out_ptr = work.alloc_pinned(4 * (p.frames + 1))
    try:
        frames = _Frames(p, buf_ptr, out_ptr)
        await anyio.to_thread.run_sync(_warm_up, driver, work, frames)
        frames.out[:] = 0
        with _producers(driver, p.device, p.consumers, say) as (desc, ready, done, signal_ready):
            say(f"producer: {desc}")
            say(
                f"{p.frames} frames of {p.words} words through {p.buffers} pinned buffers, "
                f"{p.consumers} consumer coroutines on their own streams"
            )
            pipeline = _Pipeline(driver, work, p, frames, ready, done, signal_ready, say)
            return await pipeline.run()
    finally:
        work.free_pinned(buf_ptr)
        work.free_pinned(out_ptr)


@dataclass
class _Frames:
    """The pinned buffers the producer fills and the GPU's per-frame check results."""

    params: DemoParams
    buf_ptr: int
    out_ptr: int
    bufs: np.ndarray[Any, np.dtype[np.uint32]] = field(init=False)
    out: np.ndarray[Any, np.dtype[np.uint32]] = field(init=False)

    def __post_init__(self) -> None:
        p = self.params
        raw = (ctypes.c_uint32 * (p.buffers * p.words)).from_address(self.buf_ptr)
        self.bufs = np.ctypeslib.as_array(raw).reshape(p.buffers, p.words)
        results = (ctypes.c_uint32 * (p.frames + 1)).from_address(self.out_ptr)
        self.out = np.ctypeslib.as_array(results)

    def slot(self, n: int) -> int:
        """The address of the buffer that frame ``n`` goes through."""
        return self.buf_ptr + (n % self.params.buffers) * self.params.words * 4


def _warm_up(driver: Driver, work: Workloads, frames: _Frames) -> None:
    """Load (on a GPU: compile) the kernel before any frame is timed. Frame 0 is unused."""
    p = frames.params
    stream = driver.stream_create(p.device, True, 0)
    try:
        work.launch_check_frame(stream, frames.buf_ptr, p.words, 0, frames.out_ptr)
        driver.stream_synchronize(stream)
    finally:
        driver.stream_destroy(stream)


class _Pipeline:
    """One run: the producer thread, the consumer coroutines, the check and the clean-up."""

    def __init__(
        self,
        driver: Driver,
        work: Workloads,
        params: DemoParams,
        frames: _Frames,
        ready: _Producer,
        done: list[_Producer],
        signal_ready: Callable[[int, _Producer], None],
        say: Callable[[str], None],
    ) -> None:
        self.driver, self.work, self.p, self.frames = driver, work, params, frames
        self.ready, self.done, self.signal_ready, self.say = ready, done, signal_ready, say
        self.ready_sem: ExternalSemaphore | None = None
        self.done_sems: list[ExternalSemaphore] = []
        self.streams: list[Stream] = []
        self.signalled = [0.0] * (params.frames + 1)
        self.resumed = [0.0] * (params.frames + 1)
        self.stop = threading.Event()
        self.failure: list[BaseException] = []

    async def run(self) -> DemoResult:
        p, ok = self.p, False
        try:
            self.ready_sem = _import(self.driver, p.device, self.ready)
            for d in self.done:
                self.done_sems.append(_import(self.driver, p.device, d))
            self.streams = [open_stream(p.device, driver=self.driver) for _ in range(p.consumers)]
            elapsed = await self._run_pipeline()
            self._verify()
            lat = [(self.resumed[n] - self.signalled[n]) * 1e6 for n in range(1, p.frames + 1)]
            ok = True
            return DemoResult(self.driver.name, p.frames, lat, elapsed)
        finally:
            with anyio.CancelScope(shield=True):
                await self._clean_up(ok)

    async def _run_pipeline(self) -> float:
        thread = threading.Thread(target=self._produce, name="aiocudasem-demo-producer")
        thread.daemon = True
        start = time.perf_counter()
        thread.start()
        try:
            with anyio.fail_after(self.p.deadline_s):
                async with anyio.create_task_group() as tg:
                    for k in range(self.p.consumers):
                        tg.start_soon(self._consume, k)
        finally:
            self.stop.set()
            await anyio.to_thread.run_sync(thread.join, 10.0)
        if self.failure:
            raise RuntimeError(f"the producer failed: {self.failure[0]!r}") from self.failure[0]
        return time.perf_counter() - start

    def _produce(self) -> None:
        p = self.p
        try:
            for n in range(1, p.frames + 1):
                reuse = n - p.buffers  # the frame that used this buffer last
                if reuse >= 1 and p.wait_for_reuse:
                    owner = self.done[(reuse - 1) % p.consumers]  # consumer k: k+1, k+1+K, ...
                    while not owner.block_until(reuse, timeout=0.1):
                        if self.stop.is_set():
                            return
                self.frames.bufs[n % p.buffers] = frame_words(n, p.words)
                self.signalled[n] = time.perf_counter()
                self.signal_ready(n, self.ready)
        except BaseException as exc:
            self.failure.append(exc)

    async def _consume(self, k: int) -> None:
        p, stream, ready = self.p, self.streams[k], self.ready_sem
        assert ready is not None
        for n in range(k + 1, p.frames + 1, p.consumers):
            async with stream.handoff(Wait(ready, n), Signal(self.done_sems[k], n)):
                self.work.launch_check_frame(
                    stream.handle, self.frames.slot(n), p.words, n, self.frames.out_ptr
                )
            self.resumed[n] = time.perf_counter()
            if n % max(1, p.frames // 8) == 0 or n == p.frames:
                self.say(f"  frame {n:>5}/{p.frames} handed back")

    def _verify(self) -> None:
        out = self.frames.out
        bad = [n for n in range(1, self.p.frames + 1) if int(out[n]) != SEEN]
        if bad:
            n = bad[0]
            raise RuntimeError(
                f"{len(bad)} frame(s) failed verification, first frame {n}: "
                f"{int(out[n]) & 0xFFFF} bad words, checked {int(out[n]) >> 16} time(s)"
            )

    async def _clean_up(self, ok: bool) -> None:
        if not ok:
            # GPU waits for frames that never came would outlive us, and CUDA forbids
            # destroying a semaphore with waits outstanding: release them first.
            _release(self.ready, self.p.frames)
        drained = True
        with anyio.move_on_after(5 if ok else 1):
            for st in self.streams:
                with contextlib.suppress(AiocudasemError):
                    await st.wait_complete()
        for st in self.streams:
            with contextlib.suppress(AiocudasemError):  # a fault took them all anyway
                drained &= st.query()
            st.close()
        sems = [self.ready_sem, *self.done_sems] if self.ready_sem is not None else []
        for sem in sems:
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


def main(driver_name: str | None, backend: str, params: DemoParams) -> int:
    """``aiocudasem demo``: the device chosen by ``--driver`` (``driver_name``) or
    ``$AIOCUDASEM_DRIVER``, which must be usable, or with no choice the real GPU if there is one,
    else the simulated device, said so. Returns the exit status; raises
    :class:`~._common.CommandError` if the chosen device cannot be used, or (status 2) if the
    driver has no device ``params.device``."""

    def say(msg: str) -> None:
        print(msg, flush=True)

    missing = missing_loop(backend)
    if missing is not None:
        raise CommandError(f"--backend {backend}: {missing}")
    driver = open_driver(driver_name, fallback=say)
    count = driver.device_count()
    if not 0 <= params.device < count:
        which = "--device 0" if count == 1 else f"--device 0 to {count - 1}"
        raise CommandError(
            f"--device {params.device}: the {driver.name} driver has {count} device(s); "
            f"pass {which}",
            EXIT_USAGE,
        )

    async def go() -> DemoResult:
        return await run_demo(driver, params, say=say)

    say(f"event loop: {backend}")
    name, _, opt = backend.partition("+")
    try:
        result = anyio.run(go, backend=name, backend_options={"use_uvloop": True} if opt else {})
    except BaseException as exc:
        failures = _failures(exc)
        if not failures:
            raise  # a bug, an interrupt or a closed output pipe: not the demo's to report
        first = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        print(f"demo FAILED: {type(first).__name__}: {first}{more}", file=sys.stderr)
        return 1
    report(result, say)
    return 0


#: What a run of the demo that fails raises: the device's errors, a failed check, the deadline.
_FAILURES = (AiocudasemError, RuntimeError, ValueError, TimeoutError)


def _failures(exc: BaseException) -> list[BaseException]:
    """The failures in ``exc``, an exception or a task group's (nested) group of them, in
    order; empty if any of them is something else."""
    if isinstance(exc, BaseExceptionGroup):
        leaves: list[BaseException] = []
        for sub in exc.exceptions:
            found = _failures(sub)
            if not found:
                return []
            leaves += found
        return leaves
    return [exc] if isinstance(exc, _FAILURES) else []
