#!/usr/bin/env python3
"""How a parked crowd wakes: percentiles of 10,000 coroutines' wake-ups after their kernels end,
for busy polling and for aiocudasem with several relay run lengths, interleaved.

Each crowd is the benchmark's parked crowd (10,000 coroutines dealt round-robin over 64 streams,
one 1.5 s kernel each, a full garbage collection once all have started; see ``Bench.many``).
For aiocudasem it also prints each batch of host-function tokens that the notifier delivered:
when (ms after the kernels' end), how many, and how long finishing their points took. A relay
of ``all`` wakes each batch's sleepers at once. On the GPU machine:

    bash scripts/device.sh --smoke scripts/crowd-wake.py

or, with the package importable, ``python3 scripts/crowd-wake.py [ROUNDS] [RELAYS]``, for
example ``python3 scripts/crowd-wake.py 4 256,all,1024`` (the default);
``256busy`` is a relay of 256 with the loop's thread kept busy in Python until 1 ms before the
kernels end, so that a thread that has not slept wakes the crowd; ``256warm`` runs a full
garbage collection 0.1 s before the end, which reads every object of the crowd. Each line ends
with the CPU the loop's thread ran on 0.2 s before the end and at the first wake-up.
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
from aiocudasem.cli.bench._measure import PARKED_KERNEL_NS
from aiocudasem.testing import workloads

batches: list[tuple[float, int, float]] = []
_complete = _loop.Notifier._complete


def _traced(self: _loop.Notifier, tokens: list[int]) -> None:
    t = time.perf_counter()
    _complete(self, tokens)
    batches.append((t, len(tokens), time.perf_counter() - t))


_loop.Notifier._complete = _traced  # type: ignore[method-assign]


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
) -> str:
    """``busy``: keep the loop's thread busy in Python until 1 ms before the kernels end, so
    that the crowd is woken by a thread that has not slept. ``warm``: run a full garbage
    collection, which reads every object of the crowd, 0.1 s before the kernels end."""
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
    woke.sort()

    def at(p: float) -> str:
        return f"{(woke[min(len(woke) - 1, int(len(woke) * p))] - end) * 1e3:.1f}"

    out = (
        f"all parked and collected before the end: {in_time}; ms after the end: p1 {at(0.01)} "
        f"p10 {at(0.1)} p25 {at(0.25)} p50 {at(0.5)} p75 {at(0.75)} p90 {at(0.9)} "
        f"p99 {at(0.99)} last {at(1.0)}; CPU before / at the first wake-up: {cpus}"
    )
    if batches:
        shown = [(round((t - end) * 1e3, 1), n, round(d * 1e3, 2)) for t, n, d in batches[:6]]
        out += f"\n      token batches (ms after the end, tokens, ms to finish them): {shown}"
    return out


async def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    relays = (sys.argv[2] if len(sys.argv) > 2 else "256,all,1024").split(",")
    drv = acs.get_driver(os.environ.get("AIOCUDASEM_DRIVER") or "cuda")
    run = workloads(drv)
    hs = [drv.stream_create(0, True, 0) for _ in range(64)]
    library, poll = Aiocudasem(drv), PollSleep0(drv)
    kinds: list[tuple[str, Approach, int, str]] = [("poll", poll, 0, "")]
    for spec in relays:  # "256busy", "256warm": see crowd()
        how = "busy" if spec.endswith("busy") else "warm" if spec.endswith("warm") else ""
        length = spec.removesuffix(how)
        name = f"relay {length}" + (f", {how}" if how else "")
        kinds.append((name, library, 10**9 if length == "all" else int(length), how))
    default = _loop._RELAY
    print(f"warm-up: {await crowd(run, hs, library, 1000)}", flush=True)
    try:
        for r in range(rounds):
            k = r % len(kinds)
            for name, ap, relay, how in kinds[k:] + kinds[:k]:
                _loop._RELAY = relay or default
                _loop._RELAY_LOW = _loop._RELAY // 4
                woken = await crowd(run, hs, ap, busy=how == "busy", warm=how == "warm")
                print(f"{name:17} {woken}", flush=True)
    finally:
        _loop._RELAY, _loop._RELAY_LOW = default, default // 4


if __name__ == "__main__":
    anyio.run(main)
