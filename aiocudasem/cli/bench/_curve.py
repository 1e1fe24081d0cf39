"""The latency curve: wake latency and CPU against the length of the kernel waited for.

For each kernel length, on each event loop, rounds of one sample per approach, in the order of
a balanced Latin square, each approach on a stream of its own: launch the spin kernel, await
it, take the time from the launch to the await returning and the process's CPU time over the
same span (all threads: the loop's, the driver's, the waiting thread's). Blocking
``cuStreamSynchronize`` is one of the approaches of every round, and each approach's latency
is given as its difference to sync's in the same round: the median and p99 of those paired
differences. The CPU figure is the process's CPU time over the wall time of the approach's own
samples, in % of one core.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Final

import aiocudasem as acs
from aiocudasem.lowlevel import statistics as library_statistics

from ._approaches import (
    Aiocudasem,
    AiocudasemParked,
    Approach,
    BlockingSync,
    EventThread,
    PollSleep0,
    TrioPoll0,
)
from ._common import US, balanced, differences, gc_window, pct, say

#: The kernel lengths, in nanoseconds: 10 us to 10 ms.
LENGTHS_NS: Final = (10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000)
#: The approaches of every round, by name; sync is the reference of each round.
APPROACHES: Final = ("sync", "aiocudasem", "aiocudasem_parked", "poll0", "event_thread")
#: The time each approach gets at each length, on each loop: the rounds of one length go on
#: until the approaches together have had it, and ``MIN_ROUNDS`` at least, ``MAX_ROUNDS`` at
#: most. With ``WARMUP`` rounds first, not counted, for each length: the library learns how
#: long a stream's waits take, and a new length is news to it.
CELL_S: Final = 0.25
MIN_ROUNDS: Final = 60
MAX_ROUNDS: Final = 4000
WARMUP: Final = 8
#: The same for a smoke run (``--quick``, the simulated device).
QUICK: Final = {"cell_s": 0.03, "min_rounds": 6, "max_rounds": 400, "warmup": 2}
#: What a round costs besides its kernels, per approach: for the estimate of the time left.
OVERHEAD_S: Final = 40e-6


def settings(quick: bool) -> dict[str, Any]:
    full = {"cell_s": CELL_S, "min_rounds": MIN_ROUNDS, "max_rounds": MAX_ROUNDS}
    return dict(QUICK) if quick else {**full, "warmup": WARMUP}


def expected_s(kernel_ns: int, quick: bool, approaches: int = len(APPROACHES)) -> float:
    """About how long one length takes on one loop."""
    s = settings(quick)
    per_round = approaches * (kernel_ns / 1e9 + OVERHEAD_S)
    busy = max(float(s["cell_s"]) * approaches, s["min_rounds"] * per_round)
    return float(busy + s["warmup"] * per_round)


def approaches_for(loop: str, drv: acs.Driver) -> list[Approach]:
    poll: Approach = TrioPoll0(drv) if loop == "trio" else PollSleep0(drv)
    return [BlockingSync(drv), Aiocudasem(drv), AiocudasemParked(drv), poll, EventThread(drv)]


async def sample(ap: Approach, launch: Any, h: int, kernel_ns: int) -> tuple[float, float]:
    """One wait: seconds from the launch to the await returning, and the process's CPU
    seconds over about the same span."""
    ap.setup()
    try:
        c0 = time.process_time()
        t0 = time.perf_counter()
        launch(h, kernel_ns)
        await ap.wait(h)
        t1 = time.perf_counter()
        c1 = time.process_time()
    finally:
        ap.teardown()
    return t1 - t0, c1 - c0


async def measure_length(
    aps: list[Approach], streams: list[int], launch: Any, kernel_ns: int, quick: bool
) -> dict[str, Any]:
    """The rounds of one kernel length on the running loop: per approach, its figures."""
    s = settings(quick)
    for r in range(s["warmup"]):
        for i, ap in balanced(list(enumerate(aps)), r):
            await sample(ap, launch, streams[i], kernel_ns)
    lat: dict[str, list[float]] = {ap.name: [] for ap in aps}
    cpu: dict[str, float] = dict.fromkeys(lat, 0.0)
    wall: dict[str, float] = dict.fromkeys(lat, 0.0)
    budget = s["cell_s"] * len(aps)
    rounds = 0
    before = statistics_of_ahead()
    # One short window for the whole length (a second or two): the collector off, after a
    # full collection; see gc_window.
    with gc_window(short=True):
        t_end = time.perf_counter() + budget
        while rounds < s["max_rounds"] and (
            rounds < s["min_rounds"] or time.perf_counter() < t_end
        ):
            for i, ap in balanced(list(enumerate(aps)), rounds):
                took, spent = await sample(ap, launch, streams[i], kernel_ns)
                lat[ap.name].append(took / US)
                cpu[ap.name] += spent
                wall[ap.name] += took
            rounds += 1
    # Only the library's default approach wakes ahead (spinning off plans nothing): how its
    # waits that did so ended, to tell a prediction that holds from alarms too late or early.
    ahead = {k: v - before[k] for k, v in statistics_of_ahead().items()}
    out: dict[str, Any] = {}
    for ap in aps:
        xs = lat[ap.name]
        fig: dict[str, Any] = {
            "rounds": rounds,
            "median_us": statistics.median(xs),
            "p99_us": pct(xs, 99),
            "cpu_pct": 100 * cpu[ap.name] / wall[ap.name] if wall[ap.name] > 0 else None,
        }
        if ap.name != "sync":
            d = differences(xs, lat["sync"])
            fig["over_sync_median_us"] = d["median"]
            fig["over_sync_p99_us"] = d["p99"]
        if ap.name == "aiocudasem":
            fig["ahead"] = ahead
        out[ap.name] = fig
    return out


async def run_curve(
    drv: acs.Driver,
    streams: list[int],
    launch: Any,
    loop: str,
    quick: bool,
    progress: Any,
    lengths: tuple[int, ...] = LENGTHS_NS,
) -> dict[str, Any]:
    """The curve on the running loop (``loop`` names it): ``{length in us: {approach:
    figures}}``, the labels in ``"labels"``."""
    aps = approaches_for(loop, drv)
    out: dict[str, Any] = {"labels": {ap.name: ap.label for ap in aps}}
    try:
        for kernel_ns in lengths:
            us = kernel_ns / 1000
            length = f"{us / 1000:g} ms" if us >= 1000 else f"{us:g} us"
            progress.step(f"curve {loop}: {length} kernel", expected_s(kernel_ns, quick))
            figs = await measure_length(aps, streams, launch, kernel_ns, quick)
            out[f"{us:g}"] = figs
            mine = figs["aiocudasem"]
            say(
                f"  {loop} {length}: aiocudasem {mine['over_sync_median_us']:+.1f} us over sync "
                f"(p99 {mine['over_sync_p99_us']:+.1f}), parked "
                f"{figs['aiocudasem_parked']['over_sync_median_us']:+.1f}, poll0 "
                f"{figs['poll0']['over_sync_median_us']:+.1f}, event thread "
                f"{figs['event_thread']['over_sync_median_us']:+.1f}; CPU "
                f"{_pct(mine['cpu_pct'])} / {_pct(figs['event_thread']['cpu_pct'])} "
                "(aiocudasem / event thread), "
                f"{mine['rounds']} rounds; woke ahead: {_ahead(mine)}"
            )
    finally:
        for ap in aps:
            ap.close()
    return out


def statistics_of_ahead() -> dict[str, int]:
    """The running loop's counts of waits that woke ahead, by how they ended."""
    s = library_statistics()
    return {"caught": s.ahead_caught, "early": s.ahead_early, "late": s.ahead_late}


def _ahead(fig: dict[str, Any]) -> str:
    a = fig.get("ahead") or {}
    return f"{a.get('caught', 0)} caught, {a.get('early', 0)} early, {a.get('late', 0)} late"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} %"
