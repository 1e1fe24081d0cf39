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
from typing import Any

import anyio

import aiocudasem as acs

from ._approaches import ALL
from ._common import say
from ._measure import Bench, run_asyncio, run_trio
from ._report import commit, gpu_info, markdown, plot, summarize, versions


def _parser() -> argparse.ArgumentParser:
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
        "--repeats",
        type=int,
        default=None,
        help="interleaved rounds of every measurement (default: 5; 1 with --quick)",
    )
    p.add_argument(
        "--only", default="", help="comma-separated approach names (sync, the floor, is always run)"
    )
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="also measure 8-stream throughput with the streams dealt over this many devices",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    drv = acs.get_driver(ns.driver)
    if not 1 <= ns.devices <= drv.device_count():
        p.error(f"--devices must be in [1, {drv.device_count()}] on this machine")
    sim = drv.simulated
    say(
        f"benchmarks on {'the SIMULATED device' if sim else drv.device_name(0)} (driver {drv.name})"
    )
    repeats = ns.repeats if ns.repeats is not None else (1 if ns.quick else 5)
    if not 1 <= repeats <= 100:
        p.error("--repeats must be in [1, 100]")
    b = Bench(drv, ns.quick or sim, ns.devices)
    only = {x for x in ns.only.split(",") if x}
    if only:
        only.add("sync")  # the floor every figure is compared with
    aps = [cls(drv) for cls in ALL if not only or cls.name in only]

    async def go_asyncio() -> None:
        await run_asyncio(b, aps, repeats)

    say(f"asyncio: {len(aps)} approaches, {repeats} interleaved round(s)")
    anyio.run(go_asyncio, backend="asyncio")
    gc.collect()
    say(f"trio: 4 approaches, {repeats} interleaved round(s)")
    anyio.run(run_trio, b, repeats, backend="trio")
    write(ns.out, b.results, _meta(drv, ns.devices, repeats))
    return 0


def _meta(drv: acs.Driver, devices: int, repeats: int) -> dict[str, Any]:
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "simulated": drv.simulated,
        "gpu": gpu_info(drv),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "devices": devices,
        "repeats": repeats,
        "commit": commit(),
        "versions": versions(),
    }


def write(out: Path, results: dict[str, Any], meta: dict[str, Any]) -> None:
    """results.json (every run and the summary), performance.md and, if it can, latency.png."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {n: summarize(e) for n, e in results.items() if n != "trio"}
    summary["trio"] = {n: summarize(e) for n, e in results.get("trio", {}).items()}
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "results": results})
    )
    plotted = plot(results, out / "latency.png", meta["simulated"])
    (out / "performance.md").write_text(markdown(results, meta, plotted))
    say(f"wrote {out / 'results.json'}, performance.md" + (", latency.png" if plotted else ""))
    if not plotted:
        say("no latency.png: matplotlib is not installed (pip install 'aiocudasem[bench]')")
    say(markdown(results, meta, plotted))


if __name__ == "__main__":
    sys.exit(main())
