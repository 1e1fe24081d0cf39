#!/usr/bin/env python3
"""Two versions of the library, side by side: the benchmark's two crowds only.

    python3 scripts/crowd-ab.py BEFORE AFTER [--rounds 4]

BEFORE and AFTER are checkouts (folders holding ``aiocudasem/``; their C extensions are built in
place first). Each round runs one fresh process per checkout, in an order that alternates from
round to round, and each process measures the benchmark's short crowd (10,000 awaiters of
20 ms kernels on 64 streams, from before the launches) and parked crowd (1.5 s kernels, a full
collection once all have started, from the kernels' end) for busy polling, the checkpoint floor
and aiocudasem, in an order that rotates from round to round (``Bench.many``). PyTorch and CuPy
are imported first where they are installed, as in the benchmark, whose heap they set: the short
crowd's figures are mostly the garbage collector's. One line per process, then every figure as
median [min-max] over the rounds. On the GPU machine, with the earlier checkout in
``.device/before``: ``bash scripts/device.sh --smoke scripts/crowd-ab.py`` (the default paths).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NAMES = ["poll0", "checkpoint", "aiocudasem"]
KEYS = ("short_p50", "short_p99", "short_gc_ms", "parked_p50", "parked_p99")


def child(order: list[str]) -> None:
    for m in ("torch", "cupy"):
        try:
            __import__(m)
        except Exception:  # absent or broken: the heap is then the library's own
            pass
    import anyio

    import aiocudasem as acs
    from aiocudasem.cli.bench._approaches import Aiocudasem, CheckpointFloor, PollSleep0
    from aiocudasem.cli.bench._measure import KERNEL_NS, PARKED_KERNEL_NS, Bench

    drv = acs.get_driver(os.environ.get("AIOCUDASEM_DRIVER") or "cuda")
    b = Bench(drv, False)
    aps = {
        "aiocudasem": Aiocudasem(drv),
        "poll0": PollSleep0(drv),
        "checkpoint": CheckpointFloor(drv),
    }
    out = {}

    async def main() -> None:
        for name in order:
            ap = aps[name]
            ap.setup()
            try:
                await b.latency(ap, KERNEL_NS, 20)  # warm-up
                s = await b.many(ap)
                p = await b.many(ap, kernel_ns=PARKED_KERNEL_NS, collect=True)
            finally:
                ap.teardown()
            out[name] = {
                "short_p50": s["p50_us"] / 1e3,
                "short_p99": s["p99_us"] / 1e3,
                "short_gc_full": s["gc_full"],
                "short_gc_ms": s["gc_ms"],
                "parked_p50": p["after_end_p50_us"] / 1e3,
                "parked_p99": p["after_end_p99_us"] / 1e3,
            }

    anyio.run(main)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", nargs="?", default=os.path.join(root, ".device", "before"))
    p.add_argument("after", nargs="?", default=root)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--child", help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child:
        child(ns.child.split(","))
        return 0
    from aiocudasem.cli.bench import _report  # the benchmark's own median [min-max]

    trees = {"before": os.path.abspath(ns.before), "after": os.path.abspath(ns.after)}
    for tree in trees.values():
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=tree,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    res: dict[str, list[dict]] = {"before": [], "after": []}
    t0 = time.monotonic()
    for r in range(ns.rounds):
        order = NAMES[r % 3 :] + NAMES[: r % 3]
        for label in ("before", "after") if r % 2 == 0 else ("after", "before"):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(
                [trees[label]] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x]
            )
            run = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", ",".join(order)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            line = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                print(f"round {r + 1} {label}: failed (rc {run.returncode})\n{run.stderr[-3000:]}")
                continue
            d = json.loads(line[0][7:])
            res[label].append(d)
            print(
                f"[{time.monotonic() - t0:.0f}s] round {r + 1}/{ns.rounds} {label} order={order}: "
                + "; ".join(
                    f"{n} short {d[n]['short_p50']:.0f} ms (gc full {d[n]['short_gc_full']}, "
                    f"{d[n]['short_gc_ms']:.0f} ms), parked {d[n]['parked_p50']:.1f}/"
                    f"{d[n]['parked_p99']:.1f} ms"
                    for n in NAMES
                ),
                flush=True,
            )
    print("\nmedian [min-max] over rounds")
    for key in KEYS:
        for n in NAMES:
            row = []
            for label in ("before", "after"):
                v = [d[n][key] for d in res[label]]
                row.append(f"{label} {_report.spread(_report.over_runs(v) if v else None, '.1f')}")
            print(f"{key:12} {n:11} " + "  ".join(row))
    return 0 if all(len(v) == ns.rounds for v in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
