#!/usr/bin/env python3
"""Render the tables of a benchmark results file as Markdown.

    python3 scripts/render-results.py RESULTS.json[.gz]           # print them
    python3 scripts/render-results.py RESULTS.json[.gz] --write   # update the pages

RESULTS is the ``results.json`` that ``aiocudasem bench`` writes (or a gzip'ed copy of it, as
kept in ``benchmarks/``). Everything comes from that file: its ``meta`` (date, GPU, host,
versions), its ``summary`` (median, lowest and highest round of each figure), its ``paired``
rounds and the approaches' labels. Neither the package nor a GPU is needed.

Two blocks:

- **results**: one small table per event loop (asyncio, trio, uvloop; a loop the file lacks is
  named as not measured): wake latency inside the spin window and when parked (over blocking
  sync, paired round by round where the file has it), throughput against busy polling in the
  paired rounds, CPU while parked against a bare C host function, and GPU time per await on the
  work stream.
- **results-detail**: every approach of the run on each loop, the crowds and the host-signal
  figures.
- **results-curve**: the latency curve against the kernel's length, the busy service, host
  stages against a Python host callback, and kernel progress.

A block whose section the file lacks (a run of ``--sections curve,service``, say) is left as it
is, and the file's own header says which run each block comes from.

``--write`` replaces the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in
README.md (the results block) and docs/performance.md (all three), and fails if a page lacks
the markers.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import statistics
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The pages --write updates, and the blocks each one holds.
PAGES: dict[str, tuple[str, ...]] = {
    "README.md": ("results",),
    "docs/performance.md": ("results", "results-detail", "results-curve"),
}
#: aiocudasem's stall figure is the GPU time of this many (kernel + notification) pairs.
STALL_AWAITS = 100
#: The keys of a results file's summary that are not asyncio's approaches.
NOT_APPROACHES = ("trio", "uvloop", "signal", "paired", "service", "ready", "stages", "progress")

Fig = dict[str, float] | None


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    if "meta" not in data or "summary" not in data:
        raise SystemExit(f"{path}: not a results file of `aiocudasem bench` (no meta/summary)")
    return data


# ---------------------------------------------------------------- formatting


def fmt(x: float, spec: str) -> str:
    """``format(x, spec)`` for specs such as ``.1f`` and ``+.2f``, rounding halves up as
    written in the file (1.025 -> 1.03), not as the nearest binary float does."""
    sign = spec.startswith("+")
    digits = int(spec.lstrip("+.").rstrip("f"))
    q = Decimal(repr(x)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    text = f"{q:f}"
    if q == 0 and text.startswith("-"):
        text = text[1:]
    return ("+" + text if sign and not text.startswith("-") else text) if sign else text


def med(fig: Fig) -> float | None:
    return None if not fig else fig["median"]


def spread(fig: Fig, spec: str = ".1f", unit: str = "", scale: float = 1.0) -> str:
    """``median [lowest-highest]`` with a unit, or ``n/a``."""
    if not fig:
        return "n/a"
    m, lo, hi = (fmt(fig[k] * scale, spec) for k in ("median", "min", "max"))
    if fig.get("runs", 2) == 1 or lo == hi:
        return f"{m}{unit}"
    # Signed figures: "to", where a minus sign would read as the dash.
    return f"{m}{unit} [{lo} to {hi}]" if spec.startswith("+") else f"{m}{unit} [{lo}-{hi}]"


def rate(x: float | None) -> str:
    """Awaits per second, as 81.0k."""
    return "n/a" if x is None else f"{fmt(x / 1000, '.1f')}k"


def cpu(fig: Fig) -> str:
    """Cores as a percentage of one: two decimals for a sleeper, none for a poller."""
    if not fig:
        return "n/a"
    return spread(fig, ".2f" if fig["median"] < 0.5 else ".0f", " %", 100)


def signed(x: float, spec: str = ".1f") -> str:
    return fmt(x, "+" + spec)


def source_digest(root: Path) -> str | None:
    """The digest ``aiocudasem bench`` records (``aiocudasem.cli.bench._report.source_digest``),
    computed from this checkout's files, or None where there is no package source."""
    pkg = root / "aiocudasem"
    if not pkg.is_dir():
        return None
    h = hashlib.sha256()
    for path in sorted(pkg.rglob("*")):
        if path.suffix in (".py", ".c", ".pyi", ".cu") and "__pycache__" not in path.parts:
            h.update(path.relative_to(pkg).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------- the blocks


def header(data: dict[str, Any]) -> list[str]:
    meta = data["meta"]
    gpu = meta.get("gpu", {})
    smi = gpu.get("nvidia-smi", "")
    driver = smi.split(",")[-1].strip() if "," in smi else ""
    device = gpu.get("device", "unknown GPU")
    on = f"one {device}" + (f" (driver {driver})" if driver else "")
    if meta.get("devices", 1) > 1:
        on = f"{meta['devices']} devices, the first {device}"
    versions = meta.get("versions", {})
    py = f", Python {versions['python']}" if "python" in versions else ""
    repeats = meta.get("repeats", 1)
    lines = []
    if meta.get("simulated"):
        lines += [
            "**SIMULATED device: these figures say nothing about GPU performance.**",
            "",
        ]
    lines.append(
        f"Measured {meta.get('date', 'on an unknown date')} on {on}, host "
        f"{meta.get('host', 'unknown')}{py}, with `aiocudasem bench`: {repeats} interleaved "
        f"round{'s' if repeats != 1 else ''}; each cell is the median round, with the lowest "
        "and highest in brackets."
    )
    recorded = re.search(r"source digest (\w+)", meta.get("commit", ""))
    current = source_digest(ROOT)
    if recorded and current and recorded.group(1) != current:
        lines.append(
            "The package's source has changed since this run: these figures are not measured "
            "on the current code."
        )
    return lines


def paired(data: dict[str, Any], loop: str, n: str) -> tuple[Fig, float | None]:
    """aiocudasem's ratio to busy polling in the paired rounds, and polling's awaits/s."""
    ratio = data["summary"].get("paired", {}).get(loop, {}).get(n, {}).get("aiocudasem")
    rounds = data.get("paired", {}).get(loop, {}).get(n, {}).get("poll0")
    return ratio, (statistics.median(rounds) if rounds else None)


def per_await_us(sums: dict[str, Any], name: str) -> float | None:
    """Work-stream GPU time per await over blocking sync's, in microseconds (medians)."""
    stall, floor = (
        med(sums.get(name, {}).get("stall_ms")),
        med(sums.get("sync", {}).get("stall_ms")),
    )
    if stall is None or floor is None:
        return None
    return (stall - floor) * 1e3 / STALL_AWAITS


def gpu_us(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{signed(x / 1e3, '.2f')} ms" if abs(x) >= 1000 else f"{signed(x)} us"


def loop_table(data: dict[str, Any], loop: str) -> list[str]:
    summary = data["summary"]
    sums: dict[str, Any] = (
        {k: v for k, v in summary.items() if k not in NOT_APPROACHES}
        if loop == "asyncio"
        else summary.get(loop, {})
    )
    mine = sums.get("aiocudasem", {})
    sync = med(sums.get("sync", {}).get("wake_us"))
    rows = ["| figure | aiocudasem | compared with |", "|---|---|---|"]

    def over_sync(figs: dict[str, Any]) -> str:
        """The paired difference to sync, round by round, where the file has it; else the
        difference of the medians."""
        paired = figs.get("wake_over_sync_us")
        if paired:
            return f" ({spread(paired, '+.1f', ' us')} over blocking sync, paired rounds)"
        m = med(figs.get("wake_us"))
        return "" if m is None or sync is None else f" ({signed(m - sync)} over blocking sync)"

    wake = mine.get("wake_us")
    rows.append(
        f"| wake latency, 100 us kernel, inside the spin window | {spread(wake, unit=' us')}"
        f"{over_sync(mine)} | blocking `cuStreamSynchronize`, which freezes the loop: "
        f"{spread(sums.get('sync', {}).get('wake_us'), unit=' us')}; busy polling: "
        f"{spread(sums.get('poll0', {}).get('wake_us'), unit=' us')} |"
    )
    parked = sums.get("aiocudasem_parked", {}).get("wake_us")
    if parked:
        bare = spread(sums.get("c_workstream", {}).get("wake_us"), unit=" us")
        rows.append(
            f"| wake latency, 100 us kernel, parked (spinning off) | "
            f"{spread(parked, unit=' us')}{over_sync(sums['aiocudasem_parked'])} | a bare C host "
            f"function with an eventfd, no library: {bare} |"
        )
    else:
        rows.append(f"| wake latency, parked (spinning off) | not measured on {loop} | |")
    for n in ("1", "8"):
        ratio, poll = paired(data, loop, n)
        streams = "1 stream" if n == "1" else f"{n} streams"
        rows.append(
            f"| awaits per second, {streams}, paired rounds | "
            f"{spread(ratio, '.2f', ' x')} busy polling | busy polling: {rate(poll)}/s, and a "
            "whole core |"
        )
    if mine.get("cpu_parked"):
        rows.append(
            f"| CPU while 1,000 coroutines are parked | {cpu(mine.get('cpu_parked'))} of a "
            f"core | a bare C host function, no library: "
            f"{cpu(sums.get('c_workstream', {}).get('cpu_parked'))}; "
            f"busy polling: {cpu(sums.get('poll0', {}).get('cpu_parked'))} |"
        )
    else:
        rows.append(f"| CPU while 1,000 coroutines are parked | not measured on {loop} | |")
    mine_gpu = per_await_us(sums, "aiocudasem")
    if mine_gpu is not None:
        rows.append(
            f"| work-stream GPU time per await, loop busy (medians) | {gpu_us(mine_gpu)} | a C "
            f"host function on the work stream: {gpu_us(per_await_us(sums, 'c_workstream'))}; "
            f"a Python host callback: {gpu_us(per_await_us(sums, 'pycallback'))} |"
        )
    else:
        rows.append(f"| work-stream GPU time per await | not measured on {loop} | |")
    return [f"### {loop}", "", *rows]


def results_block(data: dict[str, Any]) -> str:
    lines = header(data)
    lines += ["", *loop_table(data, "asyncio")]
    summary = data["summary"]
    spin, park = (
        med(summary.get("aiocudasem", {}).get("wake_us")),
        med(summary.get("aiocudasem_parked", {}).get("wake_us")),
    )
    if spin is not None and park is not None:
        lines += [
            "",
            f"A parked wake took {fmt(park - spin, '.0f')} us longer than one inside the spin "
            "window (medians).",
        ]
    if summary.get("trio"):
        lines += ["", *loop_table(data, "trio")]
    else:
        lines += ["", "### trio", "", "Not measured in this run."]
    if data["summary"].get("uvloop"):
        lines += ["", *loop_table(data, "uvloop")]
    else:
        lines += [
            "",
            "### uvloop",
            "",
            "Not measured in this run. The test suite runs every async test on asyncio with "
            "uvloop too.",
        ]
    return "\n".join(lines)


def detail_block(data: dict[str, Any]) -> str:
    summary, results = data["summary"], data.get("results", {})

    def label(name: str, table: dict[str, Any]) -> str:
        return str(table.get(name, {}).get("label", name))

    sync = med(summary.get("sync", {}).get("wake_us"))
    lines = [
        "#### Every approach, asyncio",
        "",
        "| approach | wake latency, 100 us kernel (us): median (+ over sync); p99 "
        "| awaits/s, 1 / 8 streams | CPU while parked | work-stream GPU time per await |",
        "|---|---|---|---|---|",
    ]
    for name, f in summary.items():
        if name in NOT_APPROACHES:
            continue
        entry = results.get(name, {})
        if "error" in entry or not f:
            lines.append(
                f"| {label(name, results)} | fails: `{entry.get('error', '?').split(':')[0]}` "
                "| | | |"
            )
            continue
        lines.append(approach_row(label(name, results), name, f, summary, sync))
    for loop in ("uvloop", "trio"):
        lines += loop_detail(data, loop)
    lines += crowd_table("asyncio", summary, results)
    for loop in ("uvloop", "trio"):
        lines += crowd_table(
            loop, data["summary"].get(loop, {}), data.get("results", {}).get(loop, {})
        )
    signal = summary.get("signal", {})
    if signal:
        lines += [
            "",
            "#### Host signal to stream resume",
            "",
            "A stream waits for a value, the host signals it: microseconds from the signal "
            "call to the host seeing the stream's next write.",
            "",
            "| producer | median | p99 |",
            "|---|---|---|",
        ]
        for name, f in signal.items():
            median, p99 = (
                spread(f.get("median_us"), unit=" us"),
                spread(f.get("p99_us"), unit=" us"),
            )
            lines.append(f"| {label(name, data.get('signal', {}))} | {median} | {p99} |")
    return "\n".join(lines)


def crowd_table(loop: str, sums: dict[str, Any], table: dict[str, Any]) -> list[str]:
    """The two crowds of 10,000 awaiters on ``loop``, for each approach that ran them."""
    crowd = [
        (name, f)
        for name, f in sums.items()
        if name not in NOT_APPROACHES and f and "many_p50_ms" in f
    ]
    if not crowd:
        return []
    lines = [
        "",
        f"#### 10,000 awaiters on 64 streams, {loop}",
        "",
        "*Short*: 20 ms kernels, timed from before the launches (most coroutines find their "
        "work done). *Parked*: 1.5 s kernels, timed from the kernels' end (every coroutine "
        "parked before it). Milliseconds.",
        "",
        "| approach | short, p50 | short, p99 | parked, p50 | parked, p99 |",
        "|---|---|---|---|---|",
    ]
    for name, f in crowd:
        lines.append(
            f"| {table.get(name, {}).get('label', name)} | {spread(f.get('many_p50_ms'))} "
            f"| {spread(f.get('many_p99_ms'))} | {spread(f.get('parked_p50_ms'))} "
            f"| {spread(f.get('parked_p99_ms'))} |"
        )
    return lines


def loop_detail(data: dict[str, Any], loop: str) -> list[str]:
    """Every approach measured on ``loop`` (uvloop, trio), as on asyncio."""
    sums = data["summary"].get(loop, {})
    if not sums:
        return []
    table = data.get("results", {}).get(loop, {})
    base = med(sums.get("sync", {}).get("wake_us"))
    lines = [
        "",
        f"#### Every approach, {loop}",
        "",
        "| approach | wake latency, 100 us kernel (us): median (+ over sync); p99 "
        "| awaits/s, 1 / 8 streams | CPU while parked | work-stream GPU time per await |",
        "|---|---|---|---|---|",
    ]
    for name, f in sums.items():
        lines.append(approach_row(table.get(name, {}).get("label", name), name, f, sums, base))
    return lines


def approach_row(
    label: str, name: str, f: dict[str, Any], sums: dict[str, Any], sync: float | None
) -> str:
    """One approach's row of an "every approach" table: its wake latency (over blocking sync,
    paired where the file has it, else the difference of the medians to ``sync``), p99,
    throughput, parked CPU and work-stream GPU time per await, from its summary ``f`` among
    its loop's ``sums``."""
    paired, m = f.get("wake_over_sync_us"), med(f.get("wake_us"))
    if paired:
        plus = f" ({spread(paired, '+.1f')})"
    else:
        plus = "" if m is None or sync is None else f" ({signed(m - sync)})"
    return (
        f"| {label} | {spread(f.get('wake_us'))}{plus}; {spread(f.get('wake_p99_us'), '.0f')} "
        f"| {rate(med(f.get('awaits_per_s_1')))} / {rate(med(f.get('awaits_per_s_8')))} "
        f"| {cpu(f.get('cpu_parked'))} "
        f"| {gpu_us(per_await_us(sums, name)) if name != 'sync' else 'the floor'} |"
    )


#: The curve's columns: approach, heading.
CURVE_COLUMNS = (
    ("aiocudasem", "aiocudasem"),
    ("aiocudasem_parked", "spinning off"),
    ("poll0", "busy polling"),
    ("event_thread", "event thread (floor without spinning)"),
)


def _length(us: str) -> str:
    x = float(us)
    return f"{x / 1000:g} ms" if x >= 1000 else f"{x:g} us"


def _pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{fmt(x, '.1f')} %" if x < 10 else f"{fmt(x, '.0f')} %"


def curve_detail(data: dict[str, Any]) -> list[str]:
    """The curve: per loop, a row per kernel length; each cell the median / p99 of the paired
    differences to blocking sync, and the CPU while waiting."""
    loops = data.get("curve", {}).get("loops", {})
    if not loops:
        return []
    lines = [
        "",
        "#### Wake latency and CPU against the kernel's length",
        "",
        "Each cell: the median / p99 of the per-round differences to blocking sync, in "
        "microseconds, and the CPU while waiting, in % of one core. *ahead c/e/l*: how "
        "aiocudasem's waits that woke ahead ended, where the run counted them: caught by the "
        "spin after the alarm, early (the alarm came after the work's end) or late (the spin "
        "ran out and the wait parked again).",
    ]
    for loop, by_length in loops.items():
        lines += [
            "",
            f"##### {loop}",
            "",
            "| kernel | blocking sync, median; CPU | "
            + " | ".join(head for _, head in CURVE_COLUMNS)
            + " |",
            "|---|---|" + "---|" * len(CURVE_COLUMNS),
        ]
        for length, figs in by_length.items():
            if length == "labels":
                continue
            sync = figs.get("sync", {})
            cells = [f"{fmt(sync['median_us'], '.1f')} us; {_pct(sync.get('cpu_pct'))}"]
            for name, _ in CURVE_COLUMNS:
                f = figs.get(name)
                if not f or f.get("over_sync_median_us") is None:
                    cells.append("n/a")
                    continue
                cells.append(
                    f"{signed(f['over_sync_median_us'])} / {signed(f['over_sync_p99_us'])} us; "
                    f"{_pct(f.get('cpu_pct'))}{ahead_note(f)}"
                )
            lines.append(f"| {_length(length)} | " + " | ".join(cells) + " |")
    return lines


def ahead_note(fig: dict[str, Any]) -> str:
    """How the waits that woke ahead ended, caught / early / late, where the run counted
    them and any did."""
    a = fig.get("ahead") or {}
    if not sum(a.values()):
        return ""
    return f"; ahead {a.get('caught', 0)}/{a.get('early', 0)}/{a.get('late', 0)}"


def service_detail(data: dict[str, Any]) -> list[str]:
    """The busy service: a row per loop, request count and approach."""
    loops = data["summary"].get("service", {})
    if not loops:
        return []
    labels = data.get("service", {}).get("loops", {})
    lines = [
        "",
        "#### A busy service",
        "",
        "N concurrent requests, each awaiting a kernel of 0.1-2 ms on a pool of 16 streams, "
        "while the loop runs other Python work (about 50 us per pass).",
        "",
        "| loop | requests | approach | requests/s | latency, p50 / p99 | CPU "
        "| other work, passes/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for loop, by_n in loops.items():
        for n, by_ap in by_n.items():
            for name, f in by_ap.items():
                label = labels.get(loop, {}).get(n, {}).get(name, {}).get("label", name)
                lines.append(
                    f"| {loop} | {int(n):,} | {label} | {spread(f.get('requests_per_s'), '.0f')} "
                    f"| {spread(f.get('p50_ms'), '.2f')} / {spread(f.get('p99_ms'), '.2f', ' ms')} "
                    f"| {spread(f.get('cpu_pct'), '.0f', ' %')} "
                    f"| {spread(f.get('other_work_per_s'), '.0f')} |"
                )
    return lines


def stages_detail(data: dict[str, Any]) -> list[str]:
    """Host stages against a Python host callback: a row per loop and approach, then the
    paired differences."""
    loops = data["summary"].get("stages", {})
    if not loops:
        return []
    entries = data.get("stages", {}).get("loops", {})
    n = next((e.get("stages") for e in entries.values() if "stages" in e), "N")
    lines = [
        "",
        "#### Host stages against a Python host callback",
        "",
        f"Stall: the work stream's GPU time per stage, for {n} x (50 us kernel + stage) while "
        "the loop runs other Python work (about 50 us per pass), over the same kernels with no "
        "stage in the same round. Latency: from a 100 us kernel's end to the stage's code "
        "starting (for the callback, to the task awaiting it resuming), median / p99, on an "
        "idle and on the busy loop; the stage less the callback is paired sample by sample.",
        "",
        "| loop | approach | stall per stage | latency, idle loop | latency, busy loop |",
        "|---|---|---|---|---|",
    ]
    for loop, f in loops.items():
        labels = entries.get(loop, {}).get("labels", {})
        for name, stall in f.get("stall_us", {}).items():
            cells = [spread(stall, "+.1f", " us")]
            for state in ("idle", "busy"):
                lat = f.get("latency", {}).get(state, {}).get(name, {})
                cells.append(
                    f"{spread(lat.get('median_us'))} / {spread(lat.get('p99_us'), '.1f', ' us')}"
                )
            lines.append(f"| {loop} | {labels.get(name, name)} | " + " | ".join(cells) + " |")
        paired = f.get("stage_over_pycallback", {})
        if paired:
            cells = [
                f"{signed(d['median'])} / {signed(d['p99'])} us"
                if (d := paired.get(state)) and d.get("n")
                else "n/a"
                for state in ("idle", "busy")
            ]
            lines.append(
                f"| {loop} | stage less callback, paired per sample | | " + " | ".join(cells) + " |"
            )
    return lines


def progress_detail(data: dict[str, Any]) -> list[str]:
    """Kernel progress: a row per loop and approach."""
    loops = data["summary"].get("progress", {})
    if not loops:
        return []
    entries = data.get("progress", {}).get("loops", {})
    relative = any(e.get("clock") == "relative" for e in entries.values())
    first = next((e for e in entries.values() if "count" in e), {})
    lines = [
        "",
        "#### Kernel progress",
        "",
        f"A kernel publishes {first.get('count', 'N')} values into a host timeline, "
        f"{fmt(first.get('interval_us', 0) / 1000, '.1f')} ms apart, each awaited in order with "
        "`wait_value(n)` or by polling the word; wake latency after the kernel's stamp before "
        "each publish, median / p99, and CPU while waiting, in % of one core."
        + (
            " The stamps are the GPU's %globaltimer, whose origin the host's clock does not "
            "share: latencies are over the fastest wake of their round, taken as 0."
            if relative
            else ""
        ),
        "",
        "| loop | approach | wake latency, median / p99 | CPU |",
        "|---|---|---|---|",
    ]
    for loop, by_ap in loops.items():
        labels = entries.get(loop, {}).get("labels", {})
        for name, f in by_ap.items():
            lines.append(
                f"| {loop} | {labels.get(name, name)} "
                f"| {spread(f.get('median_us'))} / {spread(f.get('p99_us'), '.1f', ' us')} "
                f"| {spread(f.get('cpu_pct'), '.1f', ' %')} |"
            )
    return lines


def curve_block(data: dict[str, Any]) -> str:
    """The latency curve against the kernel's length, the busy service, host stages and kernel
    progress, with the run's header: a run of those sections alone (``--sections
    curve,service``, say) fills this block only."""
    return "\n".join(
        header(data)
        + curve_detail(data)
        + service_detail(data)
        + stages_detail(data)
        + progress_detail(data)
    )


def has_main(data: dict[str, Any]) -> bool:
    """Whether the file holds the main section's figures (the results blocks)."""
    return any(name not in NOT_APPROACHES for name in data["summary"])


def has_curve(data: dict[str, Any]) -> bool:
    """Whether the file holds the curve, the service, the stages or the progress section (the
    results-curve block)."""
    return bool(
        data.get("curve", {}).get("loops")
        or data["summary"].get("service")
        or data["summary"].get("stages")
        or data["summary"].get("progress")
    )


BLOCKS = {"results": results_block, "results-detail": detail_block, "results-curve": curve_block}
#: Which blocks a file can fill: a block whose section the run left out keeps what it holds.
HAS = {"results": has_main, "results-detail": has_main, "results-curve": has_curve}


def replace(text: str, name: str, body: str, page: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise SystemExit(f"{page}: needs one {begin} ... {end} pair")
    note = "<!-- generated by scripts/render-results.py: edit the script, not this text -->"
    return pattern.sub(lambda _: f"{begin}\n{note}\n\n{body}\n\n{end}", text)


def write(data: dict[str, Any], root: Path) -> list[str]:
    changed = []
    for page, names in PAGES.items():
        path = root / page
        text = old = path.read_text(encoding="utf-8")
        for name in names:
            if HAS[name](data):
                text = replace(text, name, BLOCKS[name](data), page)
        if text != old:
            path.write_text(text, encoding="utf-8")
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results.json of `aiocudasem bench`, or .gz")
    parser.add_argument(
        "--write",
        action="store_true",
        help="replace the marked blocks of README.md and docs/performance.md",
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout whose pages --write updates"
    )
    args = parser.parse_args(argv)
    data = load(args.results)
    if not has_main(data) and not has_curve(data):
        raise SystemExit(f"{args.results}: no section of the benchmark that the pages show")
    if args.write:
        changed = write(data, args.root)
        print("updated: " + (", ".join(changed) if changed else "nothing (already current)"))
    else:
        blocks = [BLOCKS[name](data) for name in BLOCKS if HAS[name](data)]
        sys.stdout.write("\n\n".join(blocks) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
