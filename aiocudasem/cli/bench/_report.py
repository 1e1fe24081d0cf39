"""The report: versions, the Markdown page and the plot."""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiocudasem as acs

from ._common import over_runs, paired_ratios, pct, spread
from ._measure import PAIRED_APPROACHES, PARKED_KERNEL_NS
from ._signal import summarize_signal

PARKED_S = PARKED_KERNEL_NS / 1e9

# ---------------------------------------------------------------- report


def source_digest() -> str:
    """SHA-256 (first 12 hex digits) of the package's source files, by path: names the code
    that ran even where the checkout's commit says little (a copied tree, an installed wheel).
    ``python -c 'from aiocudasem.cli.bench._report import source_digest; print(source_digest())'``
    in a checkout of a commit gives the same digest if the code is the same."""
    import hashlib

    import aiocudasem

    pkg = Path(aiocudasem.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(pkg.rglob("*")):
        if path.suffix in (".py", ".c", ".pyi", ".cu") and "__pycache__" not in path.parts:
            h.update(path.relative_to(pkg).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def commit() -> str:
    """The source checkout's commit (with ``+changes`` if the tree differs from it), or the
    installed version when the package does not run from a checkout; with the digest of the
    package's source either way."""
    return f"{_revision()}, source digest {source_digest()}"


def _revision() -> str:
    import subprocess

    import aiocudasem

    root = Path(aiocudasem.__file__).resolve().parent.parent
    if (root / ".git").exists():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            git = ["git", "-C", str(root)]
            rev = subprocess.run(
                [*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            dirty = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if rev:
                return f"commit {rev}" + (" +changes" if dirty else "")
    return f"aiocudasem {aiocudasem.__version__} (installed, not a checkout)"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "aiocudasem",
        "cuda-bindings",
        "anyio",
        "trio",
        "uvloop",
        "numpy",
        "cupy-cuda13x",
        "torch",
        "numba-cuda",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def gpu_info(drv: acs.Driver) -> dict[str, str]:
    info = {"device": drv.device_name(0), "driver": drv.name}
    if not drv.simulated:
        with contextlib.suppress(Exception):
            import subprocess

            info["nvidia-smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
    return info


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


#: Each figure of a run, as one number: (name, how to get it from a run).
FIGURES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "wake_us": lambda r: statistics.median(r["latency_100us"]),
    "wake_p99_us": lambda r: pct(r["latency_100us"], 99),
    "empty_us": lambda r: statistics.median(r["latency_empty"]),
    "empty_p99_us": lambda r: pct(r["latency_empty"], 99),
    "awaits_per_s_1": lambda r: r.get("awaits_per_s_1"),
    "awaits_per_s_8": lambda r: r.get("awaits_per_s_8"),
    "awaits_per_s_8_split": lambda r: r.get("awaits_per_s_8_split"),
    "cpu_parked": lambda r: r.get("cpu_parked"),
    "stall_ms": lambda r: r["stall_us"] / 1e3 if "stall_us" in r else None,
    "many_p50_ms": lambda r: r["many"]["p50_us"] / 1e3 if "many" in r else None,
    "many_p99_ms": lambda r: r["many"]["p99_us"] / 1e3 if "many" in r else None,
    "parked_p50_ms": lambda r: (
        r["many_parked"]["after_end_p50_us"] / 1e3 if "many_parked" in r else None
    ),
    "parked_p99_ms": lambda r: (
        r["many_parked"]["after_end_p99_us"] / 1e3 if "many_parked" in r else None
    ),
}


def summarize(entry: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each figure over the runs: median, min and max (figures a run lacks are left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, get in FIGURES.items():
        try:
            values = [v for v in (get(r) for r in entry.get("runs", [])) if v is not None]
        except KeyError:
            continue
        if values:
            out[name] = over_runs(values)
    return out


def _header(meta: dict[str, Any]) -> list[str]:
    tag = " (SIMULATED device: not GPU figures)" if meta["simulated"] else ""
    gpu = meta["gpu"].get("nvidia-smi") or meta["gpu"]["device"]
    packages = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    return [
        f"# Performance{tag}",
        "",
        f"Measured {meta['date']}, {meta.get('commit', 'unknown commit')}, on {gpu}, host "
        f"{meta['host']}. Packages: {packages}.",
        "",
        f"One process, the same streams and the same `%globaltimer` spin kernel for every "
        f"approach (`aiocudasem bench`), {rounds_text(meta.get('repeats', 1))} interleaved (each "
        "round measures every approach, starting one place later than the round before). Each "
        "cell is the median over the rounds, with the lowest and highest in square brackets. "
        "Latency = "
        'from enqueuing the kernel to the coroutine resuming; "+" is the median above blocking '
        "sync.",
        "",
    ]


def _main_table(results: dict[str, Any], sums: dict[str, Any]) -> list[str]:
    floor = sums.get("sync", {})
    base = floor.get("wake_us", {}).get("median", 0.0)
    base_empty = floor.get("empty_us", {}).get("median", 0.0)
    lines = [
        "| approach | wake latency, 100 us kernel, median (+ over sync) | its p99 | empty stream, "
        "median | CPU while 1,000 coroutines are parked on 3 s kernels (cores) | awaits/s, "
        "1 stream | awaits/s, 8 streams | work-stream GPU time, 100 x (50 us kernel + notify), "
        "loop busy (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in results.items():
        if name == "trio":
            continue
        if "error" in e:
            lines.append(f"| {e['label']} | fails: `{e['error'][:120]}` | | | | | | |")
            continue
        f = sums[name]
        wake = f.get("wake_us", {}).get("median", 0.0) - base
        empty = f.get("empty_us", {}).get("median", 0.0) - base_empty
        lines.append(
            f"| {e['label']} | {spread(f.get('wake_us'), '.1f')} ({wake:+.1f}) us "
            f"| {spread(f.get('wake_p99_us'))} us "
            f"| {spread(f.get('empty_us'), '.1f')} ({empty:+.1f}) us "
            f"| {spread(f.get('cpu_parked'), '.4f')} | {spread(f.get('awaits_per_s_1'))} "
            f"| {spread(f.get('awaits_per_s_8'))} | {spread(f.get('stall_ms'), '.2f')} |"
        )
    return lines


def _collected(flags: list[bool | None]) -> str:
    """How many rounds' garbage collection ended before the kernels, or n/a for results from
    before the benchmark ran one."""
    if all(f is None for f in flags):
        return "n/a"
    return f"{sum(f is True for f in flags)}/{len(flags)}"


def _crowd_table(results: dict[str, Any], sums: dict[str, Any]) -> list[str]:
    rows = []
    for name, e in results.items():
        runs = [r for r in e.get("runs", []) if "many" in r] if name != "trio" else []
        if not runs:
            continue
        crowds = [r[k] for r in runs for k in ("many", "many_parked") if k in r]
        woke = min(m["woke"] for m in crowds)
        fds = max(m["extra_fds_peak"] for m in crowds)
        rss = max(m["rss_growth_mib"] for m in crowds)
        crowds_parked = [r["many_parked"] for r in runs if "many_parked" in r]
        parked = [m["started_before_end"] for m in crowds_parked]
        collected = [m.get("collected_before_end") for m in crowds_parked]
        f = sums[name]
        rows.append(
            f"| {e['label']} | {woke}/{runs[0]['many']['waiters']} | {fds} | {rss:.1f} MiB "
            f"| {spread(f.get('many_p50_ms'), '.1f')} / {spread(f.get('many_p99_ms'), '.1f')} ms "
            f"| {_gc_pauses([r['many'] for r in runs])} "
            f"| {min(parked) if parked else 'n/a'} "
            f"| {_collected(collected)} "
            f"| {spread(f.get('parked_p50_ms'), '.1f')} / {spread(f.get('parked_p99_ms'), '.1f')} "
            "ms |"
        )
    if not rows:
        return []
    return [
        "",
        "## 10,000 awaiters on 64 streams",
        "",
        "Two crowds. *Short kernels*: one 20 ms kernel per stream; starting 10,000 tasks takes "
        "longer than that, so most coroutines find their work done, and the figure (from before "
        "the launches) is the cost of 10,000 awaits of finished work. An await is always a "
        "checkpoint, so each aiocudasem waiter passes the scheduler once; a polling loop that "
        "finds the work done returns without yielding. The checkpoint row passes the scheduler "
        "once too, then queries, with no library code: what any await that is a checkpoint "
        "costs. *Parked*: one "
        f"{PARKED_S:g} s kernel per stream, so that every coroutine is waiting before its kernel "
        "ends; the figure is taken from the kernels' end (they run side by side, timed by the "
        "GPU's nanosecond clock), and measures how a parked crowd is woken. Before each crowd's "
        "launches a full garbage collection runs, for every approach alike and outside the "
        "figures, so that the collections during a crowd are its own: what an approach's "
        "earlier measurements left behind (the parked-CPU and stall tests run for some "
        "approaches only) would otherwise bring a full collection forward into its crowd. "
        "Once every coroutine "
        "of the parked crowd has started, a full garbage collection runs, for every approach "
        "alike: starting 10,000 tasks makes one due, which would otherwise land in whichever "
        "approach allocates first after the kernels end, and take 100-300 ms there. The "
        "collector's pauses during the short crowd are given for each approach: full "
        "collections in a run (the fewest and the most) and the milliseconds of all "
        "collections (median [min-max]), which are part of its figures.",
        "",
        "| approach | woke (fewest in a run) | extra fds (peak) | RSS growth (most) "
        "| short kernels: p50 / p99 from launch | short kernels: the collector's pauses "
        "| parked before the end (fewest) "
        "| collected before the end (runs) | parked: p50 / p99 after the kernel ends |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def _gc_pauses(crowds: list[dict[str, Any]]) -> str:
    """The collector's pauses during a crowd, over the runs (runs from before the benchmark
    measured them have none)."""
    measured = [m for m in crowds if "gc_ms" in m]
    if not measured:
        return "n/a"
    full = [m["gc_full"] for m in measured]
    counts = f"{min(full)}" if min(full) == max(full) else f"{min(full)}-{max(full)}"
    return f"{counts} full, {spread(over_runs([m['gc_ms'] for m in measured]), '.0f')} ms"


def _split_table(results: dict[str, Any], sums: dict[str, Any], devices: int) -> list[str]:
    rows = [
        f"| {e['label']} | {spread(sums[n].get('awaits_per_s_8'))} "
        f"| {spread(sums[n]['awaits_per_s_8_split'])} |"
        for n, e in results.items()
        if n != "trio" and "awaits_per_s_8_split" in sums.get(n, {})
    ]
    if not rows:
        return []
    return [
        "",
        f"## Throughput on 8 streams dealt over {devices} devices",
        "",
        "| approach | awaits/s, 8 streams of device 0 | awaits/s, 8 streams over the devices |",
        "|---|---|---|",
        *rows,
    ]


def _trio_table(trio: dict[str, Any]) -> list[str]:
    sums = {n: summarize(e) for n, e in trio.items()}
    base = sums.get("sync", {}).get("wake_us", {}).get("median", 0.0)
    lines = [
        "",
        "## trio: wake latency (100 us kernel) and throughput",
        "",
        "| approach | wake latency, median (+ over sync) | its p99 | awaits/s, 1 stream "
        "| awaits/s, 8 streams |",
        "|---|---|---|---|---|",
    ]
    for n, e in trio.items():
        f = sums[n]
        plus = f.get("wake_us", {}).get("median", 0.0) - base
        lines.append(
            f"| {e['label']} | {spread(f.get('wake_us'), '.1f')} ({plus:+.1f}) us "
            f"| {spread(f.get('wake_p99_us'))} us | {spread(f.get('awaits_per_s_1'))} "
            f"| {spread(f.get('awaits_per_s_8'))} |"
        )
    return lines


def paired_table(paired: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """The paired throughput rounds: awaits/s of each approach, and its ratio to busy polling
    within each round. One column per approach measured on any loop, in the benchmark's order;
    n/a where a loop did not measure it."""
    seen = {name for by_n in paired.values() for runs in by_n.values() for name in runs}
    names = [n for n in PAIRED_APPROACHES if n in seen and n != "poll0"]
    rows = []
    for loop, by_n in paired.items():
        for n, runs in by_n.items():
            cells = [spread(over_runs(runs["poll0"]))]
            for name in names:
                if name not in runs:
                    cells.append("n/a")
                    continue
                ratio = spread(paired_ratios(runs, name), ".2f")
                cells.append(f"{spread(over_runs(runs[name]))} ({ratio} x)")
            rows.append(f"| {loop} | {n} | " + " | ".join(cells) + " |")
    if not rows or not names:
        return []
    first = next(iter(next(iter(paired.values())).values()))
    rounds = len(first["poll0"])
    labels = [results.get(name, {}).get("label", name) for name in names]
    return [
        "",
        "## Throughput in paired rounds",
        "",
        f"{rounds_text(rounds)} per loop and stream count, each measuring every approach for "
        "a fraction of a second, one after the other, in an order that starts one place later "
        "each round. The ratio to busy polling is taken within each round, so the machine's "
        "drift over seconds and minutes, which spreads the rounds of the tables above, falls "
        "on both sides of it. Each cell: awaits/s, median [min-max] over the rounds, and in "
        "brackets the ratio to busy polling, median [min-max] over the rounds (the trio rows "
        "measure the trio form of each approach).",
        "",
        "| loop | streams | busy polling, awaits/s | "
        + " | ".join(f"{label} (x polling)" for label in labels)
        + " |",
        "|---|---|---|" + "---|" * len(labels),
        *rows,
    ]


def rounds_text(n: int) -> str:
    return f"{n} round" + ("" if n == 1 else "s")


def _signal_table(signal: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Host signal to stream resume",
        "",
        "A stream waits for a value and then writes a probe host timeline; the host signals "
        "the value and spins on the probe. Microseconds from the signal call to seeing the "
        "probe, on the host's clock; only the wait differs between the rows.",
        "",
        "| producer | median | p99 |",
        "|---|---|---|",
    ]
    for e in signal.values():
        if "error" in e:
            lines.append(f"| {e['label']} | not available: {e['error']} | |")
            continue
        f = summarize_signal(e)
        lines.append(
            f"| {e['label']} | {spread(f.get('median_us'), '.1f')} us "
            f"| {spread(f.get('p99_us'), '.1f')} us |"
        )
    return lines


def markdown(
    results: dict[str, Any],
    meta: dict[str, Any],
    no_plot: str | None = None,
    signal: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
    plot_link: str = "latency.png",
) -> str:
    """The page. ``no_plot``: why there is no latency.png (then the page says so and links
    none); ``None``: link the plot, at ``plot_link`` (by default beside the page). ``signal``:
    the host-signal figures, if they were measured. ``paired``: the paired throughput rounds
    (``Bench.paired``)."""
    sums = {n: summarize(e) for n, e in results.items() if n != "trio"}
    lines = _header(meta) + _main_table(results, sums) + _crowd_table(results, sums)
    lines += _split_table(results, sums, meta.get("devices", 2))
    if "trio" in results:
        lines += _trio_table(results["trio"])
    elif "trio_not_measured" in meta:
        lines += ["", "## trio", "", f"Not measured: {meta['trio_not_measured']}."]
    if paired:
        lines += paired_table(paired, results)
    if signal is not None:
        lines += _signal_table(signal)
    if no_plot is None:
        lines += ["", f"![latency distributions]({plot_link})", ""]
    else:
        lines += ["", f"(No latency plot: {no_plot}.)", ""]
    return "\n".join(lines)


#: The approaches whose figures the summary gives first, the first measured of them, and those
#: it sets beside them.
HEADLINES = ("aiocudasem", "aiocudasem_parked")
BESIDE = {"sync": "blocking sync", "poll0": "busy polling"}


def summary_lines(
    results: dict[str, Any],
    meta: dict[str, Any],
    signal: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
) -> list[str]:
    """The few lines printed at the end of a run, in place of the page: per loop, the wake
    latency and throughput of the library (or, where ``--only`` left it out, of the first
    other approach measured) and its paired ratio to busy polling on 8 streams, over those of
    blocking sync and busy polling; then the host-signal medians."""
    tag = "SIMULATED device, not GPU figures; " if meta["simulated"] else ""
    lines = [
        f"summary ({tag}medians over {rounds_text(meta.get('repeats', 1))}):",
        f"  {'loop':<8} {'approach':<18} {'wake, 100 us kernel':<21} awaits/s, 1 / 8 streams",
    ]
    loops = {"asyncio": {n: e for n, e in results.items() if n != "trio"}}
    if "trio" in results:
        loops["trio"] = results["trio"]
    for loop, entries in loops.items():
        sums = {n: summarize(e) for n, e in entries.items() if "error" not in e and e.get("runs")}
        first = next((n for n in HEADLINES if n in sums), None) or next(
            (n for n in sums if n not in BESIDE), None
        )
        names = [n for n in (first, *BESIDE) if n in sums]
        for i, name in enumerate(dict.fromkeys(names)):
            f = sums[name]
            row = (
                f"  {loop if i == 0 else '':<8} {BESIDE.get(name, name):<18} "
                f"{fmt(_median(f, 'wake_us'), '.1f') + ' us':<21} "
                f"{fmt(_median(f, 'awaits_per_s_1'))} / {fmt(_median(f, 'awaits_per_s_8'))}"
            )
            runs = (paired or {}).get(loop, {}).get("8", {})
            if name not in BESIDE and "poll0" in runs and name in runs:
                ratio = paired_ratios(runs, name)
                if ratio is not None:
                    row += f"  ({ratio['median']:.2f} x busy polling on 8 streams, paired rounds)"
            lines.append(row)
    medians = [
        f"{name} {fmt(_median(summarize_signal(e), 'median_us'), '.1f')} us"
        for name, e in (signal or {}).items()
        if "error" not in e
    ]
    if medians:
        lines.append(f"  host signal to stream resume: {', '.join(medians)}")
    return lines


def _median(figures: dict[str, Any], name: str) -> float | None:
    fig = figures.get(name)
    return None if fig is None else float(fig["median"])


#: What the page and the warning say when matplotlib is missing.
NO_MATPLOTLIB = "matplotlib is not installed; pip install 'aiocudasem[bench]' installs it"


def plot(results: dict[str, Any], path: Path, sim: bool) -> str | None:
    """Write the latency plot to ``path``. Returns ``None`` if it did, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    except Exception as exc:  # a broken installation: the run's figures still count
        return f"matplotlib failed to load ({type(exc).__name__}: {exc})"
    names = [n for n, e in results.items() if n != "trio" and e.get("runs")]
    data = [[x for r in results[n]["runs"] for x in r["latency_100us"]] for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) + 1.5))
    ax.boxplot(data, vert=False, showfliers=False, whis=(1, 99))
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xscale("log")
    ax.set_xlabel(
        "wake latency for a 100 us kernel, all rounds, us (box: quartiles, whiskers: p1-p99)"
    )
    ax.set_title("Wake latency per approach" + (" (SIMULATED device)" if sim else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
