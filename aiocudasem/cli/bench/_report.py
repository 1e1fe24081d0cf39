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

from ._common import over_runs, paired_differences, paired_ratios, pct, spread
from ._measure import PAIRED_APPROACHES, PARKED_KERNEL_NS
from ._progress import APPROACHES as PROGRESS_APPROACHES
from ._progress import summarize_progress
from ._ready import SIZES as READY_SIZES
from ._ready import WAYS as READY_WAYS
from ._ready import median_ratio, summarize_ready
from ._service import summarize_service
from ._signal import summarize_signal
from ._stages import APPROACHES as STAGE_APPROACHES
from ._stages import CONDITIONS as STAGE_CONDITIONS
from ._stages import STAGES, summarize_stages

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


def _revision(root: Path | None = None) -> str:
    """The commit of the checkout at ``root`` (by default the one the package runs from), from
    git (with ``+changes`` if the tree differs from it); where there is no git checkout, from a
    ``REVISION`` file at the top of the tree, which a copy made with ``git archive`` carries
    (the short hash of its commit); else the installed version."""
    import subprocess

    import aiocudasem

    if root is None:
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
    with contextlib.suppress(OSError, UnicodeDecodeError):
        words = (root / "REVISION").read_text(encoding="utf-8").split()
        if words and all(c in "0123456789abcdefABCDEF" for c in words[0]):
            return f"revision {words[0]} (from REVISION)"
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


#: The keys of the main results that are event loops, not approaches (asyncio's approaches
#: are at the top level).
LOOP_KEYS = ("uvloop", "trio")


def summarize(
    entry: dict[str, Any], sync: dict[str, Any] | None = None
) -> dict[str, dict[str, float]]:
    """Each figure over the runs: median, min and max (figures a run lacks are left out).
    With ``sync``, blocking sync's entry of the same loop, also the latency over sync's paired
    round by round: ``wake_over_sync_us`` (the round's median less sync's median in the same
    round), ``wake_p99_over_sync_us`` (the same of the p99s) and ``empty_over_sync_us``."""
    out: dict[str, dict[str, float]] = {}
    for name, get in FIGURES.items():
        try:
            values = [v for v in (get(r) for r in entry.get("runs", [])) if v is not None]
        except KeyError:
            continue
        if values:
            out[name] = over_runs(values)
    if sync is not None:
        out.update(paired_latency(entry, sync))
    return out


