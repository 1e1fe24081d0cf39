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


async def crowd(run: Workloads, hs: list[int], ap: Approach, waiters: int = 10_000) -> str:
    woke: list[float] = []
    started = 0
    all_started = anyio.Event()

    async def one(h: int) -> None:
        nonlocal started
        started += 1
        if started == waiters:
            all_started.set()
        await ap.wait(h)
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
    woke.sort()

    def at(p: float) -> str:
        return f"{(woke[min(len(woke) - 1, int(len(woke) * p))] - end) * 1e3:.1f}"

    out = (
        f"all parked and collected before the end: {in_time}; ms after the end: p1 {at(0.01)} "
        f"p10 {at(0.1)} p25 {at(0.25)} p50 {at(0.5)} p75 {at(0.75)} p90 {at(0.9)} "
        f"p99 {at(0.99)} last {at(1.0)}"
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
    kinds: list[tuple[str, Approach, int]] = [("poll", poll, 0)]
    kinds += [(f"relay {r}", library, 10**9 if r == "all" else int(r)) for r in relays]
    default = _loop._RELAY
    print(f"warm-up: {await crowd(run, hs, library, 1000)}", flush=True)
    try:
        for r in range(rounds):
            k = r % len(kinds)
            for name, ap, relay in kinds[k:] + kinds[:k]:
                _loop._RELAY = relay or default
                _loop._RELAY_LOW = _loop._RELAY // 4
                print(f"{name:11} {await crowd(run, hs, ap)}", flush=True)
    finally:
        _loop._RELAY, _loop._RELAY_LOW = default, default // 4


if __name__ == "__main__":
    anyio.run(main)
