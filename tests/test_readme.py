"""The README's quick start names commands that exist, and CI runs the test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_quick_start_commands_exist_and_ci_runs_the_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for cmd in commands:
        assert (ROOT / cmd.split()[1]).is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash scripts/test\.sh$", ci, re.MULTILINE)
