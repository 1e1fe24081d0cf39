"""Shared by the benchmark modules: units, progress lines, percentiles."""

from __future__ import annotations

import os

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
