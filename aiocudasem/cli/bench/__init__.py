"""``aiocudasem bench``: the side-by-side benchmarks. What they measure, print and write is
in ``_DESCRIPTION`` below, which ``aiocudasem bench --help`` shows.

- ``_approaches``: the ways of awaiting GPU work that are compared;
- ``_measure``: the measurements, the interleaved rounds and the progress lines;
- ``_signal``: host signal to stream resume, a host timeline beside a Vulkan timeline;
- ``_report``: versions, the Markdown page and the plot.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

import aiocudasem as acs

from .._common import (
    DRIVERS,
    ArgumentParser,
    CommandError,
    HelpFormatter,
    exit_statuses,
    missing_loop,
    open_driver,
)
from ._approaches import ALL
from ._common import paired_ratios, say
from ._measure import TRIO_APPROACHES, Bench, run_asyncio, run_trio
from ._report import (
    commit,
    gpu_info,
    markdown,
    plot,
    rounds_text,
    summarize,
    summary_lines,
    versions,
)
from ._signal import run_signal, summarize_signal

_DESCRIPTION = """\
Side-by-side benchmarks: how fast does async Python learn that GPU work is
done?

Every approach waits on the same raw CUDA streams, with the same %globaltimer
spin kernel, in one process and one run; peer libraries (CuPy, PyTorch,
numba-cuda) wrap those streams, so they wait on exactly the same work. A last
section times a host signal to the resume of a stream blocked on it, for a host
timeline and a Vulkan timeline semaphore. A full run takes minutes: a progress
line per approach per round says how far it is. On the simulated device every
figure is labelled as simulated.

Writes results.json, the page of tables (performance.md) and, with matplotlib
installed (pip install 'aiocudasem[bench]'), latency.png to --out; without
matplotlib the page says that there is no plot, and a warning on standard error
says why. Prints a progress line per step and, at the end, a short summary (per
event loop, the library's wake latency and throughput beside blocking sync and
busy polling) and where the page went; --page - prints the page instead of
writing it."""


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="aiocudasem bench",
        description=_DESCRIPTION,
        epilog=exit_statuses(),
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--driver",
        choices=DRIVERS,
        default=None,
        help="cuda: the real GPU, sim: the simulated device (default: $AIOCUDASEM_DRIVER, else "
        "cuda; the benchmarks never fall back to the simulated device by themselves)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        metavar="DIR",
        help="the folder that results.json, performance.md and latency.png go to",
    )
    p.add_argument(
        "--page",
        default=None,
        metavar="PATH",
        help="where the page of tables goes (default: performance.md in --out); - prints it "
        "on standard output instead",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: fewer iterations (always so on the simulated device) and, unless "
        "--repeats says otherwise, 1 round",
    )
    p.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        default=None,
        help="interleaved rounds of every measurement, 1-100 (default: 5; 1 with --quick)",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="NAMES",
        help="comma-separated approaches to run on asyncio and, those that trio has ("
        + ", ".join(TRIO_APPROACHES)
        + "), on trio (default: all); sync, the floor, always runs. Names: "
        + ", ".join(cls.name for cls in ALL),
    )
    p.add_argument(
        "--devices",
        type=int,
        metavar="N",
        default=1,
        help="also measure 8-stream throughput with the streams dealt over this many devices",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks. Raises :class:`~aiocudasem.cli._common.CommandError` if the driver
    chosen cannot be used or ``--out`` cannot be written to (the command line reports it)."""
    p = _parser()
    ns = p.parse_args(argv)
    only = {x.strip() for x in ns.only.split(",") if x.strip()}
    unknown = sorted(only - {cls.name for cls in ALL})
    if unknown:
        p.error(f"--only: unknown approach(es) {', '.join(unknown)}; see --help for the names")
    repeats = ns.repeats if ns.repeats is not None else (1 if ns.quick else 5)
    if not 1 <= repeats <= 100:
        p.error("--repeats must be in [1, 100]")
    drv = open_driver(ns.driver)
    if not 1 <= ns.devices <= drv.device_count():
        p.error(f"--devices must be in [1, {drv.device_count()}] on this machine")
    page = None if ns.page is None else ns.page if ns.page == "-" else Path(ns.page)
    # Before the minutes of measurements, not after them: their results would be lost.
    _check_out(ns.out)
    if isinstance(page, Path):
        _check_out(page.parent, page)
    sim = drv.simulated
    say(
        f"benchmarks on {'the SIMULATED device' if sim else drv.device_name(0)} (driver {drv.name})"
    )
    b = Bench(drv, ns.quick or sim, ns.devices)
    if only:
        only.add("sync")  # the floor every figure is compared with
    aps = [cls(drv) for cls in ALL if not only or cls.name in only]
    trio_names = [n for n in TRIO_APPROACHES if not only or n in only]

    async def go_asyncio() -> None:
        await run_asyncio(b, aps, repeats)

    say(f"asyncio: {_approaches(len(aps))}, {rounds_text(repeats)} interleaved")
    anyio.run(go_asyncio, backend="asyncio")
    gc.collect()
    meta = _meta(drv, ns.devices, repeats)
    missing = missing_loop("trio")
    if missing is None:
        say(f"trio: {_approaches(len(trio_names))}, {rounds_text(repeats)} interleaved")
        anyio.run(run_trio, b, repeats, trio_names, backend="trio")
    else:
        meta["trio_not_measured"] = missing
        print(f"aiocudasem bench: warning: no trio figures: {missing}", file=sys.stderr, flush=True)
    say(f"host signal to stream resume: 2 producers, {rounds_text(repeats)} interleaved")
    try:
        signal = run_signal(drv, ns.quick or sim, repeats)
    except Exception as exc:  # the figures measured so far still count
        print(
            f"aiocudasem bench: warning: the host signal section failed: {exc!r}",
            file=sys.stderr,
            flush=True,
        )
        signal = None
    try:
        write(ns.out, b.results, meta, signal, b.paired, page=page)
    except BrokenPipeError:
        raise  # standard output, closed: the command line stops quietly
    except OSError as exc:
        if isinstance(page, Path) and exc.filename == str(page):
            raise CommandError(_out_message(page.parent, exc, page)) from exc
        raise CommandError(_out_message(ns.out, exc)) from exc
    return 0


