"""The README's quick start names commands that exist, CI runs the test command, and its two
examples run as written: the first on the simulated device, the second on a GPU with Vulkan."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
SIM = "## Five minutes on the simulated device"
GPU = "## On a GPU, with a Vulkan producer"


def test_quick_start_commands_exist_and_ci_runs_the_test_command() -> None:
    quick = README.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for cmd in commands:
        assert (ROOT / cmd.split()[1]).is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash scripts/test\.sh$", ci, re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def example(heading: str) -> str:
    """The Python example under ``heading``: the section's first Python block."""
    assert heading in README, f"the README has no section {heading!r}"
    section = README.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = python_blocks(section)
    assert blocks, f"{heading!r} has no Python example"
    return blocks[0]


def run(
    code: str, cwd: Path, env: dict[str, str], *options: str
) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *options, str(script)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_first_example_is_the_simulated_one() -> None:
    code = python_blocks(README)[0]
    assert code == example(SIM)
    assert "SimDriver()" in code
    assert "anyio.run(main)" in code
    assert README.index(SIM) < README.index(GPU)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_first_example_runs_on_the_simulated_device(backend: str, tmp_path: Path) -> None:
    code = example(SIM)
    if backend == "trio":
        pytest.importorskip("trio")
        code = code.replace("anyio.run(main)", 'anyio.run(main, backend="trio")')
    # No driver is chosen for it: the example picks the simulated device itself.
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}
    # -X dev shows every ResourceWarning: the example closes what it opens.
    result = run(code, tmp_path, env, "-X", "dev")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"frame {n}: processed, done = {n}" for n in (1, 2, 3)]
    assert "Warning" not in result.stderr, result.stderr


@pytest.mark.gpu
def test_the_gpu_example_runs(tmp_path: Path) -> None:
    code = example(GPU)
    assert "VulkanDevice" in code
    env = {k: v for k, v in os.environ.items() if k != "AIOCUDASEM_DRIVER"}  # the default: cuda
    result = run(code, tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_ten_line_example_runs_on_the_simulated_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "In ten lines" is a function, not a program: run it against simulated semaphores, with
    a producer thread that makes each frame ready once the previous one is done."""
    import threading

    import anyio

    from aiocudasem.testing import import_sim_semaphore

    section = README.split("## In ten lines", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```py\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1
    code = blocks[0]
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md (In ten lines)", "exec"), namespace)
    consume = namespace["consume"]

    async def main() -> None:
        ready, producer = import_sim_semaphore("sim")
        done, consumer_side = import_sim_semaphore("sim")

        def produce() -> None:
            for n in range(1, 1001):
                producer.signal(n)
                assert consumer_side.block_until(n, timeout=30)

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            with anyio.fail_after(60):
                async with ready, done:
                    await consume(ready, done)  # type: ignore[operator]
        finally:
            thread.join(timeout=30)
        assert consumer_side.value == 1000

    monkeypatch.setenv("AIOCUDASEM_DRIVER", "sim")  # the example opens its stream on the default
    anyio.run(main)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_host_stage_example_runs_on_the_simulated_device(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host-stage example is a function: run it on the simulated device with a request
    whose kernel doubles what receive() wrote, and check that send() saw the kernel's result,
    so that the three steps ran in the stream's order."""
    import anyio

    import aiocudasem as acs
    from aiocudasem.testing import SimDriver

    section = README.split("## Host work in the stream's order", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```py\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1
    sim = SimDriver()

    class Request:
        def __init__(self, value: int) -> None:
            self.value = value
            self.buffer: list[int] = []

    async def receive(request: Request) -> None:
        await anyio.sleep(0.01)  # the network, say
        request.buffer.append(request.value)

    def launch_kernels(stream: acs.Stream, request: Request) -> None:
        sim.launch(stream, lambda: request.buffer.append(2 * request.buffer[-1]))

    async def send(request: Request) -> bytes:
        return bytes(request.buffer)

    namespace: dict[str, object] = {
        "Request": Request,
        "receive": receive,
        "launch_kernels": launch_kernels,
        "send": send,
    }
    exec(compile(blocks[0], "README.md (host stages)", "exec"), namespace)
    serve = namespace["serve"]

    async def main() -> None:
        async with acs.open_stream(driver=sim) as stream:
            with anyio.fail_after(30):
                replies = [await serve(stream, Request(n)) for n in (3, 5, 7)]  # type: ignore[operator]
        assert replies == [bytes([3, 6]), bytes([5, 10]), bytes([7, 14])]

    anyio.run(main, backend=backend)
