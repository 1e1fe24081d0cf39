"""Shared by the benchmark modules: units, progress lines, percentiles, a figure over several
runs (median [min-max]), the event loops, the order of a round, paired differences and the
garbage collector around a timed window."""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final, TypeVar

T = TypeVar("T")

US = 1e-6
KERNEL_NS = 100_000  # the 100 us kernel of the latency benchmark
#: The loop's other work (the service and stages sections): a pass, in microseconds of pure
#: Python.
WORK_US = 50


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


def busy(n: int) -> int:
    """Pure-Python work: ``n`` turns of a small loop."""
    x = 0
    for i in range(n):
        x += i & 7
    return x


def calibrate(us: float = WORK_US) -> int:
    """The turns of :func:`busy` that take about ``us`` microseconds here (the median of a few
    tries)."""
    n = 2000
    tries = []
    for _ in range(7):
        t0 = time.perf_counter()
        busy(n)
        tries.append(time.perf_counter() - t0)
    per_turn = statistics.median(tries) / n
    return max(1, round(us * 1e-6 / per_turn))


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
    """``median [min-max]``, or ``n/a``; for a signed ``spec`` (``+.1f``), ``median [min to
    max]``, where a minus sign would read as the dash."""
    if not fig:
        return "n/a"
    med, lo, hi = (format(fig[k], spec) for k in ("median", "min", "max"))
    if fig["runs"] == 1:
        return med
    return f"{med} [{lo} to {hi}]" if spec.startswith("+") else f"{med} [{lo}-{hi}]"


def paired_ratios(runs: dict[str, list[float]], name: str) -> dict[str, float] | None:
    """``name``'s awaits/s over busy polling's, round by round: median, min, max, runs. Rounds
    where polling counted nothing are left out; None if that leaves none."""
    ratios = [a / p for a, p in zip(runs[name], runs["poll0"], strict=True) if p > 0]
    return over_runs(ratios) if ratios else None


# ---------------------------------------------------------------- order, pairing, the collector

#: The event loops the benchmark measures, in its order: asyncio's own, asyncio on uvloop, trio.
LOOPS: Final = ("asyncio", "uvloop", "trio")


def loop_backend(loop: str) -> str:
    """The name :func:`aiocudasem.cli._common.missing_loop` knows ``loop`` by."""
    return "asyncio+uvloop" if loop == "uvloop" else loop


def run_on(loop: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``anyio.run(fn, *args)`` on ``loop`` (one of :data:`LOOPS`)."""
    import anyio

    if loop == "trio":
        return anyio.run(fn, *args, backend="trio")
    return anyio.run(fn, *args, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})


def latin_row(n: int, r: int) -> list[int]:
    """Row ``r`` of a balanced Latin square of order ``n`` (Williams' design): a permutation of
    ``range(n)``, the order of round ``r``.

    Over ``n`` consecutive rounds (from a multiple of ``n``) every item takes every position
    once, so a drift of the machine over a run falls on every item alike. The square is also
    balanced for what comes just before: for even ``n`` every item follows every other item
    once in ``n`` rounds; for odd ``n`` the ``n`` rows are followed by their mirror images, and
    in ``2 n`` rounds every item follows every other twice. A plain rotation (each round
    starting one place later) is a Latin square too, but in it the same item always follows
    a given one, and whatever the earlier one leaves behind (a warm cache, a collector debt, a
    clock raised by a busy core) always lands on the same neighbour. With fewer rounds than
    items every round still takes a different row."""
    if n <= 0:
        return []
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, 3, ...
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    k = r % (n if n % 2 == 0 else 2 * n)
    if k < n:
        return [(x + k) % n for x in first]
    return [(x + k - n) % n for x in first][::-1]


def balanced(items: Sequence[T], r: int) -> list[T]:
    """``items`` in round ``r``'s order (:func:`latin_row`)."""
    return [items[i] for i in latin_row(len(items), r)]


def paired_differences(xs: Sequence[float], refs: Sequence[float]) -> list[float]:
    """``x - ref`` for each pair: each ``x`` measured in the same round as its ``ref``, so that
    what drifts between rounds (the clock, the other tenants of the machine) falls on both."""
    if len(xs) != len(refs):
        raise ValueError(f"{len(xs)} figures for {len(refs)} references: not paired")
    return [x - ref for x, ref in zip(xs, refs, strict=True)]


def differences(xs: Sequence[float], refs: Sequence[float]) -> dict[str, float]:
    """The median and p99 of the paired differences ``xs - refs``, and how many there are."""
    d = paired_differences(xs, refs)
    if not d:
        return {"n": 0}
    return {"median": statistics.median(d), "p99": pct(d, 99), "n": len(d)}


@contextlib.contextmanager
def gc_window(short: bool) -> Iterator[None]:
    """The garbage collector around one timed window, the same for every approach: a full
    collection first, so that no approach inherits the debt of the one measured before it;
    then, for a ``short`` window (latency samples, a curve's rounds, the stall test: seconds at
    most, where one collection landing in one approach's samples and not another's would be
    noise, not a cost of either), the collector off until the window ends, and back on after
    it if it was on. Long windows (throughput, the crowds, the service section) keep it on:
    there an approach's collections are part of what it costs, and each pays for its own."""
    gc.collect()
    was = gc.isenabled()
    if short:
        gc.disable()
    try:
        yield
    finally:
        if short and was:
            gc.enable()
