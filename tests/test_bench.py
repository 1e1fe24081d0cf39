"""The benchmark command on the simulated device: it runs from the package, repeats and
interleaves its rounds, reports medians with their spread, and says what it is doing."""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiocudasem.cli import bench
from aiocudasem.cli._common import CommandError

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
HAVE_TRIO = importlib.util.find_spec("trio") is not None


def _bench(cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``aiocudasem bench ARGS`` in a fresh interpreter, run from ``cwd`` (not the checkout:
    the benchmark lives in the package)."""
    return subprocess.run(
        [sys.executable, "-m", "aiocudasem", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def test_bench_repeats_interleaves_and_reports_spreads(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    only = "aiocudasem_parked,to_thread"
    args = ["--driver", "sim", "--quick", "--repeats", "2", "--only", only]
    args += ["--sections", "main,signal"]
    proc = _bench(
        tmp_path, *args, "--out", str(out), timeout=300
    )  # not the checkout: the benchmark lives in the package
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # A progress line per approach per round, interleaved: round 2 starts one place later.
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    names = {
        loop: [s.split(": ", 1)[1].split(" (")[0] for s in steps if f"] {loop} round" in s]
        for loop in ("asyncio", "uvloop", "trio")
    }
    # Rows 0 and 1 of a balanced Latin square of order 3.
    first = ["sync", "to_thread", "aiocudasem_parked"]
    assert names["asyncio"] == [*first, *first[1:], first[0]]
    # --only applies to uvloop and trio as well: all three run there too.
    assert names["trio"] == names["asyncio"]
    assert "asyncio: 3 approaches, 2 rounds interleaved" in proc.stdout
    assert "trio: 3 approaches, 2 rounds interleaved" in proc.stdout
    assert names["uvloop"] == (names["asyncio"] if HAVE_UVLOOP else [])
    assert "sections: main, signal" in proc.stdout.splitlines()[0]
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["repeats"] == 2
    assert data["meta"]["simulated"] is True
    assert data["meta"]["sections"] == ["main", "signal"]
    for name in ("sync", "to_thread", "aiocudasem_parked"):
        runs = data["results"][name]["runs"]
        assert [r["round"] for r in runs] == [0, 1]
        wake = data["summary"][name]["wake_us"]
        assert wake["runs"] == 2
        assert wake["min"] <= wake["median"] <= wake["max"]
        # The latency over sync, paired round by round.
        over = data["summary"][name]["wake_over_sync_us"]
        sync = data["results"]["sync"]["runs"]
        expected = sorted(
            statistics.median(r["latency_100us"]) - statistics.median(s["latency_100us"])
            for r, s in zip(runs, sync, strict=True)
        )
        assert (over["min"], over["max"]) == pytest.approx((expected[0], expected[-1]))
        assert data["summary"][name]["wake_p99_over_sync_us"]["runs"] == 2
    # The library's crowd-free figures on the other loops too: parked CPU and the stall test.
    for loop in ("trio", "uvloop") if HAVE_UVLOOP else ("trio",):
        parked = data["summary"][loop]["aiocudasem_parked"]
        assert parked["cpu_parked"]["runs"] == parked["stall_ms"]["runs"] == 2
    assert data["summary"]["trio"].keys() == {"sync", "to_thread", "aiocudasem_parked"}
    trio = data["summary"]["trio"]["to_thread"]
    assert trio["wake_us"]["runs"] == 2
    assert trio["awaits_per_s_1"]["runs"] == trio["awaits_per_s_8"]["runs"] == 2
    assert trio["awaits_per_s_1"]["median"] > 0
    page = (out / "performance.md").read_text()
    assert "SIMULATED" in page
    assert "2 rounds interleaved" in page
    # Standard output ends with the short summary and where the page went, not the page.
    assert "| approach |" not in proc.stdout
    tail = proc.stdout.split("summary (SIMULATED device, not GPU figures; medians over 2 rounds):")
    assert len(tail) == 2, proc.stdout[-2000:]
    summary = tail[1].strip().splitlines()
    assert summary[0].split()[:2] == ["loop", "approach"]
    assert summary[1].split()[:2] == ["asyncio", "aiocudasem_parked"]  # no aiocudasem: the first
    assert summary[2].split()[:2] == ["blocking", "sync"]
    loops = ["asyncio", "uvloop", "trio"] if HAVE_UVLOOP else ["asyncio", "trio"]
    assert [line.split()[0] for line in summary[1:-2:2]] == loops
    assert summary[-2].startswith("  host signal to stream resume: host_timeline ")
    assert summary[-1] == (
        f"the full page, every approach and figure: {out / 'performance.md'}; every run: "
        f"{out / 'results.json'}"
    )
    assert len(summary) == 3 + 2 * len(loops)
    assert "[" in page.split("| approach |", 1)[1]  # spreads, as [min-max]
    trio_page = page.split("## trio: wake latency (100 us kernel), throughput, CPU", 1)[1]
    assert "| trio.to_thread.run_sync(synchronize) |" in trio_page
    assert "poll + trio.sleep(0)" not in trio_page
    if (out / "latency.png").exists():
        assert "![latency distributions](latency.png)" in page
        assert "no latency.png" not in proc.stderr
    else:
        assert "No latency plot" in page
        assert "latency.png" not in page
        assert "aiocudasem bench: warning: wrote no latency.png" in proc.stderr
    # The host-signal section: both producers, interleaved, with spreads.
    assert "host signal to stream resume: 2 producers, 2 rounds interleaved" in proc.stdout
    signal_steps = [s.split(": ", 1)[1].split(" (")[0] for s in steps if "host signal" in s]
    assert signal_steps == ["host_timeline", "external_timeline"] * 1 + [
        "external_timeline",
        "host_timeline",
    ]
    for name in ("host_timeline", "external_timeline"):
        runs = data["signal"][name]["runs"]
        assert len(runs) == 2 and all(len(r) == 60 and min(r) > 0 for r in runs)
        median = data["summary"]["signal"][name]["median_us"]
        assert median["runs"] == 2 and median["min"] <= median["median"] <= median["max"]
    signal_page = page.split("## Host signal to stream resume", 1)[1]
    assert "| host timeline (cuStreamWaitValue64), signal() |" in signal_page
    assert "| simulated external timeline semaphore, signal() |" in signal_page


def test_bench_pairs_throughput_rounds_and_gives_ratios_to_polling(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["--driver", "sim", "--quick", "--repeats", "1", "--only", "poll0,aiocudasem"]
    args += ["--sections", "main", "--loops", "asyncio,trio"]
    proc = _bench(tmp_path, *args, "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for loop in ("asyncio", "trio"):
        rounds = [line for line in proc.stdout.splitlines() if f"] {loop} paired round" in line]
        assert len(rounds) == 6  # three rounds each on 1 and 8 streams
        assert f"{loop} 8 stream(s), paired: aiocudasem / poll0 per round: median" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert data["paired"].keys() == {"asyncio", "trio"}
    for loop, by_n in data["paired"].items():
        assert by_n.keys() == {"1", "8"}
        for n, runs in by_n.items():
            assert runs.keys() == {"poll0", "aiocudasem"}  # sync is not paired
            assert all(len(r) == 3 and min(r) > 0 for r in runs.values())
            ratio = data["summary"]["paired"][loop][n]["aiocudasem"]
            expected = sorted(a / p for a, p in zip(runs["aiocudasem"], runs["poll0"], strict=True))
            assert ratio["runs"] == 3
            assert ratio["median"] == pytest.approx(expected[1])
            assert (ratio["min"], ratio["max"]) == pytest.approx((expected[0], expected[-1]))
    page = (out / "performance.md").read_text()
    section = page.split("## Throughput in paired rounds", 1)[1]
    assert "3 rounds per loop and stream count" in section
    assert "| aiocudasem (await stream.wait_complete()) (x polling) |" in section
    rows = [line for line in section.splitlines() if line.startswith(("| asyncio", "| trio"))]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| asyncio", "1"],
        ["| asyncio", "8"],
        ["| trio", "1"],
        ["| trio", "8"],
    ]
    assert all(" x) |" in row for row in rows)


def test_the_paired_table_puts_each_approach_in_its_own_column_on_every_loop() -> None:
    """A loop that could not measure an approach gets n/a in its column, not the next
    approach's figures; a round where polling counted nothing has no ratio."""
    from aiocudasem.cli.bench._common import paired_ratios
    from aiocudasem.cli.bench._report import paired_table

    paired = {
        "asyncio": {"1": {"poll0": [10.0, 20.0], "aiocudasem": [10.0, 30.0]}},
        "trio": {"1": {"poll0": [10.0, 0.0], "checkpoint": [5.0, 6.0], "aiocudasem": [30.0, 1.0]}},
    }
    results = {"aiocudasem": {"label": "lib"}, "checkpoint": {"label": "floor"}}
    lines = paired_table(paired, results)
    assert (
        "| loop | streams | busy polling, awaits/s | floor (x polling) | lib (x polling) |" in lines
    )
    rows = [line for line in lines if line.startswith(("| asyncio", "| trio"))]
    assert rows[0] == "| asyncio | 1 | 15 [10-20] | n/a | 20 [10-30] (1.25 [1.00-1.50] x) |"
    assert rows[1] == "| trio | 1 | 5 [0-10] | 6 [5-6] (0.50 x) | 16 [1-30] (3.00 x) |"
    assert paired_ratios({"poll0": [0.0], "aiocudasem": [1.0]}, "aiocudasem") is None


def test_bench_refuses_bad_repeats(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--driver", "sim", "--repeats", "0", timeout=60)
    assert proc.returncode == 2
    assert "--repeats must be in [1, 100]" in proc.stderr


def test_bench_refuses_unknown_approaches(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--driver", "sim", "--only", "sync,cupyy", timeout=60)
    assert proc.returncode == 2
    assert "--only: unknown approach(es) cupyy; see --help for the names" in proc.stderr
    assert not (tmp_path / "bench-out").exists()


def test_bench_refuses_an_unwritable_out_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "sub"
    args = ["--driver", "sim", "--quick", "--only", "sync", "--out", str(out)]
    proc = _bench(tmp_path, *args, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr == (
        f"aiocudasem bench: error: --out {out}: cannot write the results there: "
        f"{tmp_path / 'a-file'} is a file, not a folder\n"
    )
    assert proc.stdout == ""  # nothing was measured


def test_bench_reports_a_failed_write_of_the_results_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def measure(*args: object) -> None:
        pass

    def write(out: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "results.json"))

    monkeypatch.setattr(bench, "run_main", measure)
    monkeypatch.setattr(bench, "run_signal", lambda *args: {})
    monkeypatch.setattr(bench, "write", write)
    out = tmp_path / "out"
    args = ["--driver", "sim", "--quick", "--only", "sync", "--sections", "main,signal"]
    with pytest.raises(CommandError) as info:
        bench.main([*args, "--out", str(out)])
    assert str(info.value) == (
        f"--out {out}: cannot write the results there: No space left on device: "
        f"{out / 'results.json'}"
    )
    assert info.value.status == 1


def test_bench_without_trio_measures_asyncio_and_says_why_trio_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """trio is not a dependency of the package: without it the benchmark still writes its
    results, and the page and a warning say why there are no trio figures."""

    ran = []

    async def measure(b: object, loop: str, *args: object) -> None:
        ran.append(loop)

    missing = "the trio event loop needs trio, which is not installed: pip install trio"
    monkeypatch.setattr(bench, "run_main", measure)
    monkeypatch.setattr(bench, "missing_loop", lambda loop: missing if loop == "trio" else None)
    out = tmp_path / "out"
    args = ["--driver", "sim", "--quick", "--only", "sync", "--sections", "main", "--out", str(out)]
    assert bench.main(args) == 0
    assert ran == ["asyncio", "uvloop"]  # nothing on trio
    captured = capsys.readouterr()
    assert f"aiocudasem bench: warning: no trio figures: {missing}" in captured.err
    assert "trio:" not in captured.out
    assert "asyncio: 1 approach, 1 round interleaved" in captured.out
    page = (out / "performance.md").read_text()
    assert "1 round interleaved" in page
    assert f"## trio\n\nNot measured: {missing}." in page
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["trio_not_measured"] == missing
    assert data["summary"]["trio"] == {}


def test_gc_pauses_counts_the_collections_in_its_block_and_not_its_own() -> None:
    import gc

    from aiocudasem.cli.bench._measure import GcPauses

    callbacks = list(gc.callbacks)
    with GcPauses() as pauses:
        gc.collect()  # a full collection: counted
        with pauses.ignored():
            gc.collect()  # the benchmark's own: not counted
        gc.collect(0)  # a young one: in the pause time only
    assert gc.callbacks == callbacks  # the callback is gone after the block
    assert pauses.full == 1
    assert 0 < pauses.full_s <= pauses.all_s
    gc.collect()  # after the block: not counted
    assert pauses.full == 1

    with pytest.raises(ZeroDivisionError), GcPauses():
        1 / 0  # noqa: B018
    assert gc.callbacks == callbacks  # removed on an exception too


def test_the_crowd_table_gives_the_collectors_pauses_and_n_a_for_runs_without_them() -> None:
    from aiocudasem.cli.bench._report import _gc_pauses

    def crowd(full: int, ms: float) -> dict[str, float]:
        return {"gc_full": full, "gc_full_ms": ms, "gc_ms": ms + 10}

    assert _gc_pauses([crowd(2, 300), crowd(3, 400), crowd(2, 350)]) == "2-3 full, 360 [310-410] ms"
    assert _gc_pauses([crowd(1, 100)]) == "1 full, 110 ms"
    assert _gc_pauses([{"p50_us": 1.0}]) == "n/a"  # a run from before they were measured


def test_bench_ab_tables_two_versions_with_per_round_ratios() -> None:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench-ab.py"
    spec = importlib.util.spec_from_file_location("bench_ab", path)
    assert spec is not None and spec.loader is not None
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)

    def run(ours: float, polling: float) -> dict[str, object]:
        def fig(v: float) -> dict[str, dict[str, float]]:
            return {"awaits_per_s_1": {"median": v}, "cpu_parked": {"median": 0.001}}

        return {"summary": {"aiocudasem": fig(ours), "poll0": fig(polling), "trio": {}}}

    docs = {"before": [run(90, 100), run(80, 100)], "after": [run(110, 100), run(120, 100)]}
    lines = ab.table(docs, "aiocudasem", "poll0")
    row = next(x for x in lines if x.startswith("| awaits/s, 1 stream, asyncio |"))
    assert row.split(" | ")[1:3] == ["85 [80-90]", "115 [110-120]"]
    ratio = next(x for x in lines if x.startswith("| awaits/s vs polling, 1 stream, asyncio"))
    assert "0.85 [0.80-0.90] x" in ratio and "1.15 [1.10-1.20] x" in ratio
    cpu = next(x for x in lines if x.startswith("| CPU, 1,000 parked"))
    assert "0.100" in cpu  # cores as % of a core
    trio = next(x for x in lines if x.startswith("| awaits/s, 1 stream, trio |"))
    assert "n/a" in trio  # no trio figures in these runs


# ---------------------------------------------------------------- the summary and --page


def _results() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    def run(wake: float, one: float, eight: float) -> dict[str, Any]:
        return {
            "latency_100us": [wake, wake],
            "latency_empty": [5.0, 6.0],
            "awaits_per_s_1": one,
            "awaits_per_s_8": eight,
        }

    results: dict[str, Any] = {
        "sync": {"label": "blocking sync", "runs": [run(110.0, 9000.0, 8000.0)]},
        "poll0": {"label": "polling", "runs": [run(130.0, 7000.0, 30000.0)]},
        "aiocudasem": {"label": "the library", "runs": [run(121.5, 8000.0, 40000.0)]},
        "cupy": {"label": "CuPy", "error": "ModuleNotFoundError: No module named 'cupy'"},
        "trio": {
            "sync": {"label": "blocking sync", "runs": [run(115.0, 8500.0, 7900.0)]},
            "aiocudasem": {"label": "the library", "runs": [run(140.0, 6000.0, 20000.0)]},
        },
    }
    meta = {
        "date": "2026-12-01 12:00 UTC",
        "simulated": False,
        "gpu": {"device": "a GPU", "driver": "cuda"},
        "host": "x86_64, 2 CPUs",
        "devices": 1,
        "repeats": 1,
        "commit": "commit 0123456789ab",
        "versions": {"python": "3.11"},
    }
    paired = {"asyncio": {"8": {"poll0": [100.0, 200.0, 100.0], "aiocudasem": [150.0] * 3}}}
    return results, meta, paired


def test_the_summary_gives_each_loops_headline_figures() -> None:
    from aiocudasem.cli.bench._report import summary_lines

    results, meta, paired = _results()
    signal = {"host_timeline": {"label": "host timeline", "runs": [[10.0, 12.0, 14.0]]}}
    lines = summary_lines(results, meta, signal, paired)
    assert lines[0] == "summary (medians over 1 round):"
    rows = [line.split() for line in lines[2:]]
    assert rows[0][:6] == ["asyncio", "aiocudasem", "121.5", "us", "8000", "/"]
    assert " ".join(rows[0][6:]) == "40000 (1.50 x busy polling on 8 streams, paired rounds)"
    assert rows[1] == ["blocking", "sync", "110.0", "us", "9000", "/", "8000"]
    assert rows[2] == ["busy", "polling", "130.0", "us", "7000", "/", "30000"]
    assert rows[3] == ["trio", "aiocudasem", "140.0", "us", "6000", "/", "20000"]
    assert rows[4] == ["blocking", "sync", "115.0", "us", "8500", "/", "7900"]
    assert lines[-1] == "  host signal to stream resume: host_timeline 12.0 us"
    assert len(lines) == 8


def test_the_page_goes_where_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plot: no matplotlib needed
    results, meta, paired = _results()
    out = tmp_path / "out"
    bench.write(out, results, meta, None, paired, page=tmp_path / "pages" / "bench.md")
    printed = capsys.readouterr().out
    assert not (out / "performance.md").exists()
    assert (out / "results.json").exists()
    page = (tmp_path / "pages" / "bench.md").read_text()
    assert page.startswith("# Performance\n")
    assert "| the library | 121.5 (+11.5) us |" in page
    assert "| approach |" not in printed
    assert printed.splitlines()[-1].startswith(
        f"the full page, every approach and figure: {tmp_path / 'pages' / 'bench.md'}; "
    )
    # "-": the page on standard output, as a whole, and no file.
    bench.write(out, results, meta, None, paired, page="-")
    printed = capsys.readouterr().out
    assert "| the library | 121.5 (+11.5) us |" in printed
    assert "summary (" not in printed
    assert not (out / "performance.md").exists()


def test_page_links_the_plot_from_wherever_it_is(tmp_path: Path) -> None:
    from aiocudasem.cli.bench._report import markdown

    results, meta, _ = _results()
    assert "![latency distributions](latency.png)" in markdown(results, meta)
    page = markdown(results, meta, plot_link="../out/latency.png")
    assert "![latency distributions](../out/latency.png)" in page


def test_bench_refuses_an_unwritable_page_before_measuring(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    page = tmp_path / "a-file" / "page.md"
    args = ["--driver", "sim", "--quick", "--only", "sync", "--page", str(page)]
    proc = _bench(tmp_path, *args, timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr == (
        f"aiocudasem bench: error: --page {page}: cannot write the page there: "
        f"{tmp_path / 'a-file'} is a file, not a folder\n"
    )
    assert proc.stdout == ""


# ---------------------------------------------------------------- the order, pairing, revision


@given(st.integers(min_value=1, max_value=24), st.integers(min_value=0, max_value=1000))
def test_the_rounds_order_is_a_balanced_latin_square(n: int, start: int) -> None:
    """Over a square's rows (n of them, from any multiple of n) every item takes every place
    once; over the full period (n rows for an even n, 2 n for an odd one) every item follows
    every other equally often; fewer rounds than items still take different rows."""
    from aiocudasem.cli.bench._common import balanced, latin_row

    period = n if n % 2 == 0 else 2 * n
    base = start - start % n
    rows = [latin_row(n, base + r) for r in range(n)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    for place in range(n):
        assert sorted(row[place] for row in rows) == list(range(n))
    assert len({tuple(row) for row in rows}) == n  # each round a different row
    base = start - start % period
    full = [latin_row(n, base + r) for r in range(period)]
    follows = Counter((row[i], row[i + 1]) for row in full for i in range(n - 1))
    assert len(follows) == n * (n - 1)
    assert set(follows.values()) <= {period // n}
    items = [f"approach {i}" for i in range(n)]
    assert balanced(items, start) == [items[i] for i in latin_row(n, start)]


def test_latency_over_sync_is_the_median_of_paired_per_round_differences() -> None:
    from aiocudasem.cli.bench._common import differences, paired_differences
    from aiocudasem.cli.bench._report import paired_latency

    assert paired_differences([3.0, 5.0, 4.0], [1.0, 2.0, 4.5]) == [2.0, 3.0, -0.5]
    with pytest.raises(ValueError, match="not paired"):
        paired_differences([1.0], [1.0, 2.0])
    d = differences([float(x) for x in range(101)], [1.0] * 101)
    assert d == {"median": 49.0, "p99": 98.0, "n": 101}
    assert differences([], []) == {"n": 0}

    def run(r: int, lat: list[float]) -> dict[str, Any]:
        return {"round": r, "latency_100us": lat, "latency_empty": [1.0]}

    # Rounds are paired by number, not by place; a round sync lacks is left out.
    mine = {"runs": [run(1, [30.0, 32.0, 34.0]), run(0, [20.0, 22.0, 90.0]), run(2, [5.0])]}
    sync = {"runs": [run(0, [10.0, 10.0, 10.0]), run(1, [11.0, 12.0, 13.0])]}
    f = paired_latency(mine, sync)
    assert f["wake_over_sync_us"] == {"median": 16.0, "min": 12.0, "max": 20.0, "runs": 2}
    assert f["wake_p99_over_sync_us"] == {"median": 50.5, "min": 21.0, "max": 80.0, "runs": 2}
    assert f["empty_over_sync_us"]["median"] == 0.0
    # A difference of paired rounds, not of the overall medians (12.5 here).
    mine = {"runs": [run(0, [100.0]), run(1, [15.0]), run(2, [10.0])]}
    sync = {"runs": [run(0, [99.0]), run(1, [2.5]), run(2, [1.0])]}
    assert paired_latency(mine, sync)["wake_over_sync_us"]["median"] == 9.0


def test_the_revision_comes_from_git_else_from_a_revision_file(tmp_path: Path) -> None:
    import aiocudasem
    from aiocudasem.cli.bench._report import _revision, commit

    installed = f"aiocudasem {aiocudasem.__version__} (installed, not a checkout)"
    assert _revision(tmp_path) == installed  # neither git nor REVISION
    (tmp_path / "REVISION").write_text("0123abcd\n")
    assert _revision(tmp_path) == "revision 0123abcd (from REVISION)"
    (tmp_path / "REVISION").write_text("not a hash\n")
    assert _revision(tmp_path) == installed
    assert ", source digest " in commit()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sections", "main,curv"], "--sections: unknown section(s) curv; choose from main, "),
        (["--sections", " , "], "--sections: name at least one section, of main, curve, "),
        (["--loops", "asyncio,tornado"], "--loops: unknown event loop(s) tornado; choose from "),
    ],
)
def test_bench_refuses_unknown_sections_and_loops(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        bench.main(["--driver", "sim", "--quick", "--out", str(tmp_path / "out"), *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was measured


def test_the_curve_and_service_sections_cover_every_approach_and_loop(tmp_path: Path) -> None:
    from aiocudasem.cli._common import missing_loop
    from aiocudasem.cli.bench._common import LOOPS, loop_backend
    from aiocudasem.cli.bench._curve import APPROACHES, LENGTHS_NS
    from aiocudasem.cli.bench._service import APPROACHES as SERVICE
    from aiocudasem.cli.bench._service import CONCURRENCY, FIGURES

    loops = [loop for loop in LOOPS if missing_loop(loop_backend(loop)) is None]
    out = tmp_path / "bench"
    args = ["--driver", "sim", "--quick", "--sections", "service,curve", "--out", str(out)]
    proc = _bench(tmp_path, *args, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "sections: curve, service" in proc.stdout  # in the order they run
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    curve_steps = [s for s in steps if "] curve " in s]
    assert len(curve_steps) == len(LENGTHS_NS) * len(loops)
    assert curve_steps[0].split("] ", 1)[1].startswith(f"curve {loops[0]}: 10 us kernel (")
    assert curve_steps[-1].split("] ", 1)[1].startswith(f"curve {loops[-1]}: 10 ms kernel (")
    assert "s left)" in curve_steps[-1]  # an estimate of what is left
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["sections"] == ["curve", "service"]
    assert data["meta"]["loops"] == loops
    assert data["results"] == {} and "signal" not in data
    curve = data["curve"]
    assert curve["lengths_us"] == [ns / 1000 for ns in LENGTHS_NS]
    assert list(curve["loops"]) == loops
    for loop, by_length in curve["loops"].items():
        assert set(by_length["labels"]) == set(APPROACHES)
        assert [k for k in by_length if k != "labels"] == [f"{ns / 1000:g}" for ns in LENGTHS_NS]
        for length in (k for k in by_length if k != "labels"):
            figs = by_length[length]
            assert set(figs) == set(APPROACHES), (loop, length)
            for name, f in figs.items():
                assert f["rounds"] >= 2
                assert f["median_us"] > 0 and f["p99_us"] >= f["median_us"]
                assert f["cpu_pct"] is not None and f["cpu_pct"] >= 0
                if name == "sync":
                    assert "over_sync_median_us" not in f
                else:
                    assert math.isfinite(f["over_sync_median_us"])
                    assert math.isfinite(f["over_sync_p99_us"])
    service = data["service"]
    assert service["other_work_turns"] >= 1
    assert list(service["loops"]) == loops
    for loop, by_n in service["loops"].items():
        assert list(by_n) == [str(n) for n in CONCURRENCY]
        for n, by_ap in by_n.items():
            assert set(by_ap) == set(SERVICE)
            for entry in by_ap.values():
                (run,) = entry["runs"]
                assert run["round"] == 0
                assert run["requests_per_s"] >= 0 and run["completed"] >= 0
                assert run["cpu_pct"] > 0 and run["other_work_per_s"] >= 0
                assert run["window_s"] > 0
                # The simulated device may complete none in a smoke run's window.
                assert (run["p50_ms"] is None) == (run["completed"] == 0)
            summary = data["summary"]["service"][loop][n]
            assert set(summary) == set(SERVICE)
            assert all(set(f) <= set(FIGURES) for f in summary.values())
    page = (out / "performance.md").read_text()
    curve_page = page.split("## Wake latency and CPU against the kernel's length", 1)[1]
    for loop in loops:
        table = curve_page.split(f"### {loop}\n", 1)[1].split("\n#", 1)[0]
        rows = [line for line in table.splitlines() if line.startswith("| ") and "us;" in line]
        assert [r.split(" | ")[0] for r in rows] == [
            "| 10 us",
            "| 30 us",
            "| 100 us",
            "| 300 us",
            "| 1 ms",
            "| 3 ms",
            "| 10 ms",
        ]
        assert all(r.count(" | ") == 5 for r in rows)
    service_page = page.split("## A busy service", 1)[1]
    rows = [
        line
        for line in service_page.splitlines()
        if line.startswith(tuple(f"| {x} " for x in loops))
    ]
    assert len(rows) == len(loops) * len(CONCURRENCY) * len(SERVICE)
    assert "latency.png" not in page  # the main section did not run: no plot of it
    if (out / "curve.png").exists():
        assert "![wake latency and CPU against the kernel's length](curve.png)" in page
    else:
        assert "(No curve plot: " in page
        assert "aiocudasem bench: warning: wrote no curve.png" in proc.stderr


def test_the_event_thread_waits_on_a_blocking_sync_event_on_every_loop() -> None:
    """The curve's floor without spinning: its event has the blocking-sync flag, it wakes
    asyncio, uvloop and trio, and closing it ends its thread and destroys its events."""
    from aiocudasem.cli._common import missing_loop, open_driver
    from aiocudasem.cli.bench._approaches import EventThread
    from aiocudasem.cli.bench._common import LOOPS, loop_backend, run_on
    from aiocudasem.cli.bench._measure import Bench

    drv = open_driver("sim")
    b = Bench(drv, True)
    created: list[bool] = []
    create = drv.event_create

    def event_create(ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        created.append(blocking)
        return create(ordinal, timing, blocking)

    drv.event_create = event_create  # type: ignore[method-assign]
    for loop in (lp for lp in LOOPS if missing_loop(loop_backend(lp)) is None):
        ap = EventThread(drv)

        async def go(ap: EventThread = ap) -> bool:
            h = b.streams[0]
            b.launch(h, 2_000_000)
            await ap.wait(h)
            return bool(drv.stream_query(h))

        assert run_on(loop, go) is True, loop
        thread = ap.thread
        assert thread is not None and thread.is_alive()
        ap.close()
        assert not thread.is_alive() and ap.events == {}
    assert created and all(created)


def test_the_ready_section_gives_the_cost_per_array_labelled_simulated(tmp_path: Path) -> None:
    """ready(*arrays) against ready(x) of each, per array, at each size, in paired rounds; on
    the simulated device the table says that its figures are not a GPU's."""
    out = tmp_path / "bench"
    proc = _bench(
        tmp_path,
        "--driver",
        "sim",
        "--sections",
        "ready",
        "--repeats",
        "2",
        "--out",
        str(out),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "ready: 8 and 64 arrays, 2 rounds interleaved, on asyncio" in proc.stdout
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["sections"] == ["ready"] and data["results"] == {}
    ready = data["ready"]
    assert ready["loop"] == "asyncio" and ready["sizes"] == [8, 64]
    for way in ("each", "batched"):
        for n in ("8", "64"):
            assert len(ready["runs"][way][n]) == 2 and min(ready["runs"][way][n]) > 0
            assert data["summary"]["ready"][way][n]["runs"] == 2
    page = (out / "performance.md").read_text()
    table = page.split("## ready() of several arrays (SIMULATED device: not GPU figures)", 1)[1]
    assert "| arrays | ready(x) of each | ready(*arrays) | ratio (paired) |" in table
    assert table.count(" us | ") >= 2
    summary = proc.stdout.split("medians over 2 rounds):\n", 1)[1].splitlines()
    assert summary[0].startswith("  ready(), 64 arrays, per array: ready(*arrays) ")


def test_the_stages_and_progress_sections_label_their_figures_simulated(tmp_path: Path) -> None:
    """Host stages against a Python host callback (stall per stage over a floor without
    stages, latency on an idle and a busy loop, paired per sample), and a kernel's progress
    values awaited one by one against polling of the word, on every loop given, each in
    interleaved rounds; the page's tables and the summary say that they are simulated."""
    from aiocudasem.cli.bench._progress import APPROACHES as PROGRESS
    from aiocudasem.cli.bench._progress import QUICK_COUNT
    from aiocudasem.cli.bench._stages import APPROACHES as STAGES
    from aiocudasem.cli.bench._stages import CONDITIONS, QUICK_SAMPLES, QUICK_STAGES

    loops = ["asyncio", "trio"] if HAVE_TRIO else ["asyncio"]
    out = tmp_path / "bench"
    args = ["--driver", "sim", "--quick", "--repeats", "2", "--out", str(out)]
    args += ["--sections", "progress,stages", "--loops", ",".join(loops)]
    proc = _bench(tmp_path, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "sections: stages, progress" in proc.stdout  # in the order they run
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len([s for s in steps if "] stages " in s]) == len(loops) * 2 * 3
    assert len([s for s in steps if "] progress " in s]) == len(loops) * 2 * len(PROGRESS)
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["sections"] == ["stages", "progress"] and data["results"] == {}
    assert data["stages"]["other_work_turns"] >= 1
    assert list(data["stages"]["loops"]) == loops and list(data["progress"]["loops"]) == loops
    for loop in loops:
        entry = data["stages"]["loops"][loop]
        assert entry["stages"] == QUICK_STAGES and set(entry["labels"]) == set(STAGES)
        assert [r["round"] for r in entry["rounds"]] == [0, 1]
        for run in entry["rounds"]:
            assert run["floor_us"] > 0 and set(run["window_us"]) == set(STAGES)
            for name in STAGES:
                stall = (run["window_us"][name] - run["floor_us"]) / QUICK_STAGES
                assert run["stall_us"][name] == pytest.approx(stall)
            for state in CONDITIONS:
                for name in STAGES:
                    lat = run["latency_us"][state][name]
                    assert len(lat) == QUICK_SAMPLES and all(math.isfinite(x) for x in lat)
        summary = data["summary"]["stages"][loop]
        assert set(summary["stall_us"]) == set(STAGES)
        assert all(f["runs"] == 2 for f in summary["stall_us"].values())
        for state in CONDITIONS:
            assert summary["stage_over_pycallback"][state]["n"] == 2 * QUICK_SAMPLES
        prog = data["progress"]["loops"][loop]
        assert prog["count"] == QUICK_COUNT and prog["clock"] == "common"
        for run in prog["rounds"]:
            for name in PROGRESS:
                f = run[name]
                assert len(f["wake_us"]) + f["late"] == QUICK_COUNT
                assert f["cpu_pct"] > 0
        # Busy polling spends a core; the library's wait is parked for most of the run.
        cpu = data["summary"]["progress"][loop]
        assert cpu["poll"]["cpu_pct"]["median"] > cpu["wait_value"]["cpu_pct"]["median"]
    page = (out / "performance.md").read_text()
    tag = " (SIMULATED device: not GPU figures)"
    stages_page = page.split(f"## Host stages against a Python host callback{tag}", 1)[1]
    head = "| loop | approach | stall per stage | latency, idle loop | latency, busy loop |"
    assert head in stages_page
    rows = [r for r in stages_page.split("\n## ", 1)[0].splitlines() if r.startswith("| ")]
    assert len(rows) == 1 + len(loops) * (len(STAGES) + len(CONDITIONS))  # with the head
    progress_page = page.split(f"## Kernel progress{tag}", 1)[1]
    assert "The stamps and the host share one clock" in progress_page
    assert "| loop | approach | wake latency, median / p99 | CPU | left out |" in progress_page
    summary_text = proc.stdout.split("SIMULATED device, not GPU figures; medians over 2 ", 1)[1]
    assert f"  stages on {loops[0]}, per stage (stall; latency on a busy loop): stage " in (
        summary_text
    )
    assert f"  progress on {loops[0]}, wake after publish: wait_value " in summary_text


def test_progress_on_a_gpu_gives_wakes_over_the_fastest_and_says_so() -> None:
    """Without a clock that the GPU's stamps and the host share, the page says the wake
    latencies are over the fastest wake of their round."""
    from aiocudasem.cli.bench._report import progress_table

    run = {"wake_us": [0.0, 4.0, 6.0], "late": 1, "cpu_pct": 2.5}
    entry = {
        "labels": {"wait_value": "await wait_value", "poll": "polling"},
        "count": 4,
        "interval_us": 1000.0,
        "clock": "relative",
        "rounds": [{"round": 0, "wait_value": run, "poll": run}],
    }
    page = "\n".join(progress_table({"loops": {"asyncio": entry}}, simulated=False))
    assert "SIMULATED" not in page
    assert "over the fastest wake of its round (either approach), taken as 0" in page
    assert "| asyncio | await wait_value | 4.0 / 6.0 us | 2.5 % | 1 |" in page
