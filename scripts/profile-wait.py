#!/usr/bin/env python3
"""The library's own cost per ``await stream.wait_complete()``, against a checkpoint floor.

Two measurements, on asyncio and trio, each interleaved round by round (every round starts one
place later in the order, so that drift in the machine falls on every side alike) and reported
as the median over the rounds, with the lowest and highest:

- idle: the awaited stream is already idle, so an await is one checkpoint of the loop and one
  query. The *floor* makes that checkpoint (``asyncio.sleep(0)`` / trio's checkpoint) and that
  query (``Driver.stream_query``) with no library code around them; the distance from the floor
  to ``await stream.wait_complete()`` is the library's own cost per await. Paired round by
  round.
- throughput: the benchmark's loop (one task per stream: launch an empty kernel, await it), on 1
  and 8 streams, in awaits per second: busy polling (query, then checkpoint until idle), the
  floor (checkpoint, then query, until idle) and the library.

It also reports how long an empty kernel takes from its launch to the stream going idle, timed
by querying without yielding: that decides how many checkpoints a wait needs.

It uses only the public API (``aiocudasem``, ``aiocudasem.testing``). The driver is
``--driver``, else ``$AIOCUDASEM_DRIVER``, else ``sim``: on the simulated device it runs on any
machine, which is enough to see a change in the library's own cost. On the GPU machine:

    AIOCUDASEM_DRIVER=cuda bash scripts/device.sh --smoke scripts/profile-wait.py

or, with the package importable, ``python3 scripts/profile-wait.py [--driver cuda] [--rounds
25]``. The report goes to stdout and, when ``$OUT`` is set, to ``$OUT/profile-wait.txt``.

The recorded profiles under benchmarks/ (``profile-wait-*.txt.gz``) came from an earlier version
of this script that also counted checkpoints, events and parks per await and timed the
library's internal steps alone, through private names; it is in the git history (commit
e61255d).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

import aiocudasem as acs
from aiocudasem.testing import workloads

lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def rotated(items: list[str], r: int) -> list[str]:
    """Round ``r``'s order: each round starts one place later."""
    k = r % len(items)
    return items[k:] + items[:k]


def spread(values: list[float], spec: str) -> str:
    """``median [min-max]``."""
    v = sorted(values)
    return f"{statistics.median(v):{spec}} [{v[0]:{spec}}-{v[-1]:{spec}}]"


