"""Host signal to stream resume: how soon a stream blocked on a wait goes on once a CPU thread
signals, for a host timeline and for an external (Vulkan) timeline semaphore.

For each sample, a stream waits for value i (``Wait(source, i)``) and then writes i to a probe
host timeline (``Signal(probe, i)``); once the stream has reached the wait, the measuring
thread signals i and spins on the probe's value. The figure is the time from the signal call to
seeing the probe change, on the host's clock: the producer's signal, the GPU noticing it, the
stream going on, and its write reaching host memory. Only the wait differs between the rows;
the probe's path is the same in each.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import aiocudasem as acs

from ._common import over_runs, pct, say

#: How long the stream is given to reach its wait and block there before each signal.
SETTLE_S: Final = 0.0003


class Producer:
    """One kind of wait, and the host call that satisfies it."""

    name = ""
    label = ""

    def __init__(self, drv: acs.Driver) -> None:
        self.drv = drv
        self.why_unavailable: str | None = None
        self.source: acs.ExternalSemaphore | acs.HostTimeline | None = None
        self.signal: Callable[[int], None] = lambda i: None
        self.count = 0  # the value signalled last: each run goes on from there
        self.pending = 0  # the value a stream waits for, from before its signal
        self._stack = contextlib.ExitStack()

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        # The imported semaphore before the Vulkan device that exported it.
        if self.source is not None:
            self.source.close()
            self.source = None
        self._stack.close()


class HostTimelineProducer(Producer):
    name, label = "host_timeline", "host timeline (cuStreamWaitValue64), signal()"

    def open(self) -> None:
        t = acs.create_host_timeline(driver=self.drv)
        self.source, self.signal = t, t.signal


class ExternalTimelineProducer(Producer):
    """A Vulkan timeline semaphore on the GPU, the simulator's own on the simulated device."""

    name = "external_timeline"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.label = (
            "simulated external timeline semaphore, signal()"
            if drv.simulated
            else "Vulkan timeline semaphore (cuWaitExternalSemaphoresAsync), vkSignalSemaphore"
        )

    def open(self) -> None:
        from aiocudasem.testing import SimDriver

        drv = self.drv
        producer: Any
        if isinstance(drv, SimDriver):
            producer = drv.create_semaphore(timeline=True)
        else:
            from aiocudasem.vulkan import VulkanDevice

            vk = self._stack.enter_context(VulkanDevice.open(uuid=drv.device_uuid(0)))
            producer = vk.create_timeline_semaphore()
            self._stack.callback(producer.close)
        fd = producer.export_fd()
        try:
            self.source = acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=drv)
        except BaseException:
            os.close(fd)
            raise
        self.signal = producer.signal


def run_signal(drv: acs.Driver, quick: bool, repeats: int) -> dict[str, Any]:
    """Every producer ``repeats`` times, interleaved as the other figures are; returns
    ``{name: {"label", "runs": [[us, ...], ...]}}`` (or ``"error"`` for a producer that cannot
    run here)."""
    samples = 60 if quick else 300
    producers = [HostTimelineProducer(drv), ExternalTimelineProducer(drv)]
    out: dict[str, Any] = {p.name: {"label": p.label, "runs": []} for p in producers}
    live = []
    for p in producers:
        try:
            p.open()
        except Exception as exc:
            p.close()
            out[p.name]["error"] = f"{type(exc).__name__}: {exc}"
            say(f"  {p.name:<18} not available: {out[p.name]['error']}")
        else:
            live.append(p)
    stream = acs.open_stream(driver=drv)
    try:
        probe = acs.create_host_timeline(driver=drv)
    except acs.AiocudasemError as exc:
        # The probe is a host timeline: without one, no row can be measured.
        stream.close()
        for p in live:
            p.close()
            out[p.name]["error"] = f"the probe needs a host timeline: {type(exc).__name__}: {exc}"
        say(f"  host signal section not measured: {exc}")
        return out
    try:
        value = 0
        step = 0
        for r in range(repeats):
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for p in order:
                step += 1
                say(f"[{step}/{repeats * len(live)}] host signal round {r + 1}/{repeats}: {p.name}")
                run, value = _measure(p, stream, probe, value, samples)
                out[p.name]["runs"].append(run)
                say(
                    f"  {p.name:<18} signal to resume {statistics.median(run):.1f} us, "
                    f"p99 {pct(run, 99):.1f} us"
                )
    finally:
        # A run cut short (an interrupt, a timeout) leaves the stream waiting for a value that
        # was never signalled: signal it, so that the stream drains and everything closes.
        for p in live:
            if p.pending > p.count:
                p.signal(p.pending)
        drv.stream_synchronize(stream.handle)
        stream.close()
        probe.close()
        for p in live:
            p.close()
    return out


def _measure(
    p: Producer, stream: acs.Stream, probe: acs.HostTimeline, value: int, samples: int
) -> tuple[list[float], int]:
    """``samples`` signal-to-resume times of ``p``, in microseconds; the probe's last value."""
    assert p.source is not None
    base = p.count
    run = []
    # The simulated device's streams are Python threads: a spin that never lets go of the GIL
    # would hold them off for the interpreter's switch interval (5 ms) each time.
    pause: Callable[[float], None] | None = time.sleep if stream.driver.simulated else None
    for k in range(1, samples + 1):
        target = base + k
        value += 1
        p.pending = target
        stream.enqueue_wait(acs.Wait(p.source, target))
        stream.enqueue_signal(acs.Signal(probe, value))
        time.sleep(SETTLE_S)  # the stream reaches the wait and blocks there
        t0 = time.perf_counter()
        p.signal(target)
        deadline = t0 + 10.0
        while probe.value < value:
            if pause is not None:
                pause(0)
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{p.name}: the stream did not resume within 10 s")
        run.append((time.perf_counter() - t0) * 1e6)
        p.count = target
    return run, value


def summarize_signal(entry: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The median and p99 of each run, as median [min-max] over the runs."""
    out: dict[str, dict[str, float]] = {}
    for name, get in (("median_us", statistics.median), ("p99_us", lambda r: pct(r, 99))):
        values = [get(r) for r in entry.get("runs", []) if r]
        if values:
            out[name] = over_runs(values)
    return out
