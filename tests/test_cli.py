"""The command line, run as ``python -m aiocudasem`` in subprocesses on the simulated device, and
its help and pipe handling in-process.

Tests that need the CUDA driver to be unusable hide every GPU with ``CUDA_VISIBLE_DEVICES=``,
so they hold on a GPU machine too."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import aiocudasem as acs
from aiocudasem import cli
from aiocudasem.cli import bench, demo

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != acs.DRIVER_ENV}
    env.update(extra or {})
    return env


def _run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiocudasem", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(env),
    )


def _flat(text: str) -> str:
    """``text`` with its line wrapping undone."""
    return " ".join(text.split())


# ---------------------------------------------------------------- version and help


def test_version() -> None:
    proc = _run("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"aiocudasem {acs.__version__}\n"


@pytest.mark.parametrize("command", ["", "demo", "doctor", "bench"])
def test_help_of_each_command(command: str) -> None:
    proc = _run(*([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    out = _flat(proc.stdout)
    assert out.startswith(f"usage: aiocudasem {command}".rstrip())
    assert "exit status: 0 success" in out
    assert "141 the output pipe was closed early (as by | head); it stops quietly" in out
    if command == "demo":
        assert "--frames FRAMES frames to hand off (at least 1) (default: 240)" in out
    if command == "bench":
        assert "(default: bench-out)" in out
        assert "usage: run.py" not in out


def _parsers() -> list[argparse.ArgumentParser]:
    top = cli._parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [top, subs.choices["demo"], subs.choices["doctor"], bench._parser()]


@pytest.mark.parametrize("parser", _parsers(), ids=lambda p: p.prog)
def test_every_option_has_help_and_shows_its_default(parser: argparse.ArgumentParser) -> None:
    assert parser.description
    text = _flat(parser.format_help())
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            assert all(a.help for a in action._choices_actions)
            continue
        assert action.help, action.option_strings
        if action.default in (None, "") and action.nargs != 0:
            assert "default:" in action.help, action.option_strings  # said in words
        elif not isinstance(action.default, bool) and action.default != argparse.SUPPRESS:
            assert f"(default: {action.default})" in text, action.option_strings


# ---------------------------------------------------------------- demo and the choice of driver


def test_demo_on_the_simulated_device() -> None:
    proc = _run("demo", "--driver", "sim", "--frames", "16", "--words", "64")
    assert proc.returncode == 0, proc.stderr
    assert "driver: sim (SIMULATED device)" in proc.stdout
    assert "all 16 frames verified" in proc.stdout
    assert "falling back" not in proc.stdout


@pytest.mark.parametrize("device", ["2", "-1"])
def test_demo_refuses_a_device_the_driver_does_not_have(device: str) -> None:
    proc = _run("demo", "--driver", "sim", "--device", device, "--frames", "4", "--words", "64")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        f"aiocudasem demo: error: --device {device}: the sim driver has 2 device(s); pass "
        "--device 0 to 1\n"
    )
    assert proc.stdout == ""  # refused before the demo starts


@pytest.mark.parametrize(
    ("args", "env", "source", "how"),
    [
        (
            ["demo"],
            {acs.DRIVER_ENV: "cuda"},
            "AIOCUDASEM_DRIVER=cuda",
            "pass --driver sim or set AIOCUDASEM_DRIVER=sim.",
        ),
        (["demo", "--driver", "cuda"], {}, "--driver cuda", "pass --driver sim."),
        (
            ["bench", "--quick"],
            {acs.DRIVER_ENV: "cuda"},
            "AIOCUDASEM_DRIVER=cuda",
            "pass --driver sim or set AIOCUDASEM_DRIVER=sim.",
        ),
    ],
)
def test_an_explicit_cuda_is_honoured_or_the_command_fails(
    args: list[str], env: dict[str, str], source: str, how: str
) -> None:
    proc = _run(*args, env={**NO_GPU, **env})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    command = args[0]
    assert proc.stderr.startswith(
        f"aiocudasem {command}: error: {source} asks for the real GPU, but the CUDA driver "
        "cannot be used: "
    )
    assert proc.stderr.rstrip().endswith(f"To run on the simulated device instead, {how}")
    assert proc.stderr.count("\n") == 1  # one line, no traceback
    assert "driver='sim'" not in proc.stderr  # the command line's spelling, not Python's
    assert "SIMULATED" not in proc.stdout


def test_bench_without_a_choice_does_not_fall_back() -> None:
    proc = _run("bench", "--quick", env=NO_GPU)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("aiocudasem bench: error: the CUDA driver cannot be used: ")
    assert "pass --driver sim" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("command", ["demo", "bench"])
def test_an_invalid_driver_variable_is_a_usage_error(command: str) -> None:
    proc = _run(command, env={acs.DRIVER_ENV: "bogus"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        f"aiocudasem {command}: error: AIOCUDASEM_DRIVER='bogus' names no driver: set it to "
        "cuda or sim, or unset it (or pass --driver cuda or --driver sim, which takes "
        "precedence)\n"
    )
    assert proc.stdout == ""


def test_the_driver_flag_takes_precedence_over_the_variable() -> None:
    proc = _run(
        "demo", "--driver", "sim", "--frames", "4", "--words", "64", env={acs.DRIVER_ENV: "bogus"}
    )
    assert proc.returncode == 0, proc.stderr
    assert "all 4 frames verified" in proc.stdout


def test_doctor_reports_an_invalid_driver_variable() -> None:
    proc = _run("doctor", env={acs.DRIVER_ENV: "bogus"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    problem = "AIOCUDASEM_DRIVER='bogus' names no driver: set it to cuda or sim, or unset it"
    assert f"default: PROBLEM: {problem}" in proc.stdout
    assert proc.stderr.startswith(f"aiocudasem doctor: problem: {problem}")
    assert "notifier" in proc.stdout  # the rest of the report is still there


# ---------------------------------------------------------------- a demo that fails

# The demo on the simulated device, with device 0 faulting at the check of its 19th frame, while
# the other consumer coroutines wait on theirs.
_FAULTING_DEMO = """\
import sys
from aiocudasem import cli
from aiocudasem.cli import demo