def _approaches(n: int) -> str:
    return f"{n} approach" + ("" if n == 1 else "es")


def _check_out(out: Path, page: Path | None = None) -> None:
    """Create ``out`` if need be and make sure that a file can be written in it. Raises
    :class:`CommandError` saying why not. ``page``: ``out`` is the folder of the ``--page``
    given."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise CommandError(_out_message(out, exc, page)) from exc


def _out_message(out: Path, exc: OSError, page: Path | None = None) -> str:
    """The command line's one line for ``exc``, raised while writing to ``out`` (the folder of
    ``page``, if given, else ``--out``)."""
    file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
        reason = f"{'it' if file == out and page is None else file} is a file, not a folder"
    else:
        reason = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) != str(out):
            reason += f": {exc.filename}"
    if page is not None:
        return f"--page {page}: cannot write the page there: {reason}"
    return f"--out {out}: cannot write the results there: {reason}"


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


def write(
    out: Path,
    results: dict[str, Any],
    meta: dict[str, Any],
    signal: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
    page: Path | str | None = None,
) -> None:
    """results.json (every run and the summary), the page (to ``page``: by default
    performance.md in ``out``; ``"-"``, standard output) and, if it can, latency.png; then
    the short summary (``_report.summary``) and where the page went. Without a plot, the page
    says so instead of linking one, a warning on standard error says why, and a latency.png
    left in ``out`` by an earlier run is removed (the page would otherwise sit beside a plot of
    other figures)."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {n: summarize(e) for n, e in results.items() if n != "trio"}
    summary["trio"] = {n: summarize(e) for n, e in results.get("trio", {}).items()}
    document: dict[str, Any] = {"meta": meta, "summary": summary, "results": results}
    if signal is not None:
        summary["signal"] = {n: summarize_signal(e) for n, e in signal.items()}
        document["signal"] = signal
    if paired:
        document["paired"] = paired
        summary["paired"] = {
            loop: {
                n: {
                    name: ratio
                    for name in runs
                    if name != "poll0" and (ratio := paired_ratios(runs, name)) is not None
                }
                for n, runs in by_n.items()
            }
            for loop, by_n in paired.items()
        }
    (out / "results.json").write_text(json.dumps(document))
    png = out / "latency.png"
    no_plot = plot(results, png, meta["simulated"])
    to = out / "performance.md" if page is None else page
    written = [str(out / "results.json")]
    if isinstance(to, Path):
        to.parent.mkdir(parents=True, exist_ok=True)
        # The plot's link, relative to wherever the page is.
        link = Path(os.path.relpath(png.resolve(), to.resolve().parent)).as_posix()
        to.write_text(markdown(results, meta, no_plot, signal, paired, link))
        written.append(to.name if page is None else str(to))
    if not no_plot:
        written.append("latency.png")
    say("wrote " + ", ".join(written))
    if no_plot:
        stale = png.exists()
        if stale:
            png.unlink()
        print(
            f"aiocudasem bench: warning: wrote no latency.png: {no_plot}. The page says so "
            "and links no plot"
            + ("; removed the latency.png of an earlier run" if stale else "")
            + ".",
            file=sys.stderr,
            flush=True,
        )
    if isinstance(to, Path):
        lines = summary_lines(results, meta, signal, paired)
        where = f"the full page, every approach and figure: {to}; every run: {out / 'results.json'}"
        say("\n".join([*lines, where]))
    else:
        say(markdown(results, meta, no_plot, signal, paired, str(png)))
