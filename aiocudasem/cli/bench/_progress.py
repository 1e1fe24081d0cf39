"""Kernel progress: a kernel publishes N values into a host timeline while it runs, and the host
awaits each in order; how soon each wait wakes after its publish, and what the waiting costs.

- ``wait_value``: ``await timeline.wait_value(n)`` for n = 1 .. N, the library's wait (a GPU
  wait on a private stream, reported by the notifier; nothing polls on the host);
- ``poll``: busy polling of the word, ``timeline.value`` and a yield to the loop (``sleep(0)``;
  on trio ``trio.lowlevel.checkpoint()``) until it reaches n.

Per round, each approach in a balanced order watches a kernel of its own
(``Workloads.launch_progress``) that publishes :data:`COUNT` values, one every
:data:`INTERVAL_NS`, and stamps the device's clock just before each publish. The wake latency
of value n is the host's clock when the wait returned less that stamp. On the simulated device
the stamps are the host's ``perf_counter_ns()``, so the figure is absolute. On a GPU they are
``%globaltimer``, whose origin the host's clock does not share: the figures are then relative
to the fastest wake of the round (either approach), which is taken as 0 (``"clock":
"relative"``). A wait that found its value already published when it began is left out (it
measures nothing of the wake). CPU is the process's CPU time over the kernel's run, in % of
one core (all threads).
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

from ._common import balanced, gc_window, over_runs, pct, say

APPROACHES: Final = ("wait_value", "poll")
LABELS: Final = {
    "wait_value": "await timeline.wait_value(n)",
    "poll": "poll timeline.value + sleep(0)",
}
#: Values published per kernel, and the device time between two; a smoke run's.
COUNT: Final = 500
INTERVAL_NS: Final = 1_000_000
QUICK_COUNT: Final = 50
QUICK_INTERVAL_NS: Final = 1_000_000
#: Values of the kernel that each approach watches once before the rounds, not counted.
WARMUP: Final = 5


def _yield_for(loop: str) -> Callable[[], Any]:
    if loop == "trio":
        import trio

        return trio.lowlevel.checkpoint
    return lambda: asyncio.sleep(0)


async def watch(
    name: str,
    drv: acs.Driver,
    work: Any,
    stream: acs.Stream,
    count: int,
    interval_ns: int,
    yield_: Callable[[], Any],
) -> dict[str, Any]:
    """One kernel of ``count`` values, watched by approach ``name``: ``{"delay_ns": [wake -
    stamp for each value], "late": [whether it was published before its wait began], "cpu_pct",
    "wall_s"}``."""
    buf = work.alloc_pinned(8 * count)
    try:
        stamps = (ctypes.c_uint64 * count).from_address(buf)
        ctypes.memset(buf, 0, 8 * count)
        woke = [0] * count
        late = [False] * count
        async with acs.create_host_timeline(driver=drv) as t:
            await stream.wait_complete()
            c0, w0 = time.process_time(), time.perf_counter()
            work.launch_progress(stream, t.handle, count, count * interval_ns, stamps=buf)
            with anyio.fail_after(60 + count * interval_ns / 1e9):
                for n in range(1, count + 1):
                    late[n - 1] = t.value >= n
                    if name == "wait_value":
                        await t.wait_value(n)
                    else:
                        while t.value < n:
                            await yield_()
                    woke[n - 1] = time.perf_counter_ns()
                await stream.wait_complete()
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        published = list(stamps)
    finally:
        drv.stream_synchronize(stream.handle)
        work.free_pinned(buf)
    return {
        "delay_ns": [w - p for w, p in zip(woke, published, strict=True)],
        "late": late,
        "cpu_pct": 100 * cpu / wall,
        "wall_s": wall,
    }


async def run_progress(
    drv: acs.Driver, work: Any, loop: str, quick: bool, rounds: int, progress: Any
) -> dict[str, Any]:
    """The progress section on the running loop: ``{"labels", "count", "interval_us", "clock",
    "rounds": [{"round", approach: {"wake_us": [...], "late", "cpu_pct"}}]}``; ``clock`` is
    ``"common"`` (absolute figures) on the simulated device, else ``"relative"`` (to the
    fastest wake of the round)."""
    count, interval_ns = (QUICK_COUNT, QUICK_INTERVAL_NS) if quick else (COUNT, INTERVAL_NS)
    common = drv.simulated
    yield_ = _yield_for(loop)
    out: dict[str, Any] = {
        "labels": dict(LABELS),
        "count": count,
        "interval_us": interval_ns / 1e3,
        "clock": "common" if common else "relative",
        "rounds": [],
    }
    async with acs.open_stream(driver=drv) as stream:
        # Warm, not counted: the notifier, the timelines' first waits.
        for name in APPROACHES:
            await watch(name, drv, work, stream, WARMUP, interval_ns, yield_)
        for r in range(rounds):
            raw: dict[str, dict[str, Any]] = {}
            for name in balanced(list(APPROACHES), r):
                progress.step(
                    f"progress {loop} round {r + 1}/{rounds}: {name}, {count} values",
                    count * interval_ns / 1e9,
                )
                with gc_window(short=True):
                    raw[name] = await watch(name, drv, work, stream, count, interval_ns, yield_)
            parked = {
                n: [d for d, lt in zip(f["delay_ns"], f["late"], strict=True) if not lt]
                for n, f in raw.items()
            }
            zero = 0 if common else min((min(d) for d in parked.values() if d), default=0)
            run: dict[str, Any] = {"round": r}
            for name, f in raw.items():
                run[name] = {
                    "wake_us": [(d - zero) / 1e3 for d in parked[name]],
                    "late": sum(f["late"]),
                    "cpu_pct": f["cpu_pct"],
                }
            out["rounds"].append(run)
            say(
                f"  {loop} progress, wake after publish"
                + ("" if common else " (over the round's fastest)")
                + ": "
                + "; ".join(
                    f"{n} median {_median(run[n]['wake_us'])} us, CPU {run[n]['cpu_pct']:.1f} %"
                    for n in APPROACHES
                )
            )
    return out


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f}" if xs else "n/a"


def summarize_progress(entry: dict[str, Any]) -> dict[str, Any]:
    """Per approach: the wake latency's median and p99 and the CPU, each median [min-max]
    over the rounds, and the waits left out (their value was there already), in all."""
    out: dict[str, Any] = {}
    rounds = entry.get("rounds", [])
    for name in APPROACHES:
        runs = [r[name] for r in rounds if name in r]
        waits = [f["wake_us"] for f in runs if f["wake_us"]]
        fig: dict[str, Any] = {"late": sum(f["late"] for f in runs)}
        if waits:
            fig["median_us"] = over_runs([statistics.median(xs) for xs in waits])
            fig["p99_us"] = over_runs([pct(xs, 99) for xs in waits])
        if runs:
            fig["cpu_pct"] = over_runs([f["cpu_pct"] for f in runs])
        out[name] = fig
    return out
