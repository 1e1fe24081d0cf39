"""``aiocudasem bench``: the side-by-side benchmarks. What they measure, print and write is
in ``_DESCRIPTION`` below, which ``aiocudasem bench --help`` shows.

- ``_approaches``: the ways of awaiting GPU work that are compared;
- ``_measure``: the measurements, the interleaved rounds and the progress lines;
- ``_signal``: host signal to stream resume, a host timeline beside a Vulkan timeline;
- ``_ready``: ``ready()`` of several arrays in one call against one call each;
- ``_stages``: host stages against a Python host callback, stall and latency;
- ``_progress``: a kernel's progress values awaited one by one, against polling the word;
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
from ._approaches import ALL, LOOP_APPROACHES, for_loop
from ._common import LOOPS, calibrate, loop_backend, paired_ratios, run_on, say
from ._curve import LENGTHS_NS, expected_s, run_curve
from ._measure import Bench, Progress, run_main
from ._progress import run_progress, summarize_progress
from ._ready import SIZES as READY_SIZES
from ._ready import run_ready, summarize_ready
from ._report import (
    LOOP_KEYS,
    commit,
    gpu_info,
    markdown,
    plot,
    plot_curve,
    rounds_text,
    summaries,
    summary_lines,
    versions,
)
from ._service import APPROACHES as SERVICE_APPROACHES
from ._service import CONCURRENCY, run_service, summarize_service
from ._signal import run_signal, summarize_signal
from ._stages import QUICK_STAGES, STAGES, run_stages, summarize_stages

#: The sections, in the order they run.
SECTIONS = ("main", "curve", "service", "signal", "ready", "stages", "progress")

_DESCRIPTION = """\
Side-by-side benchmarks: how fast does async Python learn that GPU work is
done, and what does the waiting cost?

Every approach waits on the same raw CUDA streams, with the same %globaltimer
spin kernel, in one process and one run; peer libraries (CuPy, PyTorch,
numba-cuda) wrap those streams, so they wait on exactly the same work. Seven
sections, each on asyncio, asyncio on uvloop and trio where installed:

  main     wake latency (100 us kernel), throughput, CPU while 1,000
           coroutines are parked, GPU time per await on a busy loop, crowds
           of 10,000 awaiters; every approach on asyncio, the floors, polling,
           to_thread, the bare C host function and the library on uvloop and
           trio
  curve    wake latency and CPU against the kernel's length, 10 us to 10 ms:
           the library spinning and parked, busy polling, and a thread blocked
           on a blocking-sync event (the floor for any wait that does not
           spin), each against blocking sync in the same round
  service  64 and 1,000 concurrent requests, each awaiting a kernel of
           0.1-2 ms on a pool of 16 streams, while the loop runs other
           Python work: requests/s, p50 and p99 latency, CPU, and how much
           of the other work got done
  signal   host signal to the resume of a stream blocked on it, for a host
           timeline and a Vulkan timeline semaphore
  ready    what ready() costs per array: ready(*arrays) of 8 and 64 arrays,
           against ready(x) of each (on the first event loop of --loops)
  stages   host stages (stream.enqueue_host()) against a Python host
           callback that takes the GIL on the driver's thread: the work
           stream's GPU time per stage, 32 stages behind 50 us kernels, while
           the loop runs other Python work (50 us passes), over the same
           kernels with no stage; and the time from a 100 us kernel's end to
           the stage's code starting, on an idle and on a busy loop
  progress a kernel publishes values into a host timeline, 1 ms apart, each
           awaited in order with wait_value(n), against busy polling of the
           word: wake latency after each publish (from the kernel's own
           stamps; on a GPU, whose clock the host does not share, over the
           fastest wake of the round) and CPU while waiting

Every measurement runs in interleaved rounds, ordered by a balanced Latin
square (each approach in each position equally often); latency is given as
the paired difference to blocking sync in the same round, and a full garbage
collection precedes every timed window (the collector is off during the short
ones). A full run takes a quarter of an hour on a GPU; --sections and --loops
run a part of it, and a progress line per step says how far it is. On the
simulated device every figure is labelled as simulated.

