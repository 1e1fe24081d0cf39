#!/usr/bin/env python3
"""How a parked crowd wakes: percentiles of 10,000 coroutines' wake-ups after their kernels end,
for busy polling and for aiocudasem, interleaved.

Each crowd is the benchmark's parked crowd (10,000 coroutines dealt round-robin over 64 streams,
one 1.5 s kernel each, a full garbage collection once all have started; see ``Bench.many``).
For aiocudasem it also prints each batch of host-function tokens that the notifier delivered:
when (ms after the kernels' end), how many, and how long finishing their points took. On the
GPU machine:

    bash scripts/device.sh --smoke scripts/crowd-wake.py

or, with the package importable, ``python3 scripts/crowd-wake.py [ROUNDS] [VARIANTS]``, for
example ``python3 scripts/crowd-wake.py 4 lib`` (the default). Variants of the library's crowd,
comma-separated: ``lib``, as it is; ``busy``, with the loop's thread kept busy in Python until
1 ms before the kernels end, so that a thread that has not slept wakes the crowd; ``warm``, with
a full garbage collection 0.1 s before the end, which reads every object of the crowd; ``late``,
with the loop's thread kept busy until every host function has run (see ``crowd()``);
``nowatch``, without the fault watchdog's thread. Each line gives the CPU the loop's thread ran
on 0.2 s before the end and at the first wake-up, the cost per coroutine of the wake-ups, how
long a fixed loop of Python arithmetic took before and after (the CPU's speed at the time), and
the threads that ran meanwhile, and the garbage collector's pauses from 50 ms before the end
to the last wake-up. To compare two versions of the library, see
``scripts/crowd-ab.py``.
``AIOCUDASEM_DRIVER=sim`` for the simulated device, whose host functions need the GIL and so
arrive later and spread out.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import anyio

import aiocudasem as acs
from aiocudasem._notifier import _loop
from aiocudasem._workloads import Workloads
from aiocudasem.cli.bench._approaches import Aiocudasem, Approach, PollSleep0
from aiocudasem.cli.bench._measure import PARKED_KERNEL_NS, GcPauses
from aiocudasem.testing import workloads

batches: list[tuple[float, int, float]] = []
_complete = _loop.Notifier._complete


def _traced(self: _loop.Notifier, tokens: list[int]) -> None:
    t = time.perf_counter()
    _complete(self, tokens)
    batches.append((t, len(tokens), time.perf_counter() - t))


_loop.Notifier._complete = _traced  # type: ignore[method-assign]


def _threads() -> dict[int, tuple[str, int, int]]:
    """Every thread of this process: name, nanoseconds on a CPU so far (schedstat), and the CPU
    it last ran on."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/stat") as f:
                cpu = int(f.read().rsplit(")", 1)[1].split()[36])
        except (OSError, IndexError, ValueError):
            continue
        out[int(tid)] = (name, ns, cpu)
    return out


def _siblings(cpu: int) -> str:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _calibrate() -> float:
    """Milliseconds that a fixed loop of Python arithmetic takes now: how fast this CPU runs
    the interpreter at this moment, with no memory of the crowd involved."""
    t = time.perf_counter()
    x = 0
    for i in range(100_000):
        x += i
    return (time.perf_counter() - t) * 1e3


