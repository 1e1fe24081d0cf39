"""The first commands a new user types: ``aiocudasem -V`` and ``aiocudasem`` alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import aiocudasem as acs
from aiocudasem import cli


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiocudasem", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_the_version_flag_prints_the_version(flag: str, tmp_path: Path) -> None:
    proc = _run(flag, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"aiocudasem {acs.__version__}\n"
    assert proc.stderr == ""


def test_no_arguments_prints_the_help_and_succeeds(tmp_path: Path) -> None:
    proc = _run(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("usage: aiocudasem ")
    for command in ("demo", "doctor", "bench"):
        assert f"\n    {command} " in proc.stdout
    assert "-V, --version" in proc.stdout
    assert proc.stdout == _run("--help", cwd=tmp_path).stdout


def test_no_arguments_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 0
    assert capsys.readouterr().out.startswith("usage: aiocudasem ")


def test_an_unknown_command_is_still_a_usage_error(tmp_path: Path) -> None:
    proc = _run("frobnicate", cwd=tmp_path)
    assert proc.returncode == 2
    assert "invalid choice: 'frobnicate'" in proc.stderr
