"""The README's quick start names commands that exist, CI runs the test command, and its first
example runs as written, on the simulated device."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def test_quick_start_commands_exist_and_ci_runs_the_test_command() -> None:
    quick = README.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for cmd in commands:
        assert (ROOT / cmd.split()[1]).is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash scripts/test\.sh$", ci, re.MULTILINE)


def first_example() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", README, re.MULTILINE | re.DOTALL)
    assert blocks, "the README has no Python example"
    return str(blocks[0])


def test_the_first_example_is_the_simulated_one() -> None:
    code = first_example()
    section = README.split("## Five minutes on the simulated device", 1)[1].split("\n## ", 1)[0]
    assert code in section
    assert "SimDriver()" in code
    assert "anyio.run(main)" in code


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_first_example_runs(backend: str, tmp_path: Path) -> None:
    code = first_example()
    if backend == "trio":
        pytest.importorskip("trio")
        code = code.replace("anyio.run(main)", 'anyio.run(main, backend="trio")')
    script = tmp_path / "handoff.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # -X dev shows every ResourceWarning: the example closes what it opens.
    result = subprocess.run(
        [sys.executable, "-X", "dev", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"frame {n}: processed, done = {n}" for n in (1, 2, 3)]
    assert "Warning" not in result.stderr, result.stderr
