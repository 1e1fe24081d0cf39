#!/usr/bin/env python3
"""Two versions of the library, side by side: ``aiocudasem bench`` of each, interleaved.

    python3 scripts/bench-ab.py BEFORE AFTER [--rounds 5] [--only aiocudasem,poll0] [--out DIR]
                                [--build]

BEFORE and AFTER are checkouts (folders holding ``aiocudasem/`` with its C extensions built, or
``--build`` to build them).
Each round runs ``python -m aiocudasem bench --repeats 1`` once in each, in an order that
alternates from round to round, so that drift in the machine falls on both alike. Every figure
is then the median over the rounds with the lowest and highest in brackets, and throughput is
also given as the median of the per-round ratios to busy polling, measured in the same process
as the library. The table goes to standard output and ``DIR/ab.md``; each run's results.json
stays under ``DIR/<label>-<round>/``. A progress line is printed per run. On the GPU machine,
with ``.device/before`` holding the earlier checkout::

    bash scripts/device.sh --smoke scripts/bench-ab.py   # with BENCH_AB_ARGS="..." set
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: (label, how to get the figure from one run's results.json, format, larger is better)
FIGURES: list[tuple[str, str, str, bool]] = [
    ("wake latency, 100 us kernel, asyncio (us)", "asyncio:wake_us", ".1f", False),
    ("its p99 (us)", "asyncio:wake_p99_us", ".0f", False),
    ("wake latency, trio (us)", "trio:wake_us", ".1f", False),
    ("its p99 (us)", "trio:wake_p99_us", ".0f", False),
    ("awaits/s, 1 stream, asyncio", "asyncio:awaits_per_s_1", ".0f", True),
    ("awaits/s, 8 streams, asyncio", "asyncio:awaits_per_s_8", ".0f", True),
    ("awaits/s, 1 stream, trio", "trio:awaits_per_s_1", ".0f", True),
    ("awaits/s, 8 streams, trio", "trio:awaits_per_s_8", ".0f", True),
    ("CPU, 1,000 parked (% of a core)", "asyncio:cpu_parked", ".3f", False),
    ("10,000 awaiters, short kernels, p50 (ms)", "asyncio:many_p50_ms", ".0f", False),
    ("its p99 (ms)", "asyncio:many_p99_ms", ".0f", False),
    ("10,000 parked, p50 after the end (ms)", "asyncio:parked_p50_ms", ".1f", False),
    ("its p99 (ms)", "asyncio:parked_p99_ms", ".1f", False),
    ("work-stream GPU time per 100 awaits (ms)", "asyncio:stall_ms", ".2f", False),
]
RATIOS = [
    ("awaits/s vs polling, 1 stream, asyncio", "asyncio:awaits_per_s_1"),
    ("awaits/s vs polling, 8 streams, asyncio", "asyncio:awaits_per_s_8"),
    ("awaits/s vs polling, 1 stream, trio", "trio:awaits_per_s_1"),
    ("awaits/s vs polling, 8 streams, trio", "trio:awaits_per_s_8"),
]


def figure(doc: dict[str, Any], approach: str, key: str) -> float | None:
    """One figure of ``approach`` from a run's results.json (its one round's value)."""
    loop, name = key.split(":")
    summary = doc["summary"]
    entry = summary.get("trio", {}) if loop == "trio" else summary
    value = entry.get(approach, {}).get(name, {}).get("median")
    if value is not None and name == "cpu_parked":
        value *= 100  # cores -> % of a core
    return value


def spread(values: list[float], spec: str) -> str:
    """``median [min-max]`` of the rounds, as the benchmark's own page gives a figure (the
    median alone for one round, ``n/a`` for none)."""
    if not values:
        return "n/a"
    med, lo, hi = (format(v, spec) for v in (statistics.median(values), min(values), max(values)))
    return med if len(values) == 1 else f"{med} [{lo}-{hi}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="aiocudasem,poll0")
    p.add_argument("--approach", default="aiocudasem", help="the approach compared")
    p.add_argument("--polling", default="poll0", help="what the throughput ratios divide by")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "ab-out")))
    p.add_argument("--timeout", type=float, default=240, help="seconds per run")
    p.add_argument(
        "--build", action="store_true", help="build each checkout's C extensions in place first"
    )
    ns = p.parse_args(shlex.split(os.environ.get("BENCH_AB_ARGS", "")) + sys.argv[1:])
    if ns.rounds < 1:
        p.error("--rounds must be at least 1")
    sides = {"before": ns.before.resolve(), "after": ns.after.resolve()}
    for label, root in sides.items():
        if not (root / "aiocudasem" / "__init__.py").is_file():
            p.error(f"{label}: {root} holds no aiocudasem/ package")
    ns.out = ns.out.resolve()  # the runs write it from their own checkout
    ns.out.mkdir(parents=True, exist_ok=True)
    if ns.build:
        for root in sides.values():
            subprocess.run(
                [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=root, check=True
            )
    docs: dict[str, list[dict[str, Any]]] = {label: [] for label in sides}
    t0 = time.perf_counter()
    steps = 2 * ns.rounds
    for r in range(ns.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for label in order:
            done = 2 * r + order.index(label)
            elapsed = time.perf_counter() - t0
            eta = f", about {elapsed / done * (steps - done):.0f} s left" if done else ""
            print(f"[{done + 1}/{steps}] round {r + 1}: {label} ({elapsed:.0f} s{eta})", flush=True)
            out = ns.out / f"{label}-{r + 1}"
            env = dict(
                os.environ,
                PYTHONPATH=os.pathsep.join(
                    [str(sides[label])]
                    + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]
                ),
            )
            cmd = [
                sys.executable,
                "-m",
                "aiocudasem",
                "bench",
                "--repeats",
                "1",
                "--only",
                ns.only,
                "--out",
                str(out),
            ]
            if (sides[label] / "aiocudasem" / "cli" / "bench" / "_curve.py").exists():
                # A tree whose bench has sections: the A/B compares the main one only.
                cmd[4:4] = ["--sections", "main"]
            with open(ns.out / f"{label}-{r + 1}.log", "w") as log:
                try:
                    rc: int | str = subprocess.run(
                        cmd,
                        cwd=sides[label],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        timeout=ns.timeout,
                    ).returncode
                except subprocess.TimeoutExpired:
                    rc = f"no end within {ns.timeout:g} s"
            results = out / "results.json"
            if rc != 0 or not results.is_file():
                why = rc if isinstance(rc, str) else f"exit {rc}" if rc else "no results.json"
                print(f"  {label} round {r + 1} failed ({why}); see its log", flush=True)
                continue
            docs[label].append(json.loads(results.read_text()))
    lines = table(docs, ns.approach, ns.polling)
    for label, runs in docs.items():
        if runs:
            lines.append(f"- {label}: {runs[0]['meta'].get('commit', '?')}, {len(runs)} runs")
    text = "\n".join(lines) + "\n"
    (ns.out / "ab.md").write_text(text)
    print(text, flush=True)
    return 0 if all(docs.values()) else 1


def table(docs: dict[str, list[dict[str, Any]]], approach: str, polling: str) -> list[str]:
    labels = list(docs)
    head = f"| figure | {' | '.join(labels)} | polling, {' | polling, '.join(labels)} |"
    lines = [head, "|" + "---|" * (1 + 2 * len(labels))]
    for name, key, spec, _ in FIGURES:
        ours = [
            spread([v for d in docs[lb] if (v := figure(d, approach, key)) is not None], spec)
            for lb in labels
        ]
        theirs = [
            spread([v for d in docs[lb] if (v := figure(d, polling, key)) is not None], spec)
            for lb in labels
        ]
        lines.append(f"| {name} | {' | '.join(ours)} | {' | '.join(theirs)} |")
    for name, key in RATIOS:
        cells = []
        for lb in labels:
            ratios = [
                a / b
                for d in docs[lb]
                if (a := figure(d, approach, key)) is not None and (b := figure(d, polling, key))
            ]
            cells.append(spread(ratios, ".2f") + " x (per round)")
        lines.append(f"| {name} | {' | '.join(cells)} |" + " |" * len(labels))
    return lines


if __name__ == "__main__":
    sys.exit(main())
