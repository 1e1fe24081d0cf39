"""examples/ray_actors.py: Ray async actors await their GPU work with aiocudasem, each serving
another call meanwhile, on a local Ray instance (the simulated device here, a GPU with ``-m
gpu``). Skipped where Ray is not installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("driver", ["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_ray_actors_await_gpu_work_and_serve_calls_meanwhile(driver: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report from a test run
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray_actors.py"), "--driver", driver],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = re.findall(
        r"^actor (\d) \(pid (\d+), node \w+\): frame (\d) checked, (\d+) wrong words; "
        r"served (\d+) other call while its GPU work ran$",
        proc.stdout,
        re.MULTILINE,
    )
    results = sorted((int(a), int(f), int(w), int(s)) for a, _, f, w, s in lines)
    # Two actors, three frames each; frame 2 was sent with one damaged word; each check
    # returned only after its actor served release(), the call that let its GPU work go on.
    assert results == [(a, f, int(f == 2), 1) for a in (0, 1) for f in (1, 2, 3)], proc.stdout
    assert len({pid for _, pid, *_ in lines}) == 2  # two actor processes, placed by Ray
    assert f"2 actors checked 3 frames each on driver '{driver}'\n" in proc.stdout
