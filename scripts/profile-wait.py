#!/usr/bin/env python3
"""Where the time of one ``await stream.wait_complete()`` goes, next to busy polling.

The benchmark's throughput loop (one task per stream: launch an empty kernel, await it), on
1 and 8 streams, on asyncio and trio, in three passes per approach:

- timed: awaits per second, nothing instrumented. Besides busy polling (query, then
  ``sleep(0)`` until idle) and aiocudasem, a *floor*: the loop's checkpoint, then a query,
  repeated until idle, with no library code around it. That is what any await that is a
  checkpoint and asks the driver costs; the library's own work per await is the distance to
  it;
- counted: checkpoints (yields to the loop, those of asyncio's C awaitables included), events
  recorded (the stream was still busy after the first checkpoint) and parks (host functions
  armed) per await;
- the parts: each step of an await timed alone with ``timeit``, on the same driver.

It also reports how long an empty kernel takes from its launch to the stream going idle, timed
by querying without yielding: that decides how many checkpoints a wait needs. On the GPU
machine:

    bash scripts/device.sh --smoke scripts/profile-wait.py

or, with the package importable, ``python3 scripts/profile-wait.py [--driver sim]``. The report
goes to stdout and, when ``$OUT`` is set, to ``$OUT/profile-wait.txt``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import timeit
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

import aiocudasem as acs
from aiocudasem import _stream
from aiocudasem._notifier._loop import current_notifier
from aiocudasem._notifier._pools import give_back, take_event
from aiocudasem.cli.bench._measure import _rotated
from aiocudasem.testing import workloads

lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def sleep0() -> Callable[[], Awaitable[Any]]:
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.checkpoint
    return lambda: asyncio.sleep(0)


class Probe:
    def __init__(self, drv: acs.Driver) -> None:
        self.drv = drv
        self.work = workloads(drv)
        self.handles = [drv.stream_create(0, True, 0) for _ in range(8)]
        self.streams = {h: acs.Stream.adopt(h, driver=drv) for h in self.handles}

    def launch(self, h: int) -> None:
        self.work.launch_spin(h, 0)

    async def loop(self, kind: str, n: int, seconds: float, counted: bool) -> dict[str, float]:
        hs = self.handles[:n]
        drv, launch = self.drv, self.launch
        count = yields = 0
        nf = current_notifier()
        parks = records = 0
        saved_checkpoint, saved_arm = nf.checkpoint, nf._arm
        saved_c = _stream._wait_complete
        had_record = "event_record" in vars(drv)  # the real driver binds its C call there
        saved_record = drv.event_record
        if counted:

            def counting_record(event: int, stream: int) -> None:
                nonlocal records
                records += 1
                saved_record(event, stream)

            drv.event_record = counting_record  # type: ignore[method-assign]

            def counting_checkpoint() -> Awaitable[Any]:
                nonlocal yields
                yields += 1
                return saved_checkpoint()

            def counting_arm(point: Any) -> None:
                nonlocal parks
                parks += 1
                saved_arm(point)

            def counting_c(make: Callable[..., Any]) -> Callable[..., Any]:
                """asyncio's checkpoints are bare yields from C, past nf.checkpoint (in
                wait_complete() and in the spin of its busy path): counted around it, in this
                pass only. A park yields a future, not None, and is counted apart."""

                @types.coroutine
                def counted(*args: Any) -> Any:
                    nonlocal yields
                    it = make(*args).__await__()
                    sent: Any = None
                    thrown: BaseException | None = None
                    while True:  # `yield from it`, counting
                        try:
                            out = it.send(sent) if thrown is None else it.throw(thrown)
                        except StopIteration as stop:
                            return stop.value
                        thrown = None
                        if out is None:
                            yields += 1
                        try:
                            sent = yield out
                        except BaseException as exc:
                            sent, thrown = None, exc

                return counted

            nf._arm = counting_arm  # type: ignore[method-assign]
            if nf.bare_yield:  # each bare yield once, the Python paths' included
                _stream._wait_complete = counting_c(saved_c)
            else:
                nf.checkpoint = counting_checkpoint  # type: ignore[method-assign]
        sl = sleep0()
        deadline = time.perf_counter() + seconds

        async def poll(h: int) -> None:
            nonlocal count, yields
            q = drv.stream_query
            while time.perf_counter() < deadline:
                launch(h)
                while not q(h):
                    if counted:
                        yields += 1
                    await sl()
                count += 1

        checkpoint = nf.checkpoint

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

        t0 = time.perf_counter()
        try:
            async with anyio.create_task_group() as tg:
                for h in hs:
                    tg.start_soon({"poll": poll, "floor": floor}.get(kind, lib), h)
        finally:
            nf.checkpoint, nf._arm = saved_checkpoint, saved_arm  # type: ignore[method-assign]
            _stream._wait_complete = saved_c
            if had_record:
                drv.event_record = saved_record  # type: ignore[method-assign]
            else:
                vars(drv).pop("event_record", None)
        dt = time.perf_counter() - t0
        return {
            "per_s": count / dt,
            "us": dt / max(count, 1) * 1e6,
            "yields": yields / max(count, 1),
            "parks": parks / max(count, 1),
            "records": records / max(count, 1),
        }

    def kernel_idle_us(self, reps: int = 2000) -> list[float]:
        """From launching an empty kernel to cuStreamQuery seeing the stream idle, no yields."""
        h, q, out = self.handles[0], self.drv.stream_query, []
        for _ in range(reps):
            t0 = time.perf_counter()
            self.launch(h)
            while not q(h):
                pass
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    def launch_us(self, reps: int = 20000) -> float:
        h = self.handles[1]
        t = min(timeit.repeat(lambda: self.launch(h), number=reps, repeat=3)) / reps * 1e6
        self.drv.stream_synchronize(h)
        return t

    async def parts(self) -> list[tuple[str, float]]:
        drv, h = self.drv, self.handles[2]
        s = self.streams[h]
        await s.wait_complete()
        pool = s._events
        ev = take_event(drv, 0, pool)
        drv.event_record(ev, h)
        drv.stream_synchronize(h)
        reps = 100_000

        def t(fn: Callable[[], Any]) -> float:
            return min(timeit.repeat(fn, number=reps, repeat=3)) / reps * 1e6

        def record_cycle() -> None:
            e = take_event(drv, 0, pool)
            drv.event_record(e, h)
            give_back(drv, pool, e)

        out = [
            ("current_notifier()", t(current_notifier)),
            ("take_event + event_record + give_back", t(record_cycle)),
            ("event_query (done)", t(lambda: drv.event_query(ev))),
            ("stream_query (idle)", t(lambda: drv.stream_query(h))),
            ("History.learn() (the stream's wait history)", t(lambda: s._history.learn(5e-6))),
            ("History.spin_window()", t(s._history.spin_window)),
        ]
        give_back(drv, pool, ev)

        async def per_await(make: Callable[[], Awaitable[Any]], k: int = 50_000) -> float:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(k):
                    await make()
                best = min(best, (time.perf_counter() - t0) / k * 1e6)
            return best

        checkpoint = await per_await(sleep0())
        out.append(("the loop's checkpoint (sleep(0) / trio checkpoint)", checkpoint))
        out.append(("anyio.lowlevel.checkpoint()", await per_await(anyio.lowlevel.checkpoint)))

        # The library's own cost per await, without kernels: an idle stream, so that every
        # await is one checkpoint and one query. The floor makes the same checkpoint (the
        # library's) and query with no library code. Alternated, the median of seven each.
        lib_checkpoint, query = current_notifier().checkpoint, drv.stream_query

        async def floor() -> None:
            await lib_checkpoint()
            query(h)

        pairs: dict[str, list[float]] = {"floor": [], "lib": []}
        for _ in range(7):
            pairs["floor"].append(await per_await(floor, 20_000))
            pairs["lib"].append(await per_await(s.wait_complete, 20_000))
        f, lib = statistics.median(pairs["floor"]), statistics.median(pairs["lib"])
        out.append(("floor: the library's checkpoint + stream_query, idle", f))
        out.append(("await wait_complete(), idle stream", lib))
        diffs = sorted(b - a for a, b in zip(pairs["floor"], pairs["lib"], strict=True))
        out.append(("  the library's own, per await (median of 7 pairs)", statistics.median(diffs)))
        pairs_us = ", ".join(f"{d:.2f}" for d in diffs)
        say(f"  library over floor, idle stream, the 7 pairs: {pairs_us} us")
        return out


async def run_backend(probe: Probe, seconds: float, rounds: int) -> None:
    import sniffio

    name = sniffio.current_async_library()
    say(f"\n== {name}")
    for label, us in await probe.parts():
        say(f"  {label:52} {us:7.3f} us")
    for n in (1, 8):
        for counted in (False, True):
            kinds = ("poll", "floor", "aiocudasem") if not counted else ("poll", "aiocudasem")
            res: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
            for r in range(rounds if not counted else 1):
                for kind in _rotated(list(res), r):
                    res[kind].append(await probe.loop(kind, n, seconds, counted))
            if not counted:
                for other in ("poll", "floor"):
                    ratios = sorted(
                        a["per_s"] / b["per_s"]
                        for a, b in zip(res["aiocudasem"], res[other], strict=True)
                    )
                    say(
                        f"  paired  {n} stream(s) aiocudasem / {other}: median "
                        f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}] "
                        f"over {len(ratios)} rounds"
                    )
            for kind, runs in res.items():
                med = statistics.median(r["per_s"] for r in runs)
                lo, hi = min(r["per_s"] for r in runs), max(r["per_s"] for r in runs)
                us = statistics.median(r["us"] for r in runs)
                extra = ""
                if counted:
                    r = runs[0]
                    extra = (
                        f"  per await: yields {r['yields']:.2f}, events {r['records']:.2f}, "
                        f"parks {r['parks']:.4f}"
                    )
                tag = "counted" if counted else "timed  "
                say(
                    f"  {tag} {n} stream(s) {kind:10} {med / 1e3:6.1f}k/s "
                    f"[{lo / 1e3:.1f}-{hi / 1e3:.1f}] {us:6.2f} us/await{extra}"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", default=None, help="cuda (default) or sim")
    ap.add_argument("--seconds", type=float, default=0.2, help="per throughput figure")
    ap.add_argument("--rounds", type=int, default=9, help="timed rounds, interleaved")
    args = ap.parse_args()
    drv = acs.get_driver(args.driver or os.environ.get("AIOCUDASEM_DRIVER") or "cuda")
    probe = Probe(drv)
    say(f"driver {drv.name}, python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}")
    probe.launch(probe.handles[0])
    drv.stream_synchronize(probe.handles[0])
    idle = sorted(probe.kernel_idle_us())
    say(
        f"empty kernel, launch to stream idle (no yields): p10 {idle[len(idle) // 10]:.1f} "
        f"p50 {idle[len(idle) // 2]:.1f} p90 {idle[len(idle) * 9 // 10]:.1f} us"
    )
    say(f"one launch (the benchmark's, through ctypes): {probe.launch_us():.2f} us")
    for backend in ("asyncio", "trio"):
        anyio.run(run_backend, probe, args.seconds, args.rounds, backend=backend)
    out = os.environ.get("OUT")
    if out:
        Path(out, "profile-wait.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
