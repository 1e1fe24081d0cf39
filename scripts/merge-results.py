#!/usr/bin/env python3
"""Merge the results files of benchmark runs of the same code on the same GPU into one.

    python3 scripts/merge-results.py OUT.json RESULTS.json[.gz] RESULTS.json[.gz] ...

The main section on all three event loops takes longer than one call of a lent GPU machine
may run, so it runs as ``--loops asyncio`` and ``--loops uvloop,trio``, one after the other on
the same machine. This puts their figures in one file for ``render-results.py``: each loop's
figures still come from one run, where its approaches ran side by side. The runs must have the
same source digest and GPU; a figure that two runs both have is refused, not overwritten.
``meta.date`` becomes the span of the runs, and ``meta.loops`` and ``meta.sections`` their
union. Needs neither the package nor a GPU.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    return data


def merge(into: dict[str, Any], more: dict[str, Any], where: str) -> None:
    for key, value in more.items():
        here = into.get(key)
        if here is None or here == {} or here == []:
            into[key] = value
        elif value == {} or value == []:
            continue
        elif isinstance(here, dict) and isinstance(value, dict):
            merge(here, value, f"{where}.{key}")
        else:
            raise SystemExit(f"merge-results: both runs have {where}.{key}; refusing to choose")


def digest(meta: dict[str, Any]) -> str:
    commit = str(meta.get("commit", ""))
    return commit.split("source digest")[-1].strip() if "source digest" in commit else commit


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, paths = Path(argv[0]), [Path(p) for p in argv[1:]]
    runs = [load(p) for p in paths]
    first = runs[0]["meta"]
    for path, run in zip(paths[1:], runs[1:], strict=True):
        meta = run["meta"]
        if digest(meta) != digest(first):
            raise SystemExit(f"merge-results: {path} ran other code ({meta['commit']})")
        if meta.get("gpu") != first.get("gpu") or meta.get("simulated") != first.get("simulated"):
            raise SystemExit(f"merge-results: {path} ran on another device ({meta.get('gpu')})")
    merged: dict[str, Any] = {"meta": dict(first)}
    for run in runs:
        merge(merged, {k: v for k, v in run.items() if k != "meta"}, "results")
    dates = sorted(str(run["meta"]["date"]) for run in runs)
    meta = merged["meta"]
    meta["date"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    for key in ("loops", "sections"):
        seen: list[str] = []
        for run in runs:
            seen += [x for x in run["meta"].get(key, []) if x not in seen]
        meta[key] = seen
    meta["runs"] = len(runs)
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"merge-results: {len(runs)} runs, loops {', '.join(meta['loops'])} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
