"""Fixtures of the GPU suite: the real CUDA driver and a Vulkan device on the same GPU."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice


@pytest.fixture(scope="session")
def cuda() -> acs.Driver:
    try:
        return acs.get_driver("cuda")
    except acs.DriverUnavailableError as exc:  # pragma: no cover - collection skips first
        pytest.skip(f"no CUDA GPU: {exc}")


@pytest.fixture(scope="session")
def vk(cuda: acs.Driver) -> Iterator[VulkanDevice]:
    """The Vulkan device whose UUID is CUDA device 0's. On a GPU machine it must exist."""
    dev = VulkanDevice.open(uuid=cuda.device_uuid(0))
    yield dev
    dev.close()


def import_vk(vk_sem: object, cuda: acs.Driver) -> acs.ExternalSemaphore:
    """Export a Vulkan semaphore and import it into CUDA device 0."""
    fd = vk_sem.export_fd()  # type: ignore[attr-defined]
    kind = (
        acs.HandleType.TIMELINE_SEMAPHORE_FD
        if vk_sem.is_timeline  # type: ignore[attr-defined]
        else acs.HandleType.OPAQUE_FD
    )
    try:
        return acs.import_semaphore(kind, fd, driver=cuda)
    except BaseException:
        os.close(fd)
        raise
