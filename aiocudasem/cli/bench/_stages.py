"""Host stages against a Python host callback: what each costs the work stream while the event
loop is busy, and how soon each runs after the work before it.

- ``stage``: ``Stream.enqueue_host(async_fn)``, the library's host stage. The stream stops at a
  GPU wait on a host timeline; the notifier's C host function (no GIL) reports the work before
  it done, the coroutine runs on the event loop, and its end signals the timeline.
- ``pycallback``: a Python host callback launched behind the work (``cuLaunchHostFunc``, as
  numba-cuda's and CuPy's stream callbacks are): it takes the GIL on the driver's thread and
  hands an event to the loop (``call_soon_threadsafe``, on trio ``run_sync_soon``); the stream
  is held while the callback runs.

**Stall.** On one stream, :data:`STAGES` x (50 us kernel + a stage of the approach), the 32
stages a stream may have pending (:data:`QUICK_STAGES` in a smoke run), timed by two timing
events on that stream, while one more task runs pure Python in passes of about 50 us and
yields between them (the service section's other work). The same kernels with no stage, in
the same round, are the floor; the figure is (window - floor) / stages: GPU time of the work
stream per stage.

**Latency.** A 100 us spin kernel, then a stage that notes the host clock as its coroutine
starts (for the callback: as the task that awaits its event resumes). The figure is from the
kernel's end: the host time from the launch less the kernel's length, as the crowds' figures of
the main section are (the launch's few microseconds are in it). On an idle loop and on the busy
loop above; each sample measures both approaches, in a balanced order, and their differences
are paired sample by sample.
"""

from __future__ import annotations

import asyncio
import ctypes
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import anyio
import anyio.lowlevel

import aiocudasem as acs
from aiocudasem._stages import MAX_PENDING

from ._common import balanced, busy, differences, gc_window, over_runs, pct, say

#: The approaches, by name, and what the page calls them.
APPROACHES: Final = ("stage", "pycallback")
LABELS: Final = {
    "stage": "host stage (stream.enqueue_host())",
    "pycallback": "Python host callback, GIL (numba/CuPy style)",
}
#: The states of the loop that latency is measured on.
CONDITIONS: Final = ("idle", "busy")
#: Stages in one stall window: as many as a stream may have pending; a smoke run's (the
#: simulated device's streams are Python threads, slow behind a busy loop holding the GIL).
STAGES: Final = MAX_PENDING
QUICK_STAGES: Final = 8
#: The kernel before each stage of the stall window, and the one the latency is taken from.
STALL_KERNEL_NS: Final = 50_000
LATENCY_KERNEL_NS: Final = 100_000
#: Latency samples per approach, loop state and round; a smoke run's.
SAMPLES: Final = 200
QUICK_SAMPLES: Final = 8

_PYCB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class PythonCallback:
    """A Python host callback on the driver's thread, on any loop: it takes the GIL and sets
    an ``anyio.Event`` through the loop's thread-safe call."""

    def __init__(self, drv: acs.Driver, loop: str) -> None:
        self.drv, self.loop = drv, loop
        self.calls: dict[int, Callable[[], object]] = {}
        self.next = 1

        def cb(key: int | None) -> None:
            self.calls.pop(key or 0)()

        self.cfunc = _PYCB(cb)  # kept alive: the driver calls it
        self.addr = ctypes.cast(self.cfunc, ctypes.c_void_p).value or 0

    def _soon(self) -> Callable[[Callable[[], object]], object]:
        if self.loop == "trio":
            import trio

            return trio.lowlevel.current_trio_token().run_sync_soon
        return asyncio.get_running_loop().call_soon_threadsafe

    def enqueue(self, h: int) -> anyio.Event:
        """Launch the callback on stream ``h``; the event is set on the loop once it ran."""
        ev = anyio.Event()
        soon = self._soon()
        key = self.next
        self.next += 1
        self.calls[key] = lambda: soon(ev.set)
        self.drv.launch_host_func(h, self.addr, key)
        return ev


class _Busy:
    """The loop's other work: ``busy(turns)``, a checkpoint, again, until stopped."""

    def __init__(self, turns: int) -> None:
        self.turns, self.stop, self.passes = turns, False, 0

    async def run(self) -> None:
        while not self.stop:
            busy(self.turns)
            self.passes += 1
            await anyio.lowlevel.checkpoint()


async def _mark() -> float:
    return time.perf_counter()


async def stall_window(
    name: str | None,
    stream: acs.Stream,
    cb: PythonCallback,
    launch: Callable[[int, int], None],
    turns: int,
    stages_n: int = STAGES,
) -> float:
    """GPU microseconds of ``stages_n`` (at most :data:`STAGES`) x (50 us kernel + a stage of
    approach ``name``; none for ``None``, the floor) on ``stream``, with the loop busy."""
    drv, h = stream.driver, stream.handle
    start, end = drv.event_create(0, timing=True), drv.event_create(0, timing=True)
    other = _Busy(turns)
    stages: list[acs.HostStage[float]] = []
    events: list[anyio.Event] = []
    try:
        drv.stream_synchronize(h)
        async with anyio.create_task_group() as tg:
            tg.start_soon(other.run)
            await anyio.lowlevel.checkpoint()  # the other work is under way
            drv.event_record(start, h)
            for _ in range(stages_n):
                launch(h, STALL_KERNEL_NS)
                if name == "stage":
                    stages.append(stream.enqueue_host(_mark))
                elif name == "pycallback":
                    events.append(cb.enqueue(h))
            drv.event_record(end, h)
            with anyio.fail_after(60):
                for st in stages:
                    await st
                for ev in events:
                    await ev.wait()
                await stream.wait_complete()
            other.stop = True
        return drv.event_elapsed_ms(start, end) * 1e3
    finally:
        drv.stream_synchronize(h)
        drv.event_destroy(start)
        drv.event_destroy(end)


