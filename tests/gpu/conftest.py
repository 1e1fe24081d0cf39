"""Fixtures of the GPU suite: the real CUDA driver and a Vulkan device on the same GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiocudasem as acs
from aiocudasem.testing import workloads
from aiocudasem.vulkan import VulkanDevice


@pytest.fixture(scope="session")
def cuda() -> acs.Driver:
    try:
        drv = acs.get_driver("cuda")
    except acs.DriverUnavailableError as exc:  # pragma: no cover - collection skips first
        pytest.skip(f"no CUDA GPU: {exc}")
    # Before any semaphore wait: the workload kernels then load ahead of the first one.
    workloads(drv)
    return drv


@pytest.fixture(scope="session")
def vk(cuda: acs.Driver) -> Iterator[VulkanDevice]:
    """The Vulkan device whose UUID is CUDA device 0's. On a GPU machine it must exist."""
    dev = VulkanDevice.open(uuid=cuda.device_uuid(0))
    yield dev
    dev.close()


def import_vk(vk_sem: object, cuda: acs.Driver, device: int = 0) -> acs.ExternalSemaphore:
    """Export a Vulkan semaphore and import it into CUDA device ``device``."""
    fd = vk_sem.export_fd()  # type: ignore[attr-defined]
    kind = (
        acs.HandleType.TIMELINE_SEMAPHORE_FD
        if vk_sem.is_timeline  # type: ignore[attr-defined]
        else acs.HandleType.OPAQUE_FD
    )
    try:
        return acs.import_semaphore(kind, fd, device=device, driver=cuda)
    except BaseException:
        os.close(fd)
        raise


def run_script(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script args`` in a fresh process (a device fault ends CUDA for the rest
    of a process), with this process' import path, from the repository root; assert that it
    exited with 0 and return it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
