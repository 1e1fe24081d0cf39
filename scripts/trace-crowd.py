#!/usr/bin/env python3
"""When do a parked crowd's completions reach the loop, and how long does waking it take?

Runs the benchmark's parked crowd (10,000 coroutines on 64 streams, one 1.5 s kernel each; see
``Bench.many``) with aiocudasem, then with busy polling, then twice more with aiocudasem, each
with and without the full garbage collection that the benchmark runs once the crowd has
started. For aiocudasem it also logs each batch of host-function tokens that the notifier
delivers: when, in milliseconds after the kernels' end, and how many. On the GPU machine:

    bash scripts/device.sh --smoke scripts/trace-crowd.py

or, with the package importable, ``python3 scripts/trace-crowd.py`` (``AIOCUDASEM_DRIVER=sim``
for the simulated device, whose host functions need the GIL and so arrive later).
"""

from __future__ import annotations

import os
import time

import anyio

import aiocudasem as acs
from aiocudasem._notifier._loop import Notifier
from aiocudasem.cli.bench._approaches import Aiocudasem, Approach, PollSleep0
from aiocudasem.cli.bench._measure import PARKED_KERNEL_NS, Bench

batches: list[tuple[float, int]] = []
_complete = Notifier._complete


def _traced(self: Notifier, tokens: list[int]) -> None:
    batches.append((time.perf_counter(), len(tokens)))
    _complete(self, tokens)


Notifier._complete = _traced  # type: ignore[method-assign]


async def main() -> None:
    drv = acs.get_driver(os.environ.get("AIOCUDASEM_DRIVER") or "cuda")
    b = Bench(drv, False)
    approaches: list[tuple[str, Approach]] = [
        ("aiocudasem", Aiocudasem(drv)),
        ("poll", PollSleep0(drv)),
        ("aiocudasem", Aiocudasem(drv)),
        ("aiocudasem", Aiocudasem(drv)),
    ]
    for name, ap in approaches:
        for collect in (True, False):
            batches.clear()
            t0 = time.perf_counter()
            r = await b.many(ap, kernel_ns=PARKED_KERNEL_NS, collect=collect)
            end = t0 + PARKED_KERNEL_NS / 1e9
            print(
                f"{name:10} collect={collect!s:5} p50 {r['after_end_p50_us'] / 1e3:6.1f} ms "
                f"p99 {r['after_end_p99_us'] / 1e3:6.1f} ms, "
                f"collection ended before the kernels: {r['collected_before_end']}",
                flush=True,
            )
            if batches:
                when = [(round((t - end) * 1e3, 1), n) for t, n in batches]
                print(
                    f"   {len(when)} token batches, {sum(n for _, n in when)} tokens "
                    f"(ms after the end, count): {when[:8]}{' ...' if len(when) > 8 else ''}",
                    flush=True,
                )


if __name__ == "__main__":
    anyio.run(main)