async def latency_sample(
    name: str, stream: acs.Stream, cb: PythonCallback, launch: Callable[[int, int], None]
) -> float:
    """Microseconds from the 100 us kernel's end to approach ``name``'s code starting."""
    h = stream.handle
    t0 = time.perf_counter()
    launch(h, LATENCY_KERNEL_NS)
    if name == "stage":
        t1 = await stream.enqueue_host(_mark)
    else:
        await cb.enqueue(h).wait()
        t1 = time.perf_counter()
    return (t1 - t0) * 1e6 - LATENCY_KERNEL_NS / 1e3


async def run_stages(
    drv: acs.Driver,
    launch: Callable[[int, int], None],
    loop: str,
    quick: bool,
    rounds: int,
    progress: Any,
    turns: int,
) -> dict[str, Any]:
    """The stages section on the running loop: ``{"labels", "rounds": [{"round", "floor_us",
    "window_us": {approach: us}, "stall_us": {approach: us per stage}, "latency_us": {state:
    {approach: [us, ...]}}}, ...]}``."""
    samples = QUICK_SAMPLES if quick else SAMPLES
    n = QUICK_STAGES if quick else STAGES
    cb = PythonCallback(drv, loop)
    out: dict[str, Any] = {"labels": dict(LABELS), "stages": n, "samples": samples, "rounds": []}
    async with (
        acs.open_stream(driver=drv) as floor_s,
        acs.open_stream(driver=drv) as stage_s,
        acs.open_stream(driver=drv) as cb_s,
    ):
        streams = {"stage": stage_s, "pycallback": cb_s}
        # Warm: the stage's timeline and task, the notifier, the callback's thread.
        for name in APPROACHES:
            await latency_sample(name, streams[name], cb, launch)
        for r in range(rounds):
            progress.step(f"stages {loop} round {r + 1}/{rounds}: stall, {n} stages each")
            run: dict[str, Any] = {"round": r, "window_us": {}, "latency_us": {}}
            for which in balanced([None, *APPROACHES], r):
                s = floor_s if which is None else streams[which]
                with gc_window(short=True):
                    us = await stall_window(which, s, cb, launch, turns, n)
                if which is None:
                    run["floor_us"] = us
                else:
                    run["window_us"][which] = us
            run["stall_us"] = {a: (run["window_us"][a] - run["floor_us"]) / n for a in APPROACHES}
            for state in balanced(list(CONDITIONS), r):
                progress.step(f"stages {loop} round {r + 1}/{rounds}: latency, {state} loop")
                lat: dict[str, list[float]] = {n: [] for n in APPROACHES}
                other = _Busy(turns)
                with gc_window(short=True):
                    async with anyio.create_task_group() as tg:
                        if state == "busy":
                            tg.start_soon(other.run)
                        for k in range(samples):
                            for name in balanced(list(APPROACHES), r * samples + k):
                                lat[name].append(
                                    await latency_sample(name, streams[name], cb, launch)
                                )
                        other.stop = True
                run["latency_us"][state] = lat
            out["rounds"].append(run)
            stall = run["stall_us"]
            say(
                f"  {loop} stall per stage: stage {stall['stage']:+.1f} us, pycallback "
                f"{stall['pycallback']:+.1f} us (floor {run['floor_us'] / n:.1f} us per "
                "kernel); latency, median: "
                + "; ".join(
                    f"{state} stage {statistics.median(run['latency_us'][state]['stage']):.1f} "
                    f"/ pycallback {statistics.median(run['latency_us'][state]['pycallback']):.1f}"
                    " us"
                    for state in CONDITIONS
                )
            )
    return out


def summarize_stages(entry: dict[str, Any]) -> dict[str, Any]:
    """Per approach, the stall per stage (median [min-max] over the rounds); per loop state and
    approach, the latency's median and p99 (each over the rounds); and per loop state, the
    stage's latency less the callback's, paired sample by sample over every round (median,
    p99, how many)."""
    rounds = entry.get("rounds", [])
    out: dict[str, Any] = {"stall_us": {}, "latency": {}, "stage_over_pycallback": {}}
    for name in APPROACHES:
        values = [r["stall_us"][name] for r in rounds if name in r.get("stall_us", {})]
        if values:
            out["stall_us"][name] = over_runs(values)
    for state in CONDITIONS:
        by_ap: dict[str, Any] = {}
        for name in APPROACHES:
            runs = [r["latency_us"][state][name] for r in rounds if state in r["latency_us"]]
            runs = [xs for xs in runs if xs]
            if runs:
                by_ap[name] = {
                    "median_us": over_runs([statistics.median(xs) for xs in runs]),
                    "p99_us": over_runs([pct(xs, 99) for xs in runs]),
                }
        out["latency"][state] = by_ap
        stage = [x for r in rounds for x in r["latency_us"].get(state, {}).get("stage", [])]
        cb = [x for r in rounds for x in r["latency_us"].get(state, {}).get("pycallback", [])]
        if stage and len(stage) == len(cb):
            out["stage_over_pycallback"][state] = differences(stage, cb)
    return out
