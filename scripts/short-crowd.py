#!/usr/bin/env python3
"""The benchmark's short crowd alone, many times over: 10,000 coroutines await 64 streams that
each ran one 20 ms kernel (``Bench.many``), for busy polling, the checkpoint floor and
aiocudasem, in an order that rotates from round to round, with nothing measured in between.

The benchmark measures the same crowd once per round, after each approach's other figures;
this script shows what the crowd costs each approach by itself. Each line gives the median and
p99 from the launches, the garbage collector's full collections and milliseconds during the
crowd, what the library's notifier did meanwhile (host functions fired, waits completed), and
the CPU time of every other thread of the process that ran. PyTorch and CuPy are imported
first, where they are installed, as in the benchmark's process: the collector's full
collections scan their objects too. On the GPU machine:

    ROUNDS=9 bash scripts/device.sh --smoke scripts/short-crowd.py

or, with the package importable, ``ROUNDS=3 python3 scripts/short-crowd.py``
(``AIOCUDASEM_DRIVER=sim`` for the simulated device).
"""

from __future__ import annotations

import contextlib
import os
import statistics

import anyio

with contextlib.suppress(ImportError):
    import cupy  # noqa: F401  (the benchmark's heap)
with contextlib.suppress(ImportError):
    import torch  # noqa: F401

import aiocudasem as acs
from aiocudasem.cli.bench._approaches import Aiocudasem, CheckpointFloor, PollSleep0
from aiocudasem.cli.bench._common import thread_cpu
from aiocudasem.cli.bench._measure import Bench
from aiocudasem.lowlevel import statistics as notifier_statistics


def _threads() -> dict[int, tuple[str, int]]:
    """Every thread of this process by id: its name as the kernel has it (the driver's threads
    included) and nanoseconds on a CPU so far."""
    out = {}
    for tid, (name, ns) in thread_cpu().items():
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
        out[tid] = (name, ns)
    return out


async def main() -> None:
    drv = acs.get_driver()
    b = Bench(drv, quick=False)
    approaches = [PollSleep0(drv), CheckpointFloor(drv), Aiocudasem(drv)]
    for ap in approaches:  # warm-up: the library's notifier and side streams exist after it
        await b.many(ap, waiters=500)
    medians: dict[str, list[float]] = {}
    rounds = int(os.environ.get("ROUNDS", "9"))
    main_thread = os.getpid()
    for r in range(rounds):
        k = r % len(approaches)
        for ap in approaches[k:] + approaches[:k]:
            s0, t0 = notifier_statistics(), _threads()
            m = await b.many(ap)
            s1, t1 = notifier_statistics(), _threads()
            others = {
                name: round((ns - t0.get(tid, ("", 0))[1]) / 1e6, 1)
                for tid, (name, ns) in t1.items()
                if tid != main_thread and ns != t0.get(tid, ("", 0))[1]
            }
            medians.setdefault(ap.name, []).append(m["p50_us"] / 1e3)
            print(
                f"r{r} {ap.name:11} p50 {m['p50_us'] / 1e3:6.0f} p99 {m['p99_us'] / 1e3:6.0f} "
                f"full {m['gc_full']} gc {m['gc_ms']:4.0f} ms "
                f"fired {s1.fired - s0.fired} completed {s1.completed - s0.completed} "
                f"other threads ms {others}",
                flush=True,
            )
    for name, p50s in medians.items():
        print(name, "median", round(statistics.median(p50s)), sorted(round(x) for x in p50s))


if __name__ == "__main__":
    anyio.run(main)