def loop_checkpoint() -> Callable[[], Awaitable[Any]]:
    """The running loop's own checkpoint: ``asyncio.sleep(0)`` or trio's."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.checkpoint
    return lambda: asyncio.sleep(0)


class Profile:
    def __init__(self, drv: acs.Driver) -> None:
        self.drv = drv
        self.work = workloads(drv)
        self.handles = [drv.stream_create(0, True, 0) for _ in range(8)]
        self.streams = {h: acs.Stream.adopt(h, driver=drv) for h in self.handles}

    def launch(self, h: int) -> None:
        self.work.launch_spin(h, 0)

    def kernel_idle_us(self, reps: int = 2000) -> list[float]:
        """From launching an empty kernel to the stream query seeing it idle, no yields."""
        h, q, out = self.handles[0], self.drv.stream_query, []
        for _ in range(reps):
            t0 = time.perf_counter()
            self.launch(h)
            while not q(h):
                pass
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    async def idle_us(self, kind: str, k: int) -> float:
        """Microseconds per await on an idle stream: the floor or the library."""
        h = self.handles[1]
        checkpoint, query, s = loop_checkpoint(), self.drv.stream_query, self.streams[h]
        t0 = time.perf_counter()
        if kind == "floor":
            for _ in range(k):
                await checkpoint()
                query(h)
        else:
            for _ in range(k):
                await s.wait_complete()
        return (time.perf_counter() - t0) / k * 1e6

    async def throughput(self, kind: str, n: int, seconds: float) -> float:
        """Awaits per second of ``n`` tasks, each launching an empty kernel and awaiting it."""
        drv, launch, checkpoint = self.drv, self.launch, loop_checkpoint()
        deadline = time.perf_counter() + seconds
        count = 0

        async def poll(h: int) -> None:
            nonlocal count
            q = drv.stream_query
            while time.perf_counter() < deadline:
                launch(h)
                while not q(h):
                    await checkpoint()
                count += 1

        async def floor(h: int) -> None:
            nonlocal count
            q = drv.stream_query
            while time.perf_counter() < deadline:
                launch(h)
                await checkpoint()
                while not q(h):
                    await checkpoint()
                count += 1

        async def lib(h: int) -> None:
            nonlocal count
            s = self.streams[h]
            while time.perf_counter() < deadline:
                launch(h)
                await s.wait_complete()
                count += 1

        task = {"poll": poll, "floor": floor, "aiocudasem": lib}[kind]
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for h in self.handles[:n]:
                tg.start_soon(task, h)
        return count / (time.perf_counter() - t0)


async def run_backend(
    prof: Profile, seconds: float, rounds: int, awaits: int, idle_only: bool
) -> None:
    import sniffio

    say(f"\n== {sniffio.current_async_library()}")
    await prof.streams[prof.handles[1]].wait_complete()
    idle: dict[str, list[float]] = {"floor": [], "aiocudasem": []}
    for r in range(rounds):
        for kind in rotated(list(idle), r):
            idle[kind].append(await prof.idle_us(kind, awaits))
    for kind, us in idle.items():
        say(f"  idle stream, {kind:10} {spread(us, '.3f')} us/await")
    own = [b - a for a, b in zip(idle["floor"], idle["aiocudasem"], strict=True)]
    say(f"  the library's own cost per await (paired, {rounds} rounds): {spread(own, '.3f')} us")
    for n in () if idle_only else (1, 8):
        res: dict[str, list[float]] = {"poll": [], "floor": [], "aiocudasem": []}
        for r in range(rounds):
            for kind in rotated(list(res), r):
                res[kind].append(await prof.throughput(kind, n, seconds))
        for kind, per_s in res.items():
            say(f"  {n} stream(s) {kind:10} {spread([x / 1e3 for x in per_s], '.1f')}k awaits/s")
        for other in ("poll", "floor"):
            ratios = [a / b for a, b in zip(res["aiocudasem"], res[other], strict=True) if b > 0]
            if ratios:
                say(f"  {n} stream(s) aiocudasem / {other}: {spread(ratios, '.2f')} (paired)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", default=None, help="sim or cuda (default: $AIOCUDASEM_DRIVER, sim)")
    ap.add_argument("--rounds", type=int, default=25, help="interleaved rounds (at least 25)")
    ap.add_argument("--seconds", type=float, default=0.1, help="per throughput figure")
    ap.add_argument("--awaits", type=int, default=20_000, help="awaits per idle-stream figure")
    ap.add_argument(
        "--idle-only",
        action="store_true",
        help="only the idle-stream figures (for A/B runs of two trees, interleaved by a driver)",
    )
    args = ap.parse_args()
    if args.rounds < 25:
        ap.error("--rounds must be at least 25: fewer rounds leave the median to the noise")
    drv = acs.get_driver(args.driver or os.environ.get(acs.DRIVER_ENV, "").strip() or "sim")
    prof = Profile(drv)
    say(f"driver {drv.name}, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}")
    prof.launch(prof.handles[0])
    drv.stream_synchronize(prof.handles[0])
    if not args.idle_only:
        idle = sorted(prof.kernel_idle_us())
        say(
            f"empty kernel, launch to stream idle (no yields): p10 {idle[len(idle) // 10]:.1f} "
            f"p50 {idle[len(idle) // 2]:.1f} p90 {idle[len(idle) * 9 // 10]:.1f} us"
        )
    for backend in ("asyncio", "trio"):
        anyio.run(
            run_backend,
            prof,
            args.seconds,
            args.rounds,
            args.awaits,
            args.idle_only,
            backend=backend,
        )
    out = os.environ.get("OUT")
    if out:
        Path(out, "profile-wait.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
