"""docs/testing.md's example test is examples/testing/test_from_the_docs.py, which ``mypy
--strict`` checks (``[tool.mypy] files``), and it passes with warnings as errors in a new
project that takes the page's pytest configuration, the one of examples/testing/pytest.ini."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "testing.md").read_text()
EXAMPLE = ROOT / "examples" / "testing" / "test_from_the_docs.py"
INI = ROOT / "examples" / "testing" / "pytest.ini"


def section_blocks(heading: str, language: str) -> list[str]:
    section = PAGE.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)


def settings(ini: str) -> list[str]:
    return [line for line in ini.splitlines() if line.strip() and not line.startswith("#")]


def test_the_example_test_is_the_checked_file() -> None:
    block = section_blocks("## An example test", "python")[0]
    assert block == EXAMPLE.read_text()
    assert "examples/testing/test_from_the_docs.py" in PAGE
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert "examples" in mypy["files"]


def test_the_page_shows_the_example_configuration() -> None:
    (ini,) = section_blocks("## An example test", "ini")
    assert settings(ini) == settings(INI.read_text())
    assert "examples/testing/pytest.ini" in PAGE
    assert "asyncio_default_fixture_loop_scope = function" in ini
    assert "filterwarnings = error" in ini


def test_the_example_passes_with_warnings_as_errors_in_a_new_project(tmp_path: Path) -> None:
    (ini,) = section_blocks("## An example test", "ini")
    (tmp_path / "pytest.ini").write_text(ini)
    (tmp_path / "test_example.py").write_text(EXAMPLE.read_text())
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    options = ["-W", "error", "-p", "no:cacheprovider", "-p", "anyio", f"--junitxml={report}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "test_example.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, "-1")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": 5, "failures": 0, "errors": 0, "skipped": 0}, proc.stdout
