"""scripts/render-results.py: the per-loop tables from a results file alone, and --write
replacing the marked blocks of the README and the performance page."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "render-results.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fig(median: float, low: float | None = None, high: float | None = None) -> dict[str, float]:
    return {
        "median": median,
        "min": median if low is None else low,
        "max": median if high is None else high,
        "runs": 3,
    }


def results() -> dict[str, Any]:
    """A tiny results file in the shape `aiocudasem bench` writes."""
    return {
        "meta": {
            "date": "2030-01-02 03:04 UTC",
            "simulated": False,
            "gpu": {"device": "Test GPU", "driver": "cuda", "nvidia-smi": "Test GPU, 999.1"},
            "host": "x86_64, 4 CPUs",
            "devices": 1,
            "repeats": 3,
            "commit": "commit 0123456789ab, source digest 000000000000",
            "versions": {"python": "3.11.0"},
        },
        "summary": {
            "sync": {"wake_us": fig(100.0, 99.0, 101.0), "stall_ms": fig(5.0)},
            "poll0": {"wake_us": fig(101.0), "cpu_parked": fig(1.0)},
            "c_workstream": {
                "wake_us": fig(160.0),
                "cpu_parked": fig(0.001),
                "stall_ms": fig(9.0),
            },
            "aiocudasem_parked": {"wake_us": fig(180.0)},
            "aiocudasem": {
                "wake_us": fig(102.5, 101.0, 110.0),
                "cpu_parked": fig(0.0012, 0.001, 0.002),
                "stall_ms": fig(5.1),
            },
            "trio": {
                "sync": {"wake_us": fig(110.0)},
                "aiocudasem": {"wake_us": fig(114.0)},
            },
            "paired": {
                "asyncio": {"1": {"aiocudasem": fig(1.025, 0.99, 1.1)}},
                "trio": {"1": {"aiocudasem": fig(0.96)}},
            },
        },
        "results": {"aiocudasem": {"label": "aiocudasem (await stream.wait_complete())"}},
        "paired": {"asyncio": {"1": {"poll0": [80000.0, 82000.0, 81000.0]}}},
    }


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "results.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(results(), f)
    return path


def test_it_renders_one_table_per_loop(results_file: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(results_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Measured 2030-01-02 03:04 UTC on one Test GPU (driver 999.1)" in out
    for loop in ("### asyncio", "### trio", "### uvloop"):
        assert loop in out
    assert "Not measured in this run" in out.split("### uvloop", 1)[1]
    asyncio = out.split("### asyncio", 1)[1].split("### trio", 1)[0]
    assert "102.5 us [101.0-110.0] (+2.5 over blocking sync)" in asyncio
    assert "180.0 us (+80.0 over blocking sync)" in asyncio  # parked
    assert "1.03 x [0.99-1.10] busy polling" in asyncio  # halves round up: 1.025 -> 1.03
    assert "busy polling: 81.0k/s" in asyncio
    assert "0.12 % [0.10-0.20] of a core" in asyncio
    assert "no library: 0.10 %" in asyncio
    assert "| +1.0 us |" in asyncio  # (5.1 - 5.0) ms over 100 awaits
    trio = out.split("### trio", 1)[1].split("### uvloop", 1)[0]
    assert "114.0 us (+4.0 over blocking sync)" in trio
    assert "not measured on trio" in trio
    assert "0.96 x busy polling" in trio
    assert "A parked wake took 78 us longer" in asyncio


def test_write_replaces_only_the_marked_blocks(results_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    readme = "# Title\n\nbefore\n<!-- results:begin -->\nOLD TABLE\n<!-- results:end -->\nafter\n"
    page = (
        "# Performance\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nmiddle\n\n"
        "<!-- results-detail:begin -->\nold detail\n<!-- results-detail:end -->\nend\n"
    )
    (root / "README.md").write_text(readme)
    (root / "docs" / "performance.md").write_text(page)

    script = load_script()
    data = script.load(results_file)
    assert script.write(data, root) == ["README.md", "docs/performance.md"]

    new = (root / "README.md").read_text()
    assert new.startswith("# Title\n\nbefore\n<!-- results:begin -->\n")
    assert new.endswith("<!-- results:end -->\nafter\n")
    assert "OLD TABLE" not in new
    assert "### asyncio" in new and "### trio" in new
    assert "#### Every approach" not in new  # the detail goes to the performance page only

    perf = (root / "docs" / "performance.md").read_text()
    assert "\nold\n" not in perf and "old detail" not in perf
    assert "middle" in perf and perf.endswith("end\n")
    assert "### asyncio" in perf.split("<!-- results:end -->")[0]
    assert "#### Every approach, asyncio" in perf.split("<!-- results-detail:begin -->")[1]

    # A second write with the same file changes nothing.
    assert script.write(data, root) == []


def test_a_run_of_the_curve_alone_fills_only_its_block(tmp_path: Path) -> None:
    script = load_script()
    full = results()
    curve_only = {
        "meta": full["meta"],
        "summary": {"service": {}},
        "curve": {
            "loops": {
                "asyncio": {
                    "10000": {
                        "sync": {"median_us": 20.0, "cpu_pct": 100.0},
                    }
                }
            }
        },
    }
    assert not script.has_main(curve_only) and script.has_curve(curve_only)
    assert script.has_main(full) and not script.has_curve(full)
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    page = (
        "<!-- results:begin -->\nKEEP\n<!-- results:end -->\n"
        "<!-- results-detail:begin -->\nKEEP TOO\n<!-- results-detail:end -->\n"
        "<!-- results-curve:begin -->\nold curve\n<!-- results-curve:end -->\n"
    )
    (root / "README.md").write_text("<!-- results:begin -->\nKEEP\n<!-- results:end -->\n")
    (root / "docs" / "performance.md").write_text(page)
    assert script.write(curve_only, root) == ["docs/performance.md"]
    perf = (root / "docs" / "performance.md").read_text()
    assert "KEEP\n" in perf and "KEEP TOO" in perf and "old curve" not in perf
    assert "#### Wake latency and CPU against the kernel's length" in perf
    with pytest.raises(SystemExit, match="no section"):
        script.main([str(_dump(tmp_path, {"meta": full["meta"], "summary": {}}))])


def _dump(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(data))
    return path


def test_write_refuses_a_page_without_markers(results_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# no markers\n")
    (root / "docs" / "performance.md").write_text("# none either\n")
    script = load_script()
    with pytest.raises(SystemExit, match=r"README\.md: needs one <!-- results:begin -->"):
        script.write(script.load(results_file), root)


def test_it_renders_uvloop_the_paired_latency_the_curve_and_the_service() -> None:
    script = load_script()
    data = results()
    summary = data["summary"]
    summary["aiocudasem"]["wake_over_sync_us"] = fig(2.0, 1.0, 3.0)
    summary["uvloop"] = {
        "sync": {"wake_us": fig(105.0), "stall_ms": fig(5.0)},
        "aiocudasem": {
            "wake_us": fig(108.0),
            "wake_over_sync_us": fig(2.5, -1.0, 4.0),
            "cpu_parked": fig(0.001),
            "stall_ms": fig(5.2),
        },
    }
    data["curve"] = {
        "lengths_us": [10.0, 3000.0],
        "loops": {
            "asyncio": {
                "labels": {},
                "10": {
                    "sync": {"median_us": 20.0, "cpu_pct": 100.0},
                    "aiocudasem": {
                        "over_sync_median_us": 1.25,
                        "over_sync_p99_us": 9.0,
                        "cpu_pct": 99.0,
                    },
                },
                "3000": {
                    "sync": {"median_us": 3010.0, "cpu_pct": 100.0},
                    "event_thread": {
                        "over_sync_median_us": 50.0,
                        "over_sync_p99_us": 80.0,
                        "cpu_pct": 0.5,
                    },
                },
            }
        },
    }
    summary["service"] = {
        "trio": {"1000": {"poll0": {"requests_per_s": fig(9000.0), "cpu_pct": fig(100.0)}}}
    }
    data["service"] = {"loops": {"trio": {"1000": {"poll0": {"label": "polling", "runs": []}}}}}
    out = script.results_block(data)
    uvloop = out.split("### uvloop", 1)[1]
    assert "108.0 us (+2.5 us [-1.0 to +4.0] over blocking sync, paired rounds)" in uvloop
    assert "+2.0 us [+1.0 to +3.0] over blocking sync, paired rounds" in out.split("### trio")[0]
    assert "| +2.0 us |" in uvloop  # (5.2 - 5.0) ms over 100 awaits
    detail = script.curve_block(data)
    curve = detail.split("#### Wake latency and CPU against the kernel's length", 1)[1]
    assert "| 10 us | 20.0 us; 100 % | +1.3 / +9.0 us; 99 % | n/a | n/a | n/a |" in curve
    assert "| 3 ms | 3010.0 us; 100 % | n/a | n/a | n/a | +50.0 / +80.0 us; 0.5 % |" in curve
    service = detail.split("#### A busy service", 1)[1]
    assert "| trio | 1,000 | polling | 9000 | n/a / n/a | 100 % | n/a |" in service
    assert "#### Every approach, uvloop" in script.detail_block(data)
    assert "#### A busy service" not in script.detail_block(data)  # the curve block's
    # A file without them renders as before.
    assert "#### A busy service" not in script.curve_block(results())


def test_a_run_of_stages_and_progress_renders_into_the_curve_block_only() -> None:
    """The stages and progress sections fill the results-curve block (not the main ones), a
    row per loop and approach, the paired differences, and, for a GPU's stamps, the note
    that wakes are over the fastest one."""
    script = load_script()
    meta = results()["meta"]
    data = {
        "meta": meta,
        "summary": {
            "stages": {
                "asyncio": {
                    "stall_us": {"stage": fig(3.25, 2.0, 4.0), "pycallback": fig(40.0)},
                    "latency": {
                        "idle": {"stage": {"median_us": fig(20.0), "p99_us": fig(30.0)}},
                        "busy": {"pycallback": {"median_us": fig(60.0), "p99_us": fig(90.0)}},
                    },
                    "stage_over_pycallback": {"idle": {"median": -5.0, "p99": 12.0, "n": 600}},
                }
            },
            "progress": {
                "trio": {
                    "wait_value": {
                        "median_us": fig(8.0),
                        "p99_us": fig(20.0),
                        "cpu_pct": fig(1.5),
                        "late": 0,
                    }
                }
            },
        },
        "stages": {
            "loops": {"asyncio": {"stages": 32, "labels": {"stage": "host stage"}, "rounds": []}}
        },
        "progress": {
            "loops": {
                "trio": {
                    "labels": {"wait_value": "wait_value(n)"},
                    "count": 500,
                    "interval_us": 1000.0,
                    "clock": "relative",
                    "rounds": [],
                }
            }
        },
    }
    assert not script.has_main(data) and script.has_curve(data)
    block = script.curve_block(data)
    stages = block.split("#### Host stages against a Python host callback", 1)[1]
    assert "for 32 x (50 us kernel + stage)" in stages
    assert "| asyncio | host stage | +3.3 us [+2.0 to +4.0] | 20.0 / 30.0 us | n/a / n/a |" in (
        stages
    )
    assert "| asyncio | pycallback | +40.0 us | n/a / n/a | 60.0 / 90.0 us |" in stages
    assert "| asyncio | stage less callback, paired per sample | | -5.0 / +12.0 us | n/a |" in (
        stages
    )
    progress = block.split("#### Kernel progress", 1)[1]
    assert "500 values into a host timeline, 1.0 ms apart" in progress
    assert "over the fastest wake of their round" in progress
    assert "| trio | wait_value(n) | 8.0 / 20.0 us | 1.5 % |" in progress
