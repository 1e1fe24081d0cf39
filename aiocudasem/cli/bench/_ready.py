"""Readiness in batches: what ``ready()`` costs per array, of several arrays in one call
against one call each.

A stand-in array's ``__dlpack__(stream=s)`` does what PyTorch's and CuPy's do: it records an
event on its producer's stream and makes ``s`` wait for it (``cuEventRecord``,
``cuStreamWaitEvent``). The producer's stream has nothing pending, so the figure is the cost of
the call itself: per round, ``ready(x)`` of each of n arrays in turn and one ``ready(*arrays)``,
in the order of a balanced Latin square, each timed over many calls; microseconds per array.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Final

import aiocudasem as acs

from ._common import balanced, gc_window, over_runs, say

#: How many arrays each call covers.
SIZES: Final = (8, 64)
#: The ways of awaiting them, by name, and what the page calls them.
WAYS: Final = {"each": "ready(x) of each", "batched": "ready(*arrays)"}
#: Calls timed per way and size in a round (of n arrays each), and for a smoke run.
CALLS: Final = 200
QUICK_CALLS: Final = 20


class _Array:
    """A DLPack producer on ``stream`` of device 0, with an event of its own."""

    def __init__(self, drv: acs.Driver, stream: int) -> None:
        self.drv, self.stream = drv, stream
        self.event = drv.event_create(0)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        if stream is not None and stream != -1:
            self.drv.event_record(self.event, self.stream)
            self.drv.stream_wait_event(stream, self.event)
        return object()  # stands for the capsule


async def run_ready(drv: acs.Driver, quick: bool, repeats: int) -> dict[str, Any]:
    """Every way at every size ``repeats`` times, on the running loop; returns ``{"sizes",
    "runs": {way: {size: [us per array, one per round]}}}``."""
    calls = QUICK_CALLS if quick else CALLS
    runs: dict[str, dict[str, list[float]]] = {w: {str(n): [] for n in SIZES} for w in WAYS}
    async with acs.open_stream(driver=drv) as producer:
        arrays = [_Array(drv, producer.handle) for _ in range(max(SIZES))]
        try:
            await acs.ready(*arrays, driver=drv)  # warm: the private stream, the notifier
            for r in range(repeats):
                for n in SIZES:
                    these = arrays[:n]
                    for way in balanced(list(WAYS), r):
                        with gc_window(short=True):
                            t0 = time.perf_counter()
                            for _ in range(calls):
                                if way == "batched":
                                    await acs.ready(*these, driver=drv)
                                else:
                                    for x in these:
                                        await acs.ready(x, driver=drv)
                            elapsed = time.perf_counter() - t0
                        runs[way][str(n)].append(elapsed / (calls * n) * 1e6)
                say(
                    f"[{r + 1}/{repeats}] ready round {r + 1}/{repeats}, us per array: "
                    + "; ".join(
                        f"{n} arrays: each {runs['each'][str(n)][-1]:.1f}, "
                        f"batched {runs['batched'][str(n)][-1]:.1f}"
                        for n in SIZES
                    )
                )
        finally:
            drv.stream_synchronize(producer.handle)
            for x in arrays:
                drv.event_destroy(x.event)
    return {"sizes": list(SIZES), "calls": calls, "runs": runs}


def summarize_ready(entry: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per way and size, the microseconds per array as median [min-max] over the rounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for way, by_size in entry.get("runs", {}).items():
        out[way] = {n: over_runs(us) for n, us in by_size.items() if us}
    return out


def median_ratio(entry: dict[str, Any], size: str) -> float | None:
    """ready(x) of each over ready(*arrays), per array, at ``size``: the median of the rounds'
    ratios (paired round by round)."""
    each = entry.get("runs", {}).get("each", {}).get(size, [])
    batched = entry.get("runs", {}).get("batched", {}).get(size, [])
    ratios = [e / b for e, b in zip(each, batched, strict=False) if b > 0]
    return statistics.median(ratios) if ratios else None
