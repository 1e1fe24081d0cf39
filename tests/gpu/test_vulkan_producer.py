"""aiocudasem.vulkan on a real GPU driver: exportable semaphores driven from the host and the
queue, without CUDA. The whole module skips when no Vulkan device can export semaphores (the
reason says why); on a machine whose Vulkan driver is installed outside the standard
directories, point VK_DRIVER_FILES at its ICD JSON file first.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from aiocudasem import DeviceMismatchError, VulkanUnavailableError
from aiocudasem.vulkan import VulkanDevice

try:
    VulkanDevice.open().close()
except VulkanUnavailableError as _exc:
    pytest.skip(f"no Vulkan device that can export semaphores: {_exc}", allow_module_level=True)


@pytest.fixture
def device() -> Iterator[VulkanDevice]:
    dev = VulkanDevice.open()
    yield dev
    dev.close()


def _is_open_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.gpu
def test_open_by_uuid(device: VulkanDevice) -> None:
    assert isinstance(device.uuid, bytes)
    assert len(device.uuid) == 16
    assert device.name
    assert device.api_version >= (1, 2, 0)
    with VulkanDevice.open(uuid=device.uuid) as same:
        assert same.uuid == device.uuid
        assert same.name == device.name


@pytest.mark.gpu
def test_timeline_signal_value_wait(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore(3)
    assert sem.is_timeline
    assert sem.value == 3
    sem.signal(10)
    assert sem.value == 10
    assert sem.block_until(10)
    assert sem.block_until(4, timeout=0)
    started = time.monotonic()
    assert sem.block_until(11, timeout=0.05) is False
    assert time.monotonic() - started >= 0.04
    assert sem.block_until(11, timeout=0) is False


@pytest.mark.gpu
def test_host_wait_wakes_on_signal_from_another_thread(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(sem.block_until(2, timeout=10)))
    waiter.start()
    time.sleep(0.05)
    sem.signal(2)
    waiter.join(10)
    assert results == [True]


@pytest.mark.gpu
def test_submit_signal_then_wait(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    sem.submit_signal(5)
    assert sem.block_until(5, timeout=10)
    assert sem.value == 5
    device.block_until_idle()


@pytest.mark.gpu
def test_many_queue_signals(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    for value in range(1, 501):
        sem.submit_signal(value)
    assert sem.block_until(500, timeout=30)
    device.block_until_idle()
    assert sem.value == 500


@pytest.mark.gpu
def test_submit_wait_gated_on_host_signal(device: VulkanDevice) -> None:
    gate = device.create_timeline_semaphore()
    done = device.create_timeline_semaphore()
    gate.submit_wait(2, then_signal=done, then_signal_value=9)
    assert done.block_until(9, timeout=0.1) is False
    gate.signal(1)
    assert done.block_until(9, timeout=0.1) is False
    gate.signal(2)
    assert done.block_until(9, timeout=10)
    assert done.value == 9
    device.block_until_idle()


@pytest.mark.gpu
def test_binary_round_trip_on_the_queue(device: VulkanDevice) -> None:
    binary = device.create_binary_semaphore()
    done = device.create_timeline_semaphore()
    assert not binary.is_timeline
    binary.submit_signal()
    binary.submit_wait(then_signal=done, then_signal_value=1)
    assert done.block_until(1, timeout=10)
    device.block_until_idle()


@pytest.mark.gpu
def test_binary_export_fd(device: VulkanDevice) -> None:
    sem = device.create_binary_semaphore()
    fd = sem.export_fd()
    try:
        assert isinstance(fd, int)
        assert fd >= 0
        assert _is_open_fd(fd)
    finally:
        os.close(fd)
    assert not _is_open_fd(fd)


@pytest.mark.gpu
def test_timeline_export_fd(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore(1)
    fd = sem.export_fd()
    try:
        assert fd >= 0
        assert not stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


@pytest.mark.gpu
def test_export_twice_gives_distinct_fds(device: VulkanDevice) -> None:
    for sem in (device.create_binary_semaphore(), device.create_timeline_semaphore()):
        first = sem.export_fd()
        second = sem.export_fd()
        try:
            assert first != second
            assert _is_open_fd(first)
            assert _is_open_fd(second)
        finally:
            os.close(first)
            os.close(second)


@pytest.mark.gpu
def test_exported_fd_outlives_its_semaphore() -> None:
    with VulkanDevice.open() as dev:
        sem = dev.create_timeline_semaphore()
        fd = sem.export_fd()
        sem.close()
    try:
        assert _is_open_fd(fd)  # the caller owns it, not the device
    finally:
        os.close(fd)


@pytest.mark.gpu
def test_misuse(device: VulkanDevice) -> None:
    timeline = device.create_timeline_semaphore(4)
    binary = device.create_binary_semaphore()
    with pytest.raises(TypeError, match="submit_signal"):
        binary.signal(1)
    with pytest.raises(TypeError):
        _ = binary.value
    with pytest.raises(TypeError, match="submit_wait"):
        binary.block_until(1)
    with pytest.raises(TypeError, match="without one"):
        binary.submit_signal(1)
    with pytest.raises(TypeError, match="needs a value"):
        timeline.submit_signal()
    with pytest.raises(TypeError, match="must be an int"):
        timeline.signal(False)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        timeline.signal(2**64)
    with pytest.raises(ValueError, match="greater than the current value 4"):
        timeline.signal(4)
    with pytest.raises(ValueError, match="timeout"):
        timeline.block_until(5, timeout=-1)
    with pytest.raises(TypeError, match="give then_signal_value"):
        binary.submit_wait(then_signal=timeline)
    with pytest.raises(TypeError):
        device.create_timeline_semaphore("1")  # type: ignore[arg-type]


@pytest.mark.gpu
def test_then_signal_on_another_device(device: VulkanDevice) -> None:
    with VulkanDevice.open(uuid=device.uuid) as other:
        mine = device.create_timeline_semaphore()
        theirs = other.create_timeline_semaphore()
        with pytest.raises(DeviceMismatchError):
            mine.submit_wait(1, then_signal=theirs, then_signal_value=1)


@pytest.mark.gpu
def test_closed_objects() -> None:
    dev = VulkanDevice.open()
    sem = dev.create_timeline_semaphore()
    other = dev.create_binary_semaphore()
    other.close()
    other.close()
    with pytest.raises(anyio.ClosedResourceError):
        other.export_fd()
    dev.close()
    dev.close()
    assert sem.closed
    with pytest.raises(anyio.ClosedResourceError):
        sem.signal(1)
    with pytest.raises(anyio.ClosedResourceError):
        sem.export_fd()
    with pytest.raises(anyio.ClosedResourceError):
        dev.create_binary_semaphore()