def _by_round(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Runs by their round; runs from before the benchmark recorded it, by their place."""
    return {r.get("round", i): r for i, r in enumerate(runs)}


def paired_latency(entry: dict[str, Any], sync: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Latency over blocking sync's, paired round by round (see :func:`summarize`); figures
    that no round has both of are left out."""
    mine, ref = _by_round(entry.get("runs", [])), _by_round(sync.get("runs", []))
    rounds = sorted(set(mine) & set(ref))
    out: dict[str, dict[str, float]] = {}
    for name, key, get in (
        ("wake_over_sync_us", "latency_100us", statistics.median),
        ("wake_p99_over_sync_us", "latency_100us", lambda xs: pct(xs, 99)),
        ("empty_over_sync_us", "latency_empty", statistics.median),
    ):
        pairs = [
            (get(mine[r][key]), get(ref[r][key]))
            for r in rounds
            if mine[r].get(key) and ref[r].get(key)
        ]
        if pairs:
            out[name] = over_runs(paired_differences(*map(list, zip(*pairs, strict=True))))
    return out


def summaries(entries: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`summarize` of every approach of one loop's entries, paired with its sync."""
    sync = entries.get("sync")
    return {n: summarize(e, sync) for n, e in entries.items() if n not in LOOP_KEYS}


def loop_entries(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The main results by loop: asyncio's at the top level, the others under their names."""
    out = {"asyncio": {n: e for n, e in results.items() if n not in LOOP_KEYS}}
    for loop in LOOP_KEYS:
        if results.get(loop):
            out[loop] = results[loop]
    if not out["asyncio"]:
        del out["asyncio"]
    return out


def _header(meta: dict[str, Any]) -> list[str]:
    tag = " (SIMULATED device: not GPU figures)" if meta["simulated"] else ""
    gpu = meta["gpu"].get("nvidia-smi") or meta["gpu"]["device"]
    packages = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    sections = meta.get("sections")
    ran = f" Sections run: {', '.join(sections)}." if sections else ""
    return [
        f"# Performance{tag}",
        "",
        f"Measured {meta['date']}, {meta.get('commit', 'unknown commit')}, on {gpu}, host "
        f"{meta['host']}. Packages: {packages}.{ran}",
        "",
        f"One process, the same streams and the same `%globaltimer` spin kernel for every "
        f"approach (`aiocudasem bench`), {rounds_text(meta.get('repeats', 1))} interleaved (each "
        "round measures every approach, in the order of a row of a balanced Latin square: over "
        "the rounds each approach takes each place, and follows each other one, equally often). "
        "Each cell is the median over the rounds, with the lowest and highest in square "
        'brackets. Latency = from enqueuing the kernel to the coroutine resuming; "+" is the '
        "difference to blocking sync measured in the same round, median [min-max] over the "
        "rounds. A full garbage collection runs before every timed window, for every approach "
        "alike, and the collector is off during the short ones (latency samples, the stall "
        "test, the curve's rounds).",
        "",
    ]


def _over_sync(f: dict[str, Any], paired: str, fig: str, base: float | None) -> str:
    """The paired difference to sync (``paired``), or, for results from before the benchmark
    paired them, the difference of the medians (``fig`` less ``base``)."""
    if paired in f:
        return spread(f[paired], "+.1f")
    if base is None or fig not in f:
        return "n/a"
    return f"{f[fig]['median'] - base:+.1f}"


def _main_table(results: dict[str, Any], sums: dict[str, Any]) -> list[str]:
    floor = sums.get("sync", {})
    base = floor.get("wake_us", {}).get("median")
    base_p99 = floor.get("wake_p99_us", {}).get("median")
    base_empty = floor.get("empty_us", {}).get("median")
    lines = [
        "| approach | wake latency, 100 us kernel, median (+ over sync) | its p99 (+ over sync) "
        "| empty stream, median (+ over sync) "
        "| CPU while 1,000 coroutines are parked on 3 s kernels (cores) | awaits/s, "
        "1 stream | awaits/s, 8 streams | work-stream GPU time, 100 x (50 us kernel + notify), "
        "loop busy (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in results.items():
        if name in LOOP_KEYS:
            continue
        if "error" in e:
            lines.append(f"| {e['label']} | fails: `{e['error'][:120]}` | | | | | | |")
            continue
        f = sums[name]
        wake = _over_sync(f, "wake_over_sync_us", "wake_us", base)
        p99 = _over_sync(f, "wake_p99_over_sync_us", "wake_p99_us", base_p99)
        empty = _over_sync(f, "empty_over_sync_us", "empty_us", base_empty)
        lines.append(
            f"| {e['label']} | {spread(f.get('wake_us'), '.1f')} ({wake}) us "
            f"| {spread(f.get('wake_p99_us'))} ({p99}) us "
            f"| {spread(f.get('empty_us'), '.1f')} ({empty}) us "
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


def _crowd_table(results: dict[str, Any], sums: dict[str, Any], loop: str = "asyncio") -> list[str]:
    rows = []
    waiters = 10_000
    parked_s = PARKED_S
    for name, e in results.items():
        runs = [r for r in e.get("runs", []) if "many" in r] if name not in LOOP_KEYS else []
        if not runs:
            continue
        waiters = runs[0]["many"]["waiters"]
        if "many_parked" in runs[0]:
            parked_s = runs[0]["many_parked"]["kernel_ms"] / 1e3
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
    table = [
        "| approach | woke (fewest in a run) | extra fds (peak) | RSS growth (most) "
        "| short kernels: p50 / p99 from launch | short kernels: the collector's pauses "
        "| parked before the end (fewest) "
        "| collected before the end (runs) | parked: p50 / p99 after the kernel ends |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    if loop != "asyncio":
        return [
            "",
            f"### {waiters:,} awaiters on 64 streams, {loop}",
            "",
            "The same two crowds as on asyncio.",
            "",
            *table,
        ]
    return [
        "",
        f"## {waiters:,} awaiters on 64 streams",
        "",
        f"Two crowds. *Short kernels*: one 20 ms kernel per stream; starting {waiters:,} tasks "
        "takes "
        "longer than that, so most coroutines find their work done, and the figure (from before "
        "the launches) is the cost of 10,000 awaits of finished work. An await is always a "
        "checkpoint, so each aiocudasem waiter passes the scheduler once; a polling loop that "
        "finds the work done returns without yielding. The checkpoint row passes the scheduler "
        "once too, then queries, with no library code: what any await that is a checkpoint "
        "costs. *Parked*: one "
        f"{parked_s:g} s kernel per stream, so that every coroutine is waiting before its kernel "
        "ends; the figure is taken from the kernels' end (they run side by side, timed by the "
        "GPU's nanosecond clock), and measures how a parked crowd is woken. Before each crowd's "
        "launches a full garbage collection runs, for every approach alike and outside the "
        "figures, so that the collections during a crowd are its own: what an approach's "
        "earlier measurements left behind (the parked-CPU and stall tests run for some "
        "approaches only) would otherwise bring a full collection forward into its crowd. "
        "Once every coroutine "
        "of the parked crowd has started, a full garbage collection runs, for every approach "
        f"alike: starting {waiters:,} tasks makes one due, which would otherwise land in whichever "
        "approach allocates first after the kernels end, and take 100-300 ms there. The "
        "collector's pauses during the short crowd are given for each approach: full "
        "collections in a run (the fewest and the most) and the milliseconds of all "
        "collections (median [min-max]), which are part of its figures.",
        "",
        *table,
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
        if n not in LOOP_KEYS and "awaits_per_s_8_split" in sums.get(n, {})
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


def _loop_section(loop: str, entries: dict[str, Any]) -> list[str]:
    """The main figures of a loop other than asyncio's own: the approaches that run there too
    (in trio's form on trio), with the same columns as asyncio's table, and their crowds."""
    sums = summaries(entries)
    lines = [
        "",
        f"## {loop}: wake latency (100 us kernel), throughput, CPU while parked, GPU time",
        "",
        *_main_table(entries, sums),
    ]
    return lines + _crowd_table(entries, sums, loop)


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
        "a fraction of a second, one after the other, in the order of a balanced Latin "
        "square. The ratio to busy polling is taken within each round, so the machine's "
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


def _ready_table(ready: dict[str, Any], simulated: bool) -> list[str]:
    tag = " (SIMULATED device: not GPU figures)" if simulated else ""
    f = summarize_ready(ready)
    lines = [
        "",
        f"## ready() of several arrays{tag}",
        "",
        f"Microseconds per array, on {ready.get('loop', 'asyncio')}: one `ready(*arrays)` "
        "against `ready(x)` of each in turn, the arrays' producer with nothing pending (the "
        "cost of the call), median [min-max] over the rounds.",
        "",
        "| arrays | " + " | ".join(READY_WAYS.values()) + " | ratio (paired) |",
        "|---|---|---|---|",
    ]
    for n in map(str, ready.get("sizes", READY_SIZES)):
        ratio = median_ratio(ready, n)
        cells = [f"{spread(f.get(w, {}).get(n), '.2f')} us" for w in READY_WAYS]
        lines.append(
            f"| {n} | "
            + " | ".join(cells)
            + f" | {fmt(ratio, '.1f')}"
            + (" x |" if ratio is not None else " |")
        )
    return lines


def curve_table(curve: dict[str, Any]) -> list[str]:
    """The curve section: per loop, a row per kernel length."""
    loops = curve.get("loops", {})
    if not loops:
        return []
    lines = [
        "",
        "## Wake latency and CPU against the kernel's length",
        "",
        "For each kernel length, on each loop, rounds of one wait per approach (in the order "
        "of a balanced Latin square, each approach on a stream of its own) for about "
        "a quarter of a second per approach, 60 rounds at least. Each cell: the median and "
        "p99 of the per-round differences to blocking `cuStreamSynchronize` (the reference, "
        "measured in the same round), in microseconds, and the CPU the process used while the "
        "approach waited (CPU time of all threads over the wall time of its waits), in % of "
        "one core. *event thread* is a thread blocked in `cuEventSynchronize` on an event "
        "created with the blocking-sync flag, which then wakes the loop: the floor for any "
        "approach that does not spin. *ahead c/e/l*: how aiocudasem's waits that woke ahead "
        "ended: caught by the spin after the alarm, early (the alarm came after the work's "
        "end) or late (the spin ran out and the wait parked again).",
    ]
    names = ("aiocudasem", "aiocudasem_parked", "poll0", "event_thread")
    heads = ("aiocudasem", "aiocudasem, spinning off", "busy polling", "event thread")
    for loop, by_length in loops.items():
        lengths = [k for k in by_length if k != "labels"]
        lines += [
            "",
            f"### {loop}",
            "",
            "| kernel | blocking sync: median, p99; CPU | "
            + " | ".join(f"{h}: + median / + p99; CPU" for h in heads)
            + " |",
            "|---|---|" + "---|" * len(heads),
        ]
        for length in lengths:
            figs = by_length[length]
            sync = figs.get("sync", {})
            cells = [
                f"{_us(sync.get('median_us'))}, {_us(sync.get('p99_us'))} us; "
                f"{_cpu(sync.get('cpu_pct'))}"
            ]
            for name in names:
                f = figs.get(name)
                if not f:
                    cells.append("n/a")
                    continue
                a = f.get("ahead") or {}
                note = f"; ahead {a['caught']}/{a['early']}/{a['late']}" if sum(a.values()) else ""
                cells.append(
                    f"{_us(f.get('over_sync_median_us'), '+.1f')} / "
                    f"{_us(f.get('over_sync_p99_us'), '+.1f')} us; {_cpu(f.get('cpu_pct'))}{note}"
                )
            lines.append(f"| {_length(length)} | " + " | ".join(cells) + " |")
    return lines


def _us(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _cpu(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f} %" if x < 10 else f"{x:.0f} %"


def _length(us: str) -> str:
    """A kernel length in microseconds, as 100 us or 3 ms."""
    x = float(us)
    return f"{x / 1000:g} ms" if x >= 1000 else f"{x:g} us"


def service_table(service: dict[str, Any]) -> list[str]:
    """The service section: a row per loop, request count and approach."""
    loops = service.get("loops", {})
    if not loops:
        return []
    rows = []
    for loop, by_n in loops.items():
        for n, by_ap in by_n.items():
            for entry in by_ap.values():
                f = summarize_service(entry)
                rows.append(
                    f"| {loop} | {int(n):,} | {entry['label']} "
                    f"| {spread(f.get('requests_per_s'))} "
                    f"| {spread(f.get('p50_ms'), '.2f')} / {spread(f.get('p99_ms'), '.2f')} ms "
                    f"| {spread(f.get('cpu_pct'))} % | {spread(f.get('other_work_per_s'))} |"
                )
    return [
        "",
        "## A busy service",
        "",
        "N concurrent requests, each launching a kernel of a random length, 0.1-2 ms (seeded: "
        "every approach gets the same lengths), on one of a pool of 16 streams and awaiting it "
        "through an event recorded behind it, while one more task does about 50 us of pure "
        "Python work and yields, over and over: the loop's other work. Each round runs every "
        "approach for a fixed time after a short warm-up; each cell is the median round "
        "[lowest-highest]. Latency is from the launch to the await returning; CPU is the "
        "process's CPU time over the window (all threads), in % of one core; the other work "
        "is its passes per second.",
        "",
        "| loop | requests | approach | requests/s | latency, p50 / p99 | CPU "
        "| other work, passes/s |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]


def stages_table(stages: dict[str, Any], simulated: bool) -> list[str]:
    """The stages section: a row per loop and approach."""
    tag = " (SIMULATED device: not GPU figures)" if simulated else ""
    loops = stages.get("loops", {})
    if not loops:
        return []
    rows = []
    for loop, entry in loops.items():
        if "error" in entry:
            rows.append(f"| {loop} | failed: {entry['error']} | | | |")
            continue
        f = summarize_stages(entry)
        for name in STAGE_APPROACHES:
            cells = [spread(f["stall_us"].get(name), "+.1f") + " us"]
            for state in STAGE_CONDITIONS:
                lat = f["latency"].get(state, {}).get(name, {})
                cells.append(
                    f"{spread(lat.get('median_us'), '.1f')} / {spread(lat.get('p99_us'), '.1f')} us"
                )
            rows.append(f"| {loop} | {entry['labels'][name]} | " + " | ".join(cells) + " |")
        for state in STAGE_CONDITIONS:
            d = f["stage_over_pycallback"].get(state)
            if d and d.get("n"):
                rows.append(
                    f"| {loop} | stage less callback, paired per sample ({state} loop) | | "
                    + " | ".join(
                        f"{d['median']:+.1f} / {d['p99']:+.1f} us" if s == state else ""
                        for s in STAGE_CONDITIONS
                    )
                    + " |"
                )
    first: dict[str, Any] = next((e for e in loops.values() if "error" not in e), {})
    return [
        "",
        f"## Host stages against a Python host callback{tag}",
        "",
        f"Stall: the work stream's GPU time for {first.get('stages', STAGES)} x (50 us kernel "
        "+ stage), timed by "
        "events on that stream while the loop runs other Python work in passes of about 50 us, "
        "less the same kernels with no stage in the same round, per stage (median round "
        "[lowest-highest]). Latency: from a 100 us kernel's end (the host time from its launch "
        "less its length, as the crowds' figures) to the stage's code starting (for the "
        "callback, to the task awaiting it resuming), median / p99 of each round's samples, "
        "median round [lowest-highest], on an idle loop and on the busy one; the paired rows "
        "give the stage's latency less the callback's, sample by sample.",
        "",
        "| loop | approach | stall per stage | latency, idle loop | latency, busy loop |",
        "|---|---|---|---|---|",
        *rows,
    ]


def progress_table(progress: dict[str, Any], simulated: bool) -> list[str]:
    """The progress section: a row per loop and approach."""
    tag = " (SIMULATED device: not GPU figures)" if simulated else ""
    loops = progress.get("loops", {})
    if not loops:
        return []
    rows = []
    relative = False
    for loop, entry in loops.items():
        if "error" in entry:
            rows.append(f"| {loop} | failed: {entry['error']} | | | |")
            continue
        relative = relative or entry.get("clock") == "relative"
        f = summarize_progress(entry)
        for name in PROGRESS_APPROACHES:
            fig = f.get(name, {})
            rows.append(
                f"| {loop} | {entry['labels'][name]} "
                f"| {spread(fig.get('median_us'), '.1f')} / {spread(fig.get('p99_us'), '.1f')} us "
                f"| {spread(fig.get('cpu_pct'), '.1f')} % | {fig.get('late', 0)} |"
            )
    first: dict[str, Any] = next((e for e in loops.values() if "error" not in e), {})
    clock = (
        " The kernel's stamps are the GPU's %globaltimer, whose origin the host's clock does "
        "not share: each latency is over the fastest wake of its round (either approach), "
        "taken as 0, not from the publish itself."
        if relative
        else " The stamps and the host share one clock: latencies are from the publish."
    )
    return [
        "",
        f"## Kernel progress{tag}",
        "",
        f"A kernel publishes {first.get('count', 'N')} values into a host timeline, "
        f"{first.get('interval_us', 0) / 1000:g} ms apart, stamping its clock just before each; "
        "the host awaits each value in order, with wait_value(n) or by polling the word, each "
        "in its own kernel's run, in the same rounds. Wake latency: the host's clock when the "
        "wait returned less the value's stamp, median / p99 of each round, median round "
        "[lowest-highest]; a wait whose value was already there is left out (counted in the "
        "last column). CPU: the process's CPU time over the kernel's run, in % of one core."
        + clock,
        "",
        "| loop | approach | wake latency, median / p99 | CPU | left out |",
        "|---|---|---|---|---|",
        *rows,
    ]


def markdown(
    results: dict[str, Any],
    meta: dict[str, Any],
    no_plot: str | None = None,
    signal: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
    plot_link: str = "latency.png",
    curve: dict[str, Any] | None = None,
    service: dict[str, Any] | None = None,
    no_curve_plot: str | None = None,
    curve_link: str = "curve.png",
    ready: dict[str, Any] | None = None,
    stages: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
) -> str:
    """The page. ``no_plot``: why there is no latency.png (then the page says so and links
    none); ``None``: link the plot, at ``plot_link`` (by default beside the page). ``signal``:
    the host-signal figures, if they were measured. ``paired``: the paired throughput rounds
    (``Bench.paired``). ``curve``, ``service``: those sections, if they ran; ``no_curve_plot``
    and ``curve_link`` are to curve.png what ``no_plot`` and ``plot_link`` are to
    latency.png. ``ready``, ``stages``, ``progress``: those sections, if they ran. A section
    that did not run has no table."""
    by_loop = loop_entries(results)
    lines = _header(meta)
    if "asyncio" in by_loop:
        entries = by_loop["asyncio"]
        sums = summaries(entries)
        lines += _main_table(entries, sums) + _crowd_table(entries, sums)
        lines += _split_table(entries, sums, meta.get("devices", 2))
    for loop in LOOP_KEYS:
        if loop in by_loop:
            lines += _loop_section(loop, by_loop[loop])
    for loop in LOOP_KEYS:
        if f"{loop}_not_measured" in meta:
            lines += ["", f"## {loop}", "", f"Not measured: {meta[f'{loop}_not_measured']}."]
    if paired:
        lines += paired_table(paired, results)
    if curve:
        lines += curve_table(curve)
        if no_curve_plot is None:
            lines += ["", f"![wake latency and CPU against the kernel's length]({curve_link})"]
        else:
            lines += ["", f"(No curve plot: {no_curve_plot}.)"]
    if service:
        lines += service_table(service)
    if signal is not None:
        lines += _signal_table(signal)
    if ready is not None:
        lines += _ready_table(ready, meta["simulated"])
    if stages is not None:
        lines += stages_table(stages, meta["simulated"])
    if progress is not None:
        lines += progress_table(progress, meta["simulated"])
    if by_loop:
        if no_plot is None:
            lines += ["", f"![latency distributions]({plot_link})", ""]
        else:
            lines += ["", f"(No latency plot: {no_plot}.)", ""]
    else:
        lines.append("")
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
    ready: dict[str, Any] | None = None,
    stages: dict[str, Any] | None = None,
    progress: dict[str, Any] | None = None,
) -> list[str]:
    """The few lines printed at the end of a run, in place of the page: per loop, the wake
    latency and throughput of the library (or, where ``--only`` left it out, of the first
    other approach measured) and its paired ratio to busy polling on 8 streams, over those of
    blocking sync and busy polling; then the host-signal medians, and the ready section's
    cost per array; the stages' stall and busy-loop latency, and the progress wakes, on the
    first loop of each."""
    tag = "SIMULATED device, not GPU figures; " if meta["simulated"] else ""
    lines = [f"summary ({tag}medians over {rounds_text(meta.get('repeats', 1))}):"]
    if loop_entries(results):
        lines.append(
            f"  {'loop':<8} {'approach':<18} {'wake, 100 us kernel':<21} awaits/s, 1 / 8 streams"
        )
    for loop, entries in loop_entries(results).items():
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
    if ready is not None:
        per_array = summarize_ready(ready)
        n = str(max(ready.get("sizes", READY_SIZES)))
        each, batched = (_median(per_array.get(w, {}), n) for w in READY_WAYS)
        lines.append(
            f"  ready(), {n} arrays, per array: ready(*arrays) {fmt(batched, '.2f')} us, "
            f"ready(x) of each {fmt(each, '.2f')} us"
        )
    st = next(
        ((lp, e) for lp, e in (stages or {}).get("loops", {}).items() if "error" not in e), None
    )
    if st is not None:
        sf = summarize_stages(st[1])
        cells = []
        for name in STAGE_APPROACHES:
            stall = _median(sf["stall_us"], name)
            busy = _median(sf["latency"].get("busy", {}).get(name, {}), "median_us")
            cells.append(f"{name} {fmt(stall, '+.1f')} us stall, {fmt(busy, '.1f')} us")
        lines.append(
            f"  stages on {st[0]}, per stage (stall; latency on a busy loop): " + ", ".join(cells)
        )
    pr = next(
        ((lp, e) for lp, e in (progress or {}).get("loops", {}).items() if "error" not in e), None
    )
    if pr is not None:
        pf = summarize_progress(pr[1])
        rel = " (over the fastest wake)" if pr[1].get("clock") == "relative" else ""
        cells = [
            f"{name} {fmt(_median(pf.get(name, {}), 'median_us'), '.1f')} us, "
            f"CPU {fmt(_median(pf.get(name, {}), 'cpu_pct'), '.1f')} %"
            for name in PROGRESS_APPROACHES
        ]
        lines.append(f"  progress on {pr[0]}, wake after publish{rel}: " + "; ".join(cells))
    return lines


def _median(figures: dict[str, Any], name: str) -> float | None:
    fig = figures.get(name)
    return None if fig is None else float(fig["median"])


#: What the page and the warning say when matplotlib is missing.
NO_MATPLOTLIB = "matplotlib is not installed; pip install 'aiocudasem[bench]' installs it"


def _pyplot() -> tuple[Any, str | None]:
    """matplotlib's pyplot, drawing to files, or None and why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, NO_MATPLOTLIB
    except Exception as exc:  # a broken installation: the run's figures still count
        return None, f"matplotlib failed to load ({type(exc).__name__}: {exc})"
    return plt, None


def plot(results: dict[str, Any], path: Path, sim: bool) -> str | None:
    """Write the latency plot to ``path``. Returns ``None`` if it did, else why not."""
    plt, why = _pyplot()
    if why is not None:
        return why
    names = [n for n, e in results.items() if n not in LOOP_KEYS and e.get("runs")]
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


#: The curve plot's lines: approach, label.
CURVE_LINES = (
    ("aiocudasem", "aiocudasem"),
    ("aiocudasem_parked", "aiocudasem, spinning off"),
    ("poll0", "busy polling"),
    ("event_thread", "event thread (floor without spinning)"),
)


def plot_curve(curve: dict[str, Any], path: Path, sim: bool) -> str | None:
    """Write the curve's plot to ``path``: per loop, the median over sync against the kernel's
    length (top) and the CPU while waiting (bottom). Returns ``None`` if it did, else why
    not."""
    plt, why = _pyplot()
    if why is not None:
        return why
    loops = curve.get("loops", {})
    fig, axes = plt.subplots(
        2, max(1, len(loops)), figsize=(4.5 * max(1, len(loops)) + 1, 7), squeeze=False
    )
    for col, (loop, by_length) in enumerate(loops.items()):
        lengths = [k for k in by_length if k != "labels"]
        xs = [float(k) for k in lengths]
        top, bottom = axes[0][col], axes[1][col]
        for name, label in CURVE_LINES:
            figs = [by_length[k].get(name, {}) for k in lengths]
            over = [f.get("over_sync_median_us") for f in figs]
            cpu = [f.get("cpu_pct") for f in figs]
            if any(v is not None for v in over):
                top.plot(xs, [float("nan") if v is None else v for v in over], "o-", label=label)
            if any(v is not None for v in cpu):
                bottom.plot(
                    xs,
                    [float("nan") if v is None else max(v, 0.01) for v in cpu],
                    "o-",
                    label=label,
                )
        sync_cpu = [by_length[k].get("sync", {}).get("cpu_pct") for k in lengths]
        bottom.plot(
            xs,
            [float("nan") if v is None else max(v, 0.01) for v in sync_cpu],
            "k--",
            label="blocking sync",
        )
        top.set_xscale("log")
        top.set_yscale("symlog", linthresh=10)
        top.axhline(0, color="grey", linewidth=0.8)
        top.set_title(loop)
        top.set_ylabel("wake latency over blocking sync, median, us")
        bottom.set_xscale("log")
        bottom.set_yscale("log")
        bottom.set_xlabel("kernel length, us")
        bottom.set_ylabel("CPU while waiting, % of a core")
    axes[0][0].legend(fontsize="small")
    axes[1][0].legend(fontsize="small")
    fig.suptitle(
        "Wake latency and CPU against the kernel's length" + (" (SIMULATED device)" if sim else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
