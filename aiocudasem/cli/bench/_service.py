"""A busy service: many concurrent requests, each awaiting GPU work of its own, on a loop that
has other work to do as well.

``N`` request tasks (64, then 1,000) each loop: launch a spin kernel of a random length,
0.1-2 ms (each task draws from a generator seeded with the task's number, so every approach
gets the same lengths), on one of a pool of 16 streams (task i on stream i mod 16), then await
that kernel. Beside them one more task does about 50 us of pure-Python work, yields, and again,
counting its passes: the loop's other work. Requests share streams, so each awaits its own
kernel through an event recorded right behind it; the approaches differ only in how they await
that event:

- ``aiocudasem``: ``await stream.record().wait()``, the library with its default settings;
- ``poll0``: ``cuEventQuery`` plus ``sleep(0)`` (``trio.lowlevel.checkpoint()`` on trio);
- ``to_thread``: ``cuEventSynchronize`` in the loop's thread pool (``asyncio.to_thread``,
  ``trio.to_thread.run_sync``).

Each cell runs for a fixed time after a short warm-up: requests completed in that window per
second, the p50 and p99 of their latency (launch to the await returning), the process's CPU
time over the window in % of one core (all threads), and the other work's passes per second.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import anyio.lowlevel

import aiocudasem as acs

from ._common import balanced, busy, gc_window, over_runs, pct, say

CONCURRENCY: Final = (64, 1000)
APPROACHES: Final = ("aiocudasem", "poll0", "to_thread")
LABELS: Final = {
    "aiocudasem": "aiocudasem (await stream.record().wait())",
    "poll0": "poll cuEventQuery + sleep(0)",
    "to_thread": "to_thread(cuEventSynchronize)",
}
STREAMS: Final = 16
KERNEL_NS: Final = (100_000, 2_000_000)
SEED: Final = 2026
#: Each cell's window and the warm-up before it, in seconds; a smoke run's.
WINDOW_S: Final = 1.0
WARMUP_S: Final = 0.2
QUICK_WINDOW_S: Final = 0.2
QUICK_WARMUP_S: Final = 0.05


def waiter(name: str, loop: str, drv: acs.Driver) -> Callable[[int], Awaitable[None]]:
    """How approach ``name`` awaits the work just launched on stream ``h``, on ``loop``."""
    if name == "aiocudasem":
        streams: dict[int, acs.Stream] = {}

        async def library(h: int) -> None:
            s = streams.get(h)
            if s is None:
                s = streams[h] = acs.Stream.adopt(h, driver=drv)
            ev = s.record()
            try:
                await ev.wait()
            finally:
                ev.close()

        return library
    if name == "poll0":
        if loop == "trio":
            import trio

            yield_ = trio.lowlevel.checkpoint
        else:
            yield_ = _sleep0

        async def poll(h: int) -> None:
            ev = drv.event_create(0)
            try:
                drv.event_record(ev, h)
                while not drv.event_query(ev):
                    await yield_()
            finally:
                drv.event_destroy(ev)

        return poll
    if name == "to_thread":
        if loop == "trio":
            import trio

            def in_thread(ev: int) -> Awaitable[None]:
                return trio.to_thread.run_sync(drv.event_synchronize, ev)
        else:

            def in_thread(ev: int) -> Awaitable[None]:
                return asyncio.to_thread(drv.event_synchronize, ev)

        async def thread(h: int) -> None:
            ev = drv.event_create(0)
            try:
                drv.event_record(ev, h)
                await in_thread(ev)
            finally:
                drv.event_destroy(ev)

        return thread
    raise ValueError(f"no such approach: {name}")


async def _sleep0() -> None:
    await asyncio.sleep(0)


async def cell(
    wait: Callable[[int], Awaitable[None]],
    launch: Callable[[int, int], None],
    pool: list[int],
    requests: int,
    turns: int,
    window_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """One cell on the running loop: ``requests`` request tasks and the other work for
    ``warmup_s`` then ``window_s`` seconds; then every task finishes its request and stops."""
    stop = False
    window = [float("inf"), float("inf")]  # its start and end, once known
    lat: list[float] = []
    passes = 0
    low, high = KERNEL_NS

    async def request(i: int) -> None:
        rng = random.Random(SEED * 100_003 + i)
        h = pool[i % len(pool)]
        while not stop:
            ns = rng.randint(low, high)
            t0 = time.perf_counter()
            launch(h, ns)
            await wait(h)
            t1 = time.perf_counter()
            if window[0] <= t1 <= window[1]:
                lat.append(t1 - t0)

    async def other_work() -> None:
        nonlocal passes
        while not stop:
            busy(turns)
            if window[0] <= time.perf_counter() <= window[1]:
                passes += 1
            await anyio.lowlevel.checkpoint()

    # A long window: the collector stays on, after a full collection (see gc_window).
    with gc_window(short=False), anyio.fail_after(window_s + warmup_s + 120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other_work)
            for i in range(requests):
                tg.start_soon(request, i)
            await anyio.sleep(warmup_s)
            c0 = time.process_time()
            window[0] = time.perf_counter()
            # A busy loop may end the sleep late: the window is the time it actually took.
            await anyio.sleep(window_s)
            window[1] = time.perf_counter()
            cpu = time.process_time() - c0
            took = window[1] - window[0]
            stop = True
    ms = sorted(x * 1e3 for x in lat)
    return {
        "requests_per_s": len(lat) / took,
        "p50_ms": statistics.median(ms) if ms else None,
        "p99_ms": pct(ms, 99) if ms else None,
        "cpu_pct": 100 * cpu / took,
        "other_work_per_s": passes / took,
        "completed": len(lat),
        "window_s": took,
    }


async def run_service(
    drv: acs.Driver,
    streams: list[int],
    launch: Callable[[int, int], None],
    loop: str,
    quick: bool,
    rounds: int,
    progress: Any,
    turns: int,
    concurrency: tuple[int, ...] = CONCURRENCY,
) -> dict[str, Any]:
    """The service section on the running loop: ``{N: {approach: {"label", "runs"}}}``, each
    run one round's figures, the rounds interleaved (a balanced Latin square's order)."""
    window_s, warmup_s = (QUICK_WINDOW_S, QUICK_WARMUP_S) if quick else (WINDOW_S, WARMUP_S)
    pool = streams[:STREAMS]
    out: dict[str, Any] = {}
    for n in concurrency:
        by_ap: dict[str, Any] = {a: {"label": LABELS[a], "runs": []} for a in APPROACHES}
        out[str(n)] = by_ap
        for r in range(rounds):
            for name in balanced(list(APPROACHES), r):
                progress.step(
                    f"service {loop}, {n} requests, round {r + 1}/{rounds}: {name}",
                    window_s + warmup_s,
                )
                run = await cell(
                    waiter(name, loop, drv), launch, pool, n, turns, window_s, warmup_s
                )
                by_ap[name]["runs"].append({"round": r, **run})
                p50, p99 = run["p50_ms"], run["p99_ms"]
                say(
                    f"  {loop} {n} requests, {name:<10} {run['requests_per_s']:.0f} requests/s, "
                    f"p50 {_ms(p50)} / p99 {_ms(p99)}, CPU {run['cpu_pct']:.0f} %, other work "
                    f"{run['other_work_per_s']:.0f} passes/s"
                )
    return out


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} ms"


#: The figures of a service run, summarized over the rounds.
FIGURES: Final = ("requests_per_s", "p50_ms", "p99_ms", "cpu_pct", "other_work_per_s")


def summarize_service(entry: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {}
    for name in FIGURES:
        values = [r[name] for r in entry.get("runs", []) if r.get(name) is not None]
        if values:
            out[name] = over_runs(values)
    return out
