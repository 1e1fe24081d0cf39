"""The programs in examples/ run and do what they say: each in a fresh process with this tree's
package, on the simulated device here and on the GPU with ``-m gpu``."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StallWatch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DRIVERS = ["sim", pytest.param("cuda", marks=pytest.mark.gpu)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}
    # This tree's package first, not an installed one; what was on the path stays after it (a
    # machine may carry its dependencies there rather than in site-packages).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


def run_example(
    name: str, *args: str, timeout: float = 60, ok: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``examples/NAME ARGS`` to the end; with ``ok``, assert that it exited with 0."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
        cwd=ROOT,
    )
    if ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def frames_done(out: str) -> list[int]:
    return sorted(int(n) for n in re.findall(r"^frame (\d+) done$", out, re.MULTILINE))


@pytest.mark.parametrize("driver", DRIVERS)
def test_asyncio_handoff(driver: str) -> None:
    out = run_example("asyncio_handoff.py", "--driver", driver, "--frames", "12").stdout
    assert frames_done(out) == list(range(1, 13))
    assert out.splitlines()[-1].startswith("all 12 frames handed back in ")
    assert out.splitlines()[-1].endswith(f"on driver '{driver}'")


@pytest.mark.parametrize("driver", DRIVERS)
def test_trio_handoff(driver: str) -> None:
    out = run_example("trio_handoff.py", "--driver", driver, "--frames", "12").stdout
    assert frames_done(out) == list(range(1, 13))  # frame 13's wait was cancelled
    assert "frame 13 late: stopped waiting for it (cancelled: True)\n" in out
    assert "frame 13 arrived; the stream went on and signalled done = 13\n" in out
    assert out.splitlines()[-1] == f"all 13 frames handed back on driver '{driver}'"


def test_handoff_example_follows_the_environment() -> None:
    out = run_example("asyncio_handoff.py", "--frames", "3", AIOCUDASEM_DRIVER="sim").stdout
    assert out.splitlines()[-1].endswith("on driver 'sim'")


def test_handoff_example_without_a_gpu_names_the_sim() -> None:
    from aiocudasem import DriverUnavailableError, get_driver

    try:
        get_driver("cuda")
    except DriverUnavailableError:
        pass
    else:
        pytest.skip("this machine has a usable GPU")
    for name in ("asyncio_handoff.py", "trio_handoff.py"):
        proc = run_example(name, "--frames", "3", ok=False)
        assert proc.returncode == 1
        assert proc.stderr.startswith("failed: the CUDA driver cannot be used: ")
        # The example's own option, not the Python spelling of the library's message.
        assert proc.stderr.endswith("(--driver sim runs it on the simulated device)\n")
        assert "driver='sim'" not in proc.stderr


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


@pytest.mark.parametrize("driver", DRIVERS)
def test_web_service_overlaps_requests(driver: str) -> None:
    pytest.importorskip("aiohttp")
    n, ms = 8, 100
    args = ["--driver", driver, "--host", "127.0.0.1", "--port", "0", "--streams", str(n)]
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "web_service.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        if not select.select([proc.stdout], [], [], 60)[0]:
            pytest.fail("the service did not start within 60 s")
        line = proc.stdout.readline()
        match = re.fullmatch(rf"serving on http://127\.0\.0\.1:(\d+) \(driver '{driver}'\)\n", line)
        if not match:  # an empty line: the service exited, and says why on stderr
            pytest.fail(f"{line!r}, stderr: {'' if line else proc.communicate()[1]}")
        url = f"http://127.0.0.1:{match[1]}/work?ms={ms}"
        assert _get(url)[0] == 200  # the first wait of the loop sets its notifier up
        with ThreadPoolExecutor(n) as pool, StallWatch() as watch:
            start = time.perf_counter()
            replies = list(pool.map(_get, [url] * n))
            took = time.perf_counter() - start
        assert [status for status, _ in replies] == [200] * n
        assert all(body["took_ms"] >= 0.95 * ms for _, body in replies), replies  # it did wait
        # Run one after another they would take n * ms; overlapped, about ms. A stall of this
        # process (the machine's, not the service's doing) is allowed for on top.
        limit = 0.5 * n * ms / 1e3 + watch.stall
        assert took < limit, (
            f"{n} requests of {ms} ms took {took * 1e3:.0f} ms (limit {limit * 1e3:.0f} ms, of "
            f"which {watch.stall * 1e3:.0f} ms for a stall of the test process)"
        )
        status, text = _get(url.replace(f"ms={ms}", "ms=-1"))
        assert (status, text) == (400, "ms must be a number of milliseconds in [0, 10000]\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, out + err
    assert out.endswith("stopped\n"), out + err


@pytest.mark.parametrize(
    ("name", "tests"), [("test_with_pytest_asyncio.py", 3), ("test_with_anyio.py", 3 * 2)]
)
def test_testing_examples_pass(name: str, tests: int, tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    options = ["-p", "no:cacheprovider", "-p", "anyio", f"--junitxml={report}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(EXAMPLES / "testing" / name)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, "-1")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts == {"tests": tests, "failures": 0, "errors": 0, "skipped": 0}, proc.stdout


@pytest.mark.gpu
def test_vulkan_producer() -> None:
    out = run_example("vulkan_producer.py", "--frames", "64", timeout=300).stdout
    assert "all 64 frames verified on the GPU" in out, out


@pytest.mark.gpu
@pytest.mark.parametrize("module", ["torch", "cupy"])
def test_foreign_library_examples(module: str) -> None:
    pytest.importorskip(module)
    out = run_example(f"{module}_streams.py", timeout=300).stdout
    assert out.splitlines()[-1] == "done", out


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    "producer",
    ["sim"] + [pytest.param(lib, marks=pytest.mark.gpu) for lib in ("torch", "cupy")],
)
def test_dlpack_ready(producer: str, backend: str) -> None:
    if producer != "sim":
        pytest.importorskip(producer)
    out = run_example("dlpack_ready.py", "--producer", producer, "--backend", backend).stdout
    lines = out.splitlines()
    assert lines[-2:] == ["the producer's work was complete: True", "done"], out
    first = re.match(r"ready\(\) returned after (\d+) ms", lines[0])
    assert first is not None, out
    took = float(first.group(1))
    if producer == "sim":
        assert took >= 150, out  # the simulated producer's work takes 200 ms


def test_observability() -> None:
    proc = run_example("observability.py")
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        "while 8 coroutines wait: parked 8, spinning 0, completed 0, faulted 0, faults seen 0, "
        "leaked 0"
    ), proc.stdout
    assert lines[1].startswith("after they woke: parked 0, spinning 0, completed 8, faulted 0")
    assert lines[2].startswith("a waiter got DeviceFaultError: ")
    assert lines[3].startswith("after the fault: parked 0, spinning 0, completed 9, faulted 1")
    assert "faults seen 1" in lines[3]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("log: ERROR")]
    assert len(errors) == 1, proc.stderr
    assert "device 1 of the sim driver faulted" in errors[0]


@pytest.mark.parametrize("who", ["CPU", "GPU"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_host_timelines_between_two_processes(driver: str, backend: str, who: str) -> None:
    """1,000 frames from a producer process, every one checked by the consumer; the producer's
    CPU or its GPU (a CUDA producer) signals each."""
    args = ["--driver", driver, "--backend", backend] + (["--gpu-producer"] if who == "GPU" else [])
    out = run_example("host_timeline_processes.py", *args, timeout=120).stdout
    last = out.splitlines()[-1]
    assert last.startswith("all 1000 frames handed over between two processes")
    assert last.endswith(
        f"on driver '{driver}' ({backend}, the producer's {who} signalling), every frame intact"
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_killed_producer_process_ends_the_consumer_cleanly(driver: str, backend: str) -> None:
    start = time.monotonic()
    proc = run_example(
        "host_timeline_processes.py",
        *("--driver", driver, "--backend", backend, "--kill-producer-after", "300"),
        timeout=60,
        ok=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    match = re.search(r"the producer exited \(-9\): frames 1-(\d+) were handed over", proc.stderr)
    assert match, proc.stderr
    assert 300 <= int(match.group(1)) <= 304  # the producer runs at most a ring ahead
    assert "released everything" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_interprocess_event_between_two_processes(driver: str, backend: str) -> None:
    args = ["--driver", driver, "--backend", backend]
    out = run_example("ipc_event_processes.py", *args, timeout=120).stdout
    assert out.splitlines()[-1].startswith("all 1000 frames awaited through an interprocess event")
    assert out.splitlines()[-1].endswith(f"'{driver}' ({backend}), every write visible")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_killed_interprocess_event_producer_ends_the_consumer(driver: str, backend: str) -> None:
    start = time.monotonic()
    args = ["--driver", driver, "--backend", backend, "--kill-producer-after", "300"]
    proc = run_example("ipc_event_processes.py", *args, timeout=60, ok=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the producer exited (-9) after frame 300; stopped waiting for it" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_interprocess_records_between_two_processes(driver: str, backend: str) -> None:
    args = ["--driver", driver, "--backend", backend]
    out = run_example("ipc_records.py", *args, timeout=120).stdout
    assert out.splitlines()[-1].startswith("all 1000 records awaited by number in ")
    assert out.splitlines()[-1].endswith(f"'{driver}' ({backend}), every write visible")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_killed_records_producer_is_abandoned_and_the_consumer_ends(
    driver: str, backend: str
) -> None:
    start = time.monotonic()
    args = ["--driver", driver, "--backend", backend, "--kill-producer-after", "300"]
    proc = run_example("ipc_records.py", *args, timeout=60, ok=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = re.search(
        r"the producer exited \(-9\) after record (\d+); its records were", proc.stderr
    )
    assert said is not None, proc.stderr
    assert 300 <= int(said.group(1)) < 300 + 16  # what it completed before it died
    assert "abandoned and everything released" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("how", ["built", "captured"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_graph_handoff(driver: str, backend: str, how: str) -> None:
    args = ["--driver", driver, "--backend", backend, "--frames", "300"]
    if how == "captured":
        args.append("--capture")
    out = run_example("graph_handoff.py", *args, timeout=120).stdout
    assert out.splitlines()[-1].startswith(f"300 launches of one {how} graph in ")
    assert out.splitlines()[-1].endswith(f"on driver '{driver}'")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_producer_dies(driver: str, backend: str) -> None:
    args = ["--driver", driver, "--backend", backend, "--frames", "5"]
    proc = run_example("producer_dies.py", *args, timeout=60)
    lines = proc.stdout.splitlines()
    assert frames_done(proc.stdout) == [1, 2, 3, 4, 5], proc.stdout
    assert lines[-3:-1] == [
        "the producer's socket closed: abandoning its timeline",
        "frame 6 never came: its hand-off raised AbandonedError",
    ], proc.stdout
    last = re.fullmatch(
        rf"the producer exited \(-9\); stream and timelines released (\d+) ms after giving up, "
        rf"on driver '{driver}'",
        lines[-1],
    )
    assert last, proc.stdout
    assert int(last.group(1)) < 1000, proc.stdout
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_host_stage(driver: str, backend: str) -> None:
    args = ["--backend", backend, "--requests", "9", "--workers", "3", "--fail", "5"]
    if driver == "sim":
        proc = run_example("host_stage.py", *args, AIOCUDASEM_DRIVER="sim")
    else:
        proc = run_example("host_stage.py", "--driver", driver, *args)
    lines = proc.stdout.splitlines()
    replies = sorted(line for line in lines if line.startswith("request "))
    expected = [f"request {n}: input intact" for n in range(1, 10) if n != 5]
    expected.append("request 5: not answered (request 5: the client went away)")
    assert replies == sorted(expected), proc.stdout
    assert lines[-1].startswith("9 requests in "), proc.stdout
    assert lines[-1].endswith(f"on driver '{driver}'"), proc.stdout
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_kernel_progress(driver: str, backend: str) -> None:
    proc = run_example(
        "kernel_progress.py", "--driver", driver, "--backend", backend, "--steps", "300"
    )
    lines = proc.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines[:-1]] == [
        f"step {n}/300" for n in range(30, 301, 30)
    ], proc.stdout
    assert re.fullmatch(
        rf"300 steps awaited in [\d.]+ s on driver '{driver}', the process using \d+% of a core",
        lines[-1],
    ), proc.stdout
    assert proc.stderr == "", proc.stderr


@pytest.mark.parametrize("driver", DRIVERS)
def test_kernel_progress_trap(driver: str) -> None:
    proc = run_example("kernel_progress.py", "--driver", driver, "--trap-at", "120", ok=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("the kernel faulted after step 119: "), proc.stdout
    assert "CUDA_ERROR_" in last, proc.stdout  # CUDA_ERROR_LAUNCH_FAILED on the simulator
