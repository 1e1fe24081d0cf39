"""Shared by the benchmark modules: units, progress lines, percentiles, and a figure over
several runs (median [min-max])."""

from __future__ import annotations

import os
import statistics

US = 1e-6
KERNEL_NS = 100_000  # the 100 us kernel of the latency benchmark


def thread_cpu() -> dict[int, tuple[str, int]]:
    """Nanoseconds on a CPU of every thread of this process (/proc/self/task/*/schedstat)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        # Python threads by name; the others are the driver's (or a library's) own.
        name = names.get(int(tid), "not Python's (driver)")
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = (name, int(f.read().split()[0]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def say(msg: str) -> None:
    print(msg, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def over_runs(values: list[float]) -> dict[str, float]:
    """One figure of several runs: its median, lowest and highest, and how many runs."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def spread(fig: dict[str, float] | None, spec: str = ".0f") -> str:
    """``median [min-max]``, or ``n/a``."""
    if not fig:
        return "n/a"
    med, lo, hi = (format(fig[k], spec) for k in ("median", "min", "max"))
    return med if fig["runs"] == 1 else f"{med} [{lo}-{hi}]"


def paired_ratios(runs: dict[str, list[float]], name: str) -> dict[str, float] | None:
    """``name``'s awaits/s over busy polling's, round by round: median, min, max, runs. Rounds
    where polling counted nothing are left out; None if that leaves none."""
    ratios = [a / p for a, p in zip(runs[name], runs["poll0"], strict=True) if p > 0]
    return over_runs(ratios) if ratios else None