real = demo.workloads


class FaultAt:
    def __init__(self, driver):
        self.driver, self.work, self.launches = driver, real(driver), 0

    def __getattr__(self, name):
        return getattr(self.work, name)

    def launch_check_frame(self, *args):
        self.launches += 1
        if self.launches == 20:  # the first launch is the warm-up's
            self.driver.inject_fault(0)
        return self.work.launch_check_frame(*args)


demo.workloads = FaultAt
sys.exit(cli.main(["demo", "--driver", "sim", "--frames", "200", "--words", "64"]))
"""


def test_a_device_fault_during_the_demo_is_reported_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _FAULTING_DEMO],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Every consumer that was waiting fails: the task group raises a group of the faults.
    assert re.fullmatch(
        r"demo FAILED: DeviceFaultError: cu\w+ failed: CUDA_ERROR_ILLEGAL_ADDRESS \(700\) "
        r"\[simulated\]( \(and [1-3] more\))?\n",
        proc.stderr,
    ), proc.stderr
    assert "all 200 frames verified" not in proc.stdout


def _raise(exc: BaseException) -> Callable[..., object]:
    def run(*args: object, **kwargs: object) -> object:
        raise exc

    return run


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (TimeoutError(), "demo FAILED: TimeoutError: "),
        (
            ExceptionGroup(
                "tasks",
                [
                    RuntimeError("first"),
                    ExceptionGroup(
                        "inner", [acs.DeviceFaultError("second", 700), TimeoutError("third")]
                    ),
                ],
            ),
            "demo FAILED: RuntimeError: first (and 2 more)",
        ),
        (ExceptionGroup("tasks", [ValueError("only")]), "demo FAILED: ValueError: only"),
    ],
    ids=["plain", "nested", "one"],
)
def test_demo_failures_in_a_group_are_reported_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    exc: BaseException,
    line: str,
) -> None:
    monkeypatch.setattr(demo.anyio, "run", _raise(exc))
    assert demo.main("sim", "asyncio", demo.DemoParams()) == 1
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize(
    "exc",
    [
        ExceptionGroup("tasks", [BrokenPipeError(), BrokenPipeError()]),
        ExceptionGroup("tasks", [RuntimeError("a failure"), KeyError("a bug")]),
        BaseExceptionGroup("tasks", [RuntimeError("a failure"), KeyboardInterrupt()]),
    ],
    ids=["closed-pipe", "bug", "interrupt"],
)
def test_a_group_with_anything_but_demo_failures_is_not_reported_as_one(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    monkeypatch.setattr(demo.anyio, "run", _raise(exc))
    with pytest.raises(BaseExceptionGroup) as info:
        demo.main("sim", "asyncio", demo.DemoParams())
    assert info.value is exc


# ---------------------------------------------------------------- a closed output pipe


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["doctor"],
        ["demo", "--driver", "sim", "--frames", "8", "--words", "64"],
        ["bench", "--driver", "sim", "--quick"],
    ],
    ids=lambda a: a[0],
)
@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
def test_a_closed_pipe_stops_the_command_quietly(
    args: list[str], unbuffered: str, tmp_path: Path
) -> None:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiocudasem", *args],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=_env({"PYTHONUNBUFFERED": unbuffered}),
        cwd=tmp_path,  # bench creates its --out, bench-out, before it prints
    )
    # Closed before the interpreter has even started: the first line written meets it.
    os.close(write_end)
    os.close(read_end)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == cli._common.EXIT_CLOSED_PIPE, err
    assert err == ""


def test_a_pipe_closed_while_the_demo_runs_stops_it_quietly() -> None:
    args = ["demo", "--driver", "sim", "--frames", "2000", "--words", "64"]
    with subprocess.Popen(
        [sys.executable, "-m", "aiocudasem", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if "consumer coroutines" in line:  # the last line before the frames flow
                break
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == cli._common.EXIT_CLOSED_PIPE, err
    assert err == ""


@pytest.mark.parametrize(
    "exc",
    [
        BrokenPipeError(),
        BaseExceptionGroup("a task printed", [BrokenPipeError()]),
        ExceptionGroup("nested", [ExceptionGroup("tasks", [BrokenPipeError(), BrokenPipeError()])]),
    ],
    ids=["plain", "group", "nested"],
)
def test_a_closed_pipe_inside_an_event_loop_is_recognised(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    silenced: list[bool] = []

    def run(args: list[str]) -> int:
        raise exc

    monkeypatch.setattr(cli, "_run", run)
    monkeypatch.setattr(cli, "silence_stdout", lambda: silenced.append(True))
    assert cli.main(["demo"]) == cli._common.EXIT_CLOSED_PIPE
    assert silenced == [True]


def test_other_errors_beside_a_closed_pipe_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    group = ExceptionGroup("tasks", [BrokenPipeError(), ValueError("a real bug")])

    def run(args: list[str]) -> int:
        raise group

    monkeypatch.setattr(cli, "_run", run)
    monkeypatch.setattr(cli, "silence_stdout", lambda: None)
    with pytest.raises(ExceptionGroup) as info:
        cli.main(["demo"])
    assert info.value is group


# ---------------------------------------------------------------- bench without matplotlib


def _tiny_results() -> tuple[dict[str, object], dict[str, object]]:
    run = {
        "latency_100us": [110.0, 120.0],
        "latency_empty": [5.0, 6.0],
        "awaits_per_s_1": 1000.0,
        "awaits_per_s_8": 4000.0,
    }
    results = {"sync": {"label": "blocking sync", "runs": [run]}}
    meta = {
        "date": "2026-12-01 12:00 UTC",
        "simulated": True,
        "gpu": {"device": "simulated", "driver": "sim"},
        "host": "x86_64, 2 CPUs",
        "devices": 1,
        "repeats": 1,
        "commit": "commit 0123456789ab",
        "versions": {"python": "3.11"},
    }
    return results, meta


def test_bench_without_matplotlib_says_so_and_links_no_plot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # importing it raises ImportError
    (tmp_path / "latency.png").write_bytes(b"a plot of an earlier run")
    results, meta = _tiny_results()
    bench.write(tmp_path, results, meta)
    page = (tmp_path / "performance.md").read_text()
    assert "latency.png" not in page
    assert "(No latency plot: matplotlib is not installed; pip install 'aiocudasem[bench]'" in page
    assert not (tmp_path / "latency.png").exists()  # the earlier run's plot is gone
    err = capsys.readouterr().err
    assert err.startswith("aiocudasem bench: warning: wrote no latency.png: matplotlib is not")
    assert "removed the latency.png of an earlier run" in err
