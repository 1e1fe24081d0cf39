"""Side-by-side benchmarks: how fast does async Python learn that GPU work is done?

    aiocudasem bench [--driver cuda|sim] [--out DIR] [--quick] [--only NAMES] [--devices N]

Every approach waits on the same raw CUDA streams (created through the driver seam), with the
same ``%globaltimer`` spin kernel, in one process and one run. Peer libraries (CuPy, PyTorch,
numba-cuda) wrap those streams as external streams, so they wait on exactly the same work.
On the simulated device everything runs too, and every figure is labelled as simulated.

Writes ``results.json``, ``performance.md`` and, with matplotlib installed, ``latency.png`` to
``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
from pathlib import Path

import anyio

import aiocudasem as acs

from ._approaches import ALL
from ._common import say
from ._measure import Bench, run_asyncio, run_trio
from ._report import gpu_info, markdown, plot, versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="aiocudasem bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--driver",
        choices=["cuda", "sim"],
        default=None,
        help="default: $AIOCUDASEM_DRIVER, else cuda",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        help="where results.json, performance.md and latency.png go (default: bench-out)",
    )
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.add_argument(
        "--only", default="", help="comma-separated approach names (sync, the floor, is always run)"
    )
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="also measure 8-stream throughput with the streams dealt over this many devices",
    )
    ns = p.parse_args(argv)
    drv = acs.get_driver(ns.driver)
    if not 1 <= ns.devices <= drv.device_count():
        p.error(f"--devices must be in [1, {drv.device_count()}] on this machine")
    sim = drv.simulated
    say(
        f"benchmarks on {'the SIMULATED device' if sim else drv.device_name(0)} (driver {drv.name})"
    )
    b = Bench(drv, ns.quick or sim, ns.devices)
    only = {x for x in ns.only.split(",") if x}
    if only:
        only.add("sync")  # the floor every figure is compared with
    aps = [cls(drv) for cls in ALL if not only or cls.name in only]

    async def go_asyncio() -> None:
        await run_asyncio(b, aps)

    say("asyncio:")
    anyio.run(go_asyncio, backend="asyncio")
    gc.collect()
    say("trio:")
    anyio.run(run_trio, b, backend="trio")
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "simulated": sim,
        "gpu": gpu_info(drv),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "devices": ns.devices,
        "versions": versions(),
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "results.json").write_text(json.dumps({"meta": meta, "results": b.results}))
    plotted = plot(b.results, ns.out / "latency.png", sim)
    (ns.out / "performance.md").write_text(markdown(b.results, meta, plotted))
    say(f"wrote {ns.out / 'results.json'}, performance.md" + (", latency.png" if plotted else ""))
    if not plotted:
        say("no latency.png: matplotlib is not installed (pip install 'aiocudasem[bench]')")
    say(markdown(b.results, meta, plotted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
