from __future__ import annotations

import os
import subprocess
import sys

import anyio
import pytest

from aiocudasem.cli.demo import run_demo
from aiocudasem.testing import SimDriver, SimProducer

pytestmark = pytest.mark.anyio


async def test_demo_verifies_every_frame(sim: SimDriver) -> None:
    lines: list[str] = []
    result = await run_demo(sim, frames=48, consumers=3, buffers=2, words=512, say=lines.append)
    assert result.frames == 48
    assert len(result.latencies_us) == 48
    assert all(lat > 0 for lat in result.latencies_us)
    assert any("SIMULATED" in line for line in lines)


async def test_demo_catches_a_broken_handoff(sim: SimDriver) -> None:
    with pytest.raises(RuntimeError, match="failed verification"):
        await run_demo(
            sim,
            frames=30,
            consumers=2,
            buffers=1,
            words=256,
            say=lambda _: None,
            wait_for_reuse=False,
        )


class _DeadProducerSim(SimDriver):
    """The first semaphore (the producer's `ready`) never changes: a producer that died."""

    def create_semaphore(self, timeline: bool = True, initial: int = 0) -> SimProducer:
        producer = super().create_semaphore(timeline, initial)
        if not getattr(self, "_stuck_one", False):
            self._stuck_one = True
            producer.set_stuck()
        return producer


async def test_demo_with_a_dead_producer_fails_without_hanging() -> None:
    sim = _DeadProducerSim()
    with anyio.fail_after(30), pytest.raises(TimeoutError):
        await run_demo(sim, frames=8, words=64, say=lambda _: None, give_up_after=0.3)


@pytest.mark.parametrize(
    "kwargs", [{"frames": 0}, {"consumers": 0}, {"buffers": 65}, {"words": 0}, {"words": 1 << 16}]
)
async def test_demo_bad_arguments(sim: SimDriver, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        await run_demo(sim, say=lambda _: None, **kwargs)


def test_cli_demo_without_a_choice_falls_back_to_the_simulated_device_saying_so() -> None:
    # No --driver and no $AIOCUDASEM_DRIVER; CUDA_VISIBLE_DEVICES= hides any GPU.
    env = {**os.environ, "AIOCUDASEM_DRIVER": "", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "aiocudasem", "demo", "--frames", "24", "--backend", "trio"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("no usable CUDA GPU: ")
    assert "falling back to the SIMULATED device; pass --driver cuda" in out
    assert "all 24 frames verified" in out
    assert "ran on the SIMULATED device" in out


def test_cli_doctor() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "aiocudasem", "doctor"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "notifier" in proc.stdout
    assert "cuda" in proc.stdout


@pytest.mark.parametrize(("backend", "package"), [("trio", "trio"), ("asyncio+uvloop", "uvloop")])
def test_demo_names_the_missing_event_loop_package_in_one_line(
    backend: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from aiocudasem.cli import _common
    from aiocudasem.cli._common import CommandError
    from aiocudasem.cli.demo import DemoParams, main

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == missing else real(name, package)

    missing = package
    monkeypatch.setattr(_common.importlib.util, "find_spec", find_spec)
    with pytest.raises(CommandError) as info:
        main("sim", backend, DemoParams())
    assert str(info.value) == (
        f"--backend {backend}: the {backend} event loop needs {package}, which is not "
        f"installed: pip install {package}"
    )
    assert info.value.status == 1