def _cpu() -> int:
    """The CPU this thread runs on now (Linux; -1 elsewhere)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


async def crowd(
    run: Workloads,
    hs: list[int],
    ap: Approach,
    waiters: int = 10_000,
    busy: bool = False,
    warm: bool = False,
    late: bool = False,
) -> str:
    """``busy``: keep the loop's thread busy in Python until 1 ms before the kernels end, so
    that the crowd is woken by a thread that has not slept. ``warm``: run a full garbage
    collection, which reads every object of the crowd, 0.1 s before the kernels end. ``late``:
    keep the loop's thread busy in Python from 1 ms before the kernels end until 20 ms after,
    so that every host function has run before the crowd is woken (as when the benchmark's
    collection runs into the end). Each line gives the microseconds per coroutine from the
    10th to the 90th percentile of the wake-ups, which a late start does not change, and the
    threads of the process that ran more than a millisecond from 50 ms before the end to the
    last wake-up."""
    woke: list[float] = []
    cpus: list[int] = []
    started = 0
    all_started = anyio.Event()

    async def one(h: int) -> None:
        nonlocal started
        started += 1
        if started == waiters:
            all_started.set()
        await ap.wait(h)
        if not woke:
            cpus.append(_cpu())
        woke.append(time.perf_counter())

    batches.clear()
    pauses = GcPauses()
    t0 = time.perf_counter()
    for h in hs:
        run.launch_spin(h, PARKED_KERNEL_NS)
    async with anyio.create_task_group() as tg:
        for i in range(waiters):
            tg.start_soon(one, hs[i % len(hs)])
        await all_started.wait()
        gc.collect()
        in_time = time.perf_counter() - t0 < PARKED_KERNEL_NS / 1e9
        end = t0 + PARKED_KERNEL_NS / 1e9
        await anyio.sleep(max(0.0, end - 0.2 - time.perf_counter()))
        cpus.append(_cpu())
        if warm:
            await anyio.sleep(max(0.0, end - 0.1 - time.perf_counter()))
            gc.collect()
        while busy and time.perf_counter() < end - 0.001:
            pass
        await anyio.sleep(max(0.0, end - 0.05 - time.perf_counter()))
        speed = [_calibrate()]
        before = _threads()
        pauses.__enter__()
        if late:
            while time.perf_counter() < end + 0.02:
                pass
    pauses.__exit__()
    after = _threads()
    speed.append(_calibrate())
    woke.sort()
    ran = []
    for tid, (name, ns, cpu) in after.items():
        took = ns - before.get(tid, (name, 0, cpu))[1]
        if took > 1_000_000:
            ran.append(f"{name}@{cpu}({_siblings(cpu)}) {took / 1e6:.1f} ms")

    def at(p: float) -> str:
        return f"{(woke[min(len(woke) - 1, int(len(woke) * p))] - end) * 1e3:.1f}"

    out = (
        f"all parked and collected before the end: {in_time}; ms after the end: p1 {at(0.01)} "
        f"p10 {at(0.1)} p25 {at(0.25)} p50 {at(0.5)} p75 {at(0.75)} p90 {at(0.9)} "
        f"p99 {at(0.99)} last {at(1.0)}; CPU before / at the first wake-up: {cpus}"
    )
    n = len(woke)
    rate = (woke[int(n * 0.9)] - woke[int(n * 0.1)]) / (int(n * 0.9) - int(n * 0.1)) * 1e6
    out += (
        f"\n      {rate:.2f} us per coroutine (p10 to p90); a fixed Python loop took "
        f"{speed[0]:.2f} ms before the end, {speed[1]:.2f} after the wake-ups; threads that ran: "
        + "; ".join(ran)
        + f"; the collector from 50 ms before the end to the last wake-up: "
        f"{pauses.all_s * 1e3:.1f} ms, {pauses.full} full ({pauses.full_s * 1e3:.1f} ms)"
    )
    if batches:
        shown = [(round((t - end) * 1e3, 1), n, round(d * 1e3, 2)) for t, n, d in batches[:6]]
        out += f"\n      token batches (ms after the end, tokens, ms to finish them): {shown}"
    return out


async def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    variants = (sys.argv[2] if len(sys.argv) > 2 else "lib").split(",")
    known = ("lib", "busy", "warm", "late", "nowatch")
    for v in variants:
        if v not in known:
            raise SystemExit(f"unknown variant {v!r}: use {', '.join(known)}")
    drv = acs.get_driver(os.environ.get("AIOCUDASEM_DRIVER") or "cuda")
    run = workloads(drv)
    hs = [drv.stream_create(0, True, 0) for _ in range(64)]
    library, poll = Aiocudasem(drv), PollSleep0(drv)
    kinds: list[tuple[str, Approach, str]] = [("poll", poll, "")]
    kinds += [("aiocudasem" + ("" if v == "lib" else f", {v}"), library, v) for v in variants]
    print(f"warm-up: {await crowd(run, hs, library, 1000)}", flush=True)
    for r in range(rounds):
        k = r % len(kinds)
        for name, ap, how in kinds[k:] + kinds[:k]:
            watch = _loop._watchdog.add, _loop._watchdog.remove
            if how == "nowatch":
                _loop._watchdog.add = _loop._watchdog.remove = lambda *a: None  # type: ignore[method-assign]
            try:
                woken = await crowd(
                    run, hs, ap, busy=how == "busy", warm=how == "warm", late=how == "late"
                )
            finally:
                _loop._watchdog.add, _loop._watchdog.remove = watch  # type: ignore[method-assign]
            print(f"{name:20} {woken}", flush=True)


if __name__ == "__main__":
    anyio.run(main)