Writes results.json, the page of tables (performance.md) and, with matplotlib
installed (pip install 'aiocudasem[bench]'), latency.png and curve.png to
--out; without matplotlib the page says that there is no plot, and a warning
on standard error says why. Prints a progress line per step and, at the end, a
short summary (per event loop, the library's wake latency and throughput
beside blocking sync and busy polling) and where the page went; --page -
prints the page instead of writing it."""


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
        help="comma-separated approaches of the main section to run on asyncio and, those "
        "that run there too ("
        + ", ".join(LOOP_APPROACHES)
        + "), on uvloop and trio (default: all); sync, the floor, always runs. Names: "
        + ", ".join(cls.name for cls in ALL),
    )
    p.add_argument(
        "--sections",
        default=None,
        metavar="NAMES",
        help="comma-separated sections to run, of " + ", ".join(SECTIONS) + " (default: all)",
    )
    p.add_argument(
        "--loops",
        default=None,
        metavar="NAMES",
        help="comma-separated event loops to run the main, curve, service, stages and "
        "progress sections on, "
        "and the ready section on the first of them, of "
        + ", ".join(LOOPS)
        + " (default: all; uvloop and trio where installed, with a warning where not)",
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
    sections = _names(p, "--sections", ns.sections, SECTIONS, "section")
    loops = _names(p, "--loops", ns.loops, LOOPS, "event loop")
    drv = open_driver(ns.driver)
    if not 1 <= ns.devices <= drv.device_count():
        p.error(f"--devices must be in [1, {drv.device_count()}] on this machine")
    page = None if ns.page is None else ns.page if ns.page == "-" else Path(ns.page)
    # Before the minutes of measurements, not after them: their results would be lost.
    _check_out(ns.out)
    if isinstance(page, Path):
        _check_out(page.parent, page)
    sim = drv.simulated
    quick = ns.quick or sim
    meta = _meta(drv, ns.devices, repeats)
    meta["sections"] = list(sections)
    say(
        f"benchmarks on {'the SIMULATED device' if sim else drv.device_name(0)} "
        f"(driver {drv.name}), {meta['commit']}; sections: {', '.join(sections)}"
    )
    runnable = []
    for loop in loops:
        missing = missing_loop(loop_backend(loop))
        if missing is None:
            runnable.append(loop)
        else:
            meta[f"{loop}_not_measured"] = missing
            print(
                f"aiocudasem bench: warning: no {loop} figures: {missing}",
                file=sys.stderr,
                flush=True,
            )
    meta["loops"] = runnable
    b = Bench(drv, quick, ns.devices)
    if only:
        only.add("sync")  # the floor every figure is compared with
    curve: dict[str, Any] | None = None
    service: dict[str, Any] | None = None
    signal: dict[str, Any] | None = None
    ready: dict[str, Any] | None = None
    stages: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    if "main" in sections:
        for loop in runnable:
            aps = [cls(drv) for cls in for_loop(loop, only or None)]
            say(f"{loop}: {_approaches(len(aps))}, {rounds_text(repeats)} interleaved")
            run_on(loop, run_main, b, loop, aps, repeats)
            gc.collect()
    if "curve" in sections and runnable:
        curve = _curve_section(b, runnable, quick)
    if "service" in sections and runnable:
        service = _service_section(b, runnable, quick, repeats)
    if "signal" in sections:
        say(f"host signal to stream resume: 2 producers, {rounds_text(repeats)} interleaved")
        try:
            signal = run_signal(drv, quick, repeats)
        except Exception as exc:  # the figures measured so far still count
            print(
                f"aiocudasem bench: warning: the host signal section failed: {exc!r}",
                file=sys.stderr,
                flush=True,
            )
    if "ready" in sections and runnable:
        sizes = " and ".join(map(str, READY_SIZES))
        say(f"ready: {sizes} arrays, {rounds_text(repeats)} interleaved, on {runnable[0]}")
        try:
            ready = {"loop": runnable[0], **run_on(runnable[0], run_ready, drv, quick, repeats)}
        except Exception as exc:  # the figures measured so far still count
            print(
                f"aiocudasem bench: warning: the ready section failed: {exc!r}",
                file=sys.stderr,
                flush=True,
            )
    if "stages" in sections and runnable:
        stages = _stages_section(b, runnable, quick, repeats)
    if "progress" in sections and runnable:
        progress = _progress_section(b, runnable, quick, repeats)
    try:
        write(
            ns.out,
            b.results,
            meta,
            signal,
            b.paired,
            page=page,
            curve=curve,
            service=service,
            ready=ready,
            stages=stages,
            progress=progress,
        )
    except BrokenPipeError:
        raise  # standard output, closed: the command line stops quietly
    except OSError as exc:
        if isinstance(page, Path) and exc.filename == str(page):
            raise CommandError(_out_message(page.parent, exc, page)) from exc
        raise CommandError(_out_message(ns.out, exc)) from exc
    return 0


def _names(
    p: argparse.ArgumentParser, option: str, value: str | None, choices: tuple[str, ...], what: str
) -> tuple[str, ...]:
    """The names of a comma-separated option, in ``choices``' order; all of them if not
    given. Exits through ``p.error`` on an unknown name or an empty list."""
    if value is None:
        return choices
    names = {x.strip() for x in value.split(",") if x.strip()}
    unknown = sorted(names - set(choices))
    if unknown:
        p.error(
            f"{option}: unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(choices)}"
        )
    if not names:
        p.error(f"{option}: name at least one {what}, of {', '.join(choices)}")
    return tuple(c for c in choices if c in names)


def _curve_section(b: Bench, loops: list[str], quick: bool) -> dict[str, Any]:
    """The curve section on every loop of ``loops``."""
    lengths = LENGTHS_NS
    cost = sum(expected_s(ns, quick) for ns in lengths) * len(loops)
    say(
        f"curve: {len(lengths)} kernel lengths, 10 us to 10 ms, on {', '.join(loops)}; "
        f"about {cost:.0f} s of rounds"
    )
    progress = Progress(len(lengths) * len(loops), cost)
    out: dict[str, Any] = {"lengths_us": [ns / 1000 for ns in lengths], "loops": {}}
    for loop in loops:
        out["loops"][loop] = run_on(
            loop, run_curve, b.drv, b.streams[8:16], b.launch, loop, quick, progress
        )
        gc.collect()
    return out


def _service_section(b: Bench, loops: list[str], quick: bool, repeats: int) -> dict[str, Any]:
    """The service section on every loop of ``loops``."""
    from ._service import QUICK_WARMUP_S, QUICK_WINDOW_S, WARMUP_S, WINDOW_S

    turns = calibrate()
    per_cell = (QUICK_WINDOW_S + QUICK_WARMUP_S) if quick else (WINDOW_S + WARMUP_S)
    steps = len(loops) * len(CONCURRENCY) * repeats * len(SERVICE_APPROACHES)
    say(
        f"service: {' and '.join(map(str, CONCURRENCY))} concurrent requests, "
        f"{len(SERVICE_APPROACHES)} approaches, {rounds_text(repeats)} interleaved, on "
        f"{', '.join(loops)}; about {steps * per_cell:.0f} s"
    )
    progress = Progress(steps, steps * per_cell)
    out: dict[str, Any] = {"other_work_turns": turns, "loops": {}}
    for loop in loops:
        out["loops"][loop] = run_on(
            loop, run_service, b.drv, b.streams, b.launch, loop, quick, repeats, progress, turns
        )
        gc.collect()
    return out


def _stages_section(b: Bench, loops: list[str], quick: bool, repeats: int) -> dict[str, Any]:
    """The stages section on every loop of ``loops``."""
    turns = calibrate()
    steps = len(loops) * repeats * 3
    say(
        f"stages: host stage against a Python host callback, "
        f"{QUICK_STAGES if quick else STAGES} stages per window, "
        f"{rounds_text(repeats)} interleaved, on {', '.join(loops)}"
    )
    progress = Progress(steps)
    out: dict[str, Any] = {"other_work_turns": turns, "loops": {}}
    for loop in loops:
        try:
            out["loops"][loop] = run_on(
                loop, run_stages, b.drv, b.launch, loop, quick, repeats, progress, turns
            )
        except Exception as exc:  # the figures measured so far still count
            out["loops"][loop] = {"error": f"{type(exc).__name__}: {exc}"}
            print(
                f"aiocudasem bench: warning: the stages section failed on {loop}: {exc!r}",
                file=sys.stderr,
                flush=True,
            )
        gc.collect()
    return out


def _progress_section(b: Bench, loops: list[str], quick: bool, repeats: int) -> dict[str, Any]:
    """The progress section on every loop of ``loops``."""
    from ._progress import APPROACHES, COUNT, INTERVAL_NS, QUICK_COUNT, QUICK_INTERVAL_NS

    count, interval = (QUICK_COUNT, QUICK_INTERVAL_NS) if quick else (COUNT, INTERVAL_NS)
    steps = len(loops) * repeats * len(APPROACHES)
    say(
        f"progress: {count} values, {interval / 1e6:g} ms apart, wait_value() against polling, "
        f"{rounds_text(repeats)} interleaved, on {', '.join(loops)}; about "
        f"{steps * count * interval / 1e9:.0f} s"
    )
    progress = Progress(steps, steps * count * interval / 1e9)
    out: dict[str, Any] = {"loops": {}}
    for loop in loops:
        try:
            out["loops"][loop] = run_on(
                loop, run_progress, b.drv, b.work, loop, quick, repeats, progress
            )
        except Exception as exc:  # the figures measured so far still count
            out["loops"][loop] = {"error": f"{type(exc).__name__}: {exc}"}
            print(
                f"aiocudasem bench: warning: the progress section failed on {loop}: {exc!r}",
                file=sys.stderr,
                flush=True,
            )
        gc.collect()
    return out


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
    curve: dict[str, Any] | None = None,
    service: dict[str, Any] | None = None,
    ready: dict[str, Any] | None = None,
    stages: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
) -> None:
    """results.json (every run and the summary), the page (to ``page``: by default
    performance.md in ``out``; ``"-"``, standard output) and, if it can, latency.png (with
    the main section's results) and curve.png (with the curve's); then the short summary
    (``_report.summary``) and where the page went. Without a plot, the page says so instead of
    linking one, a warning on standard error says why, and a plot of that name left in ``out``
    by an earlier run is removed (the page would otherwise sit beside a plot of other
    figures)."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = summaries(results)
    for loop in LOOP_KEYS:
        if loop in results or loop == "trio":
            summary[loop] = summaries(results.get(loop, {}))
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
    if curve is not None:
        document["curve"] = curve
    if ready is not None:
        document["ready"] = ready
        summary["ready"] = summarize_ready(ready)
    for name, section, summarize in (
        ("stages", stages, summarize_stages),
        ("progress", progress, summarize_progress),
    ):
        if section is not None:  # per loop, those that ran
            document[name] = section
            summary[name] = {
                loop: summarize(e)
                for loop, e in section.get("loops", {}).items()
                if "error" not in e
            }
    if service is not None:
        document["service"] = service
        summary["service"] = {
            loop: {
                n: {name: summarize_service(e) for name, e in by_ap.items()}
                for n, by_ap in by_n.items()
            }
            for loop, by_n in service.get("loops", {}).items()
        }
    (out / "results.json").write_text(json.dumps(document))
    written = [str(out / "results.json")]
    plots = []  # (file, why there is none or None)
    png = out / "latency.png"
    no_plot = None
    if any(n not in LOOP_KEYS for n in results) or any(results.get(k) for k in LOOP_KEYS):
        no_plot = plot(results, png, meta["simulated"])
        plots.append((png, no_plot))
    curve_png = out / "curve.png"
    no_curve_plot = None
    if curve is not None and curve.get("loops"):
        no_curve_plot = plot_curve(curve, curve_png, meta["simulated"])
        plots.append((curve_png, no_curve_plot))
    to = out / "performance.md" if page is None else page

    def page_text(base: Path | None) -> str:
        # The plots' links, relative to wherever the page is.
        def link(p: Path) -> str:
            if base is None:
                return str(p)
            return Path(os.path.relpath(p.resolve(), base)).as_posix()

        return markdown(
            results,
            meta,
            no_plot,
            signal,
            paired,
            link(png),
            curve=curve,
            service=service,
            ready=ready,
            stages=stages,
            progress=progress,
            no_curve_plot=no_curve_plot,
            curve_link=link(curve_png),
        )

    if isinstance(to, Path):
        to.parent.mkdir(parents=True, exist_ok=True)
        to.write_text(page_text(to.resolve().parent))
        written.append(to.name if page is None else str(to))
    written += [p.name for p, why in plots if why is None]
    say("wrote " + ", ".join(written))
    for p, why in plots:
        if why is None:
            continue
        stale = p.exists()
        if stale:
            p.unlink()
        print(
            f"aiocudasem bench: warning: wrote no {p.name}: {why}. The page says so "
            "and links no plot"
            + (f"; removed the {p.name} of an earlier run" if stale else "")
            + ".",
            file=sys.stderr,
            flush=True,
        )
    # The plot of a section that did not run this time shows an earlier run's figures.
    drawn = [q for q, _ in plots]
    for stale_png in (png, curve_png):
        if stale_png not in drawn and stale_png.exists():
            stale_png.unlink()
    if isinstance(to, Path):
        lines = summary_lines(results, meta, signal, paired, ready, stages, progress)
        where = f"the full page, every approach and figure: {to}; every run: {out / 'results.json'}"
        say("\n".join([*lines, where]))
    else:
        say(page_text(None))
