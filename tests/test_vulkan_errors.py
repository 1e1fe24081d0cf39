"""aiocudasem.vulkan without a GPU: loader and driver failures, argument checks, and the queue
and lifetime logic.

The logic tests need some Vulkan device; Mesa's CPU implementation (lavapipe, in Debian's
mesa-vulkan-drivers, which libvulkan-dev pulls in) is enough. It cannot export semaphores, so
they open the device through the private ``require_export=False`` path and skip export checks;
they skip entirely where no Vulkan device exists. Exporting is covered by tests/gpu.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from aiocudasem import DeviceMismatchError, VulkanError, VulkanUnavailableError
from aiocudasem.vulkan import VulkanDevice, VulkanSemaphore, _abi, _loader, _state

_REPO = Path(__file__).resolve().parents[1]
_NO_SUCH_LIBRARY = "libaiocudasem-no-such-vulkan-loader.so.1"


def _run_python(code: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, so that a crash in the driver fails the test instead
    of killing pytest, and the loader reads a clean environment."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), environ.get("PYTHONPATH")]))
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )


_OPEN_AND_REPORT = """
    from aiocudasem import VulkanUnavailableError
    from aiocudasem.vulkan import VulkanDevice
    try:
        device = VulkanDevice.open()
    except VulkanUnavailableError as exc:
        print("unavailable", exc.status, exc)
    else:
        sem = device.create_timeline_semaphore()
        fd = sem.export_fd()
        import os
        os.close(fd)
        device.close()
        print("opened", device.name)
"""


# -- no loader, no driver ----------------------------------------------------------------------


def test_import_does_not_load_the_loader() -> None:
    done = _run_python(
        """
        import aiocudasem.vulkan
        with open("/proc/self/maps") as maps:
            print("libvulkan" in maps.read())
        """,
        AIOCUDASEM_VULKAN_LOADER=_NO_SUCH_LIBRARY,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_missing_loader_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_loader._LOADER_ENV, _NO_SUCH_LIBRARY)
    with pytest.raises(VulkanUnavailableError, match="cannot load the Vulkan loader") as info:
        VulkanDevice.open()
    assert _NO_SUCH_LIBRARY in str(info.value)
    assert _loader._LOADER_ENV in str(info.value)


def test_missing_loader_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_loader._LOADER_ENV, raising=False)
    monkeypatch.setattr(_loader, "_LOADER_NAMES", (_NO_SUCH_LIBRARY, "libaiocudasem-nope.so"))
    with pytest.raises(VulkanUnavailableError) as info:
        VulkanDevice.open()
    assert _NO_SUCH_LIBRARY in str(info.value)
    assert "libaiocudasem-nope.so" in str(info.value)
    # Each name once: dlopen's own message names the library already.
    assert str(info.value).count(_NO_SUCH_LIBRARY) == 1
    assert str(info.value).count("libaiocudasem-nope.so") == 1


def test_library_that_is_not_a_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_loader._LOADER_ENV, "libc.so.6")
    with pytest.raises(VulkanUnavailableError, match="vkGetInstanceProcAddr"):
        VulkanDevice.open()


def test_no_driver_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    # Point the loader at a driver list with nothing in it: the state of a machine with a
    # loader but no GPU driver. Without a loader this is the missing-loader error instead.
    nothing = str(tmp_path / "no-such-icd.json")
    done = _run_python(
        _OPEN_AND_REPORT,
        VK_DRIVER_FILES=nothing,
        VK_ICD_FILENAMES=nothing,
        VK_ADD_DRIVER_FILES=None,
        VK_LOADER_DEBUG=None,
    )
    assert done.returncode == 0, f"open() crashed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.startswith("unavailable "), done.stdout


def test_open_here_is_unavailable_or_works() -> None:
    # On a machine without a GPU open() must raise VulkanUnavailableError (no loader, no
    # driver, or only drivers that cannot export); where a device can export, it must work.
    done = _run_python(_OPEN_AND_REPORT)
    assert done.returncode == 0, f"open() crashed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.startswith(("unavailable ", "opened ")), done.stdout


def test_unknown_uuid_is_unavailable() -> None:
    with pytest.raises(VulkanUnavailableError):
        VulkanDevice.open(uuid=b"\xa5" * 16)


# -- argument checks ---------------------------------------------------------------------------


@pytest.mark.parametrize("uuid", ["0" * 16, 16, [0] * 16])
def test_uuid_type(uuid: object) -> None:
    with pytest.raises(TypeError, match="16 bytes"):
        VulkanDevice.open(uuid=uuid)  # type: ignore[arg-type]


@pytest.mark.parametrize("uuid", [b"", b"x" * 15, b"x" * 17])
def test_uuid_length(uuid: bytes) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        VulkanDevice.open(uuid=uuid)


def test_uint64_check() -> None:
    assert _loader._check_u64("v", 0) == 0
    assert _loader._check_u64("v", 2**64 - 1) == 2**64 - 1
    for bad_type in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="v must be an int"):
            _loader._check_u64("v", bad_type)
    for bad_value in (-1, 2**64):
        with pytest.raises(ValueError, match=r"v must be in \[0, 2\*\*64 - 1\]"):
            _loader._check_u64("v", bad_value)


def test_timeout_conversion() -> None:
    assert _loader._timeout_ns(None) == 2**64 - 1
    assert _loader._timeout_ns(math.inf) == 2**64 - 1
    assert _loader._timeout_ns(1e30) == 2**64 - 1
    assert _loader._timeout_ns(0) == 0
    assert _loader._timeout_ns(1.5) == 1_500_000_000
    assert _loader._timeout_ns(2) == 2_000_000_000
    for bad_value in (-0.001, math.nan):
        with pytest.raises(ValueError, match="timeout"):
            _loader._timeout_ns(bad_value)
    for bad_type in (True, "1", b"1"):
        with pytest.raises(TypeError, match="timeout"):
            _loader._timeout_ns(bad_type)


def test_error_carries_result() -> None:
    err = _loader._vk_error("vkQueueSubmit", _abi.VK_ERROR_DEVICE_LOST)
    assert isinstance(err, VulkanError)
    assert err.status == -4
    assert err.name == "VK_ERROR_DEVICE_LOST"
    assert "vkQueueSubmit" in str(err)
    unknown = _loader._vk_error("vkQueueSubmit", -123456)
    assert unknown.status == -123456
    assert unknown.name == ""
    with pytest.raises(VulkanError):
        _loader._check("vkQueueSubmit", -1)
    assert _loader._check("vkWaitSemaphores", _abi.VK_TIMEOUT) == _abi.VK_TIMEOUT


def test_not_constructed_directly() -> None:
    with pytest.raises(TypeError, match=r"VulkanDevice\.open"):
        VulkanDevice(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="create_timeline_semaphore"):
        VulkanSemaphore(object(), object())  # type: ignore[arg-type]


# -- queue and lifetime logic on any Vulkan device ---------------------------------------------


def _open_any() -> VulkanDevice:
    try:
        return VulkanDevice(_state._open_state(None, require_export=False))
    except VulkanUnavailableError as exc:
        pytest.skip(f"no Vulkan device here, not even a CPU one: {exc}")


@pytest.fixture
def device() -> Iterator[VulkanDevice]:
    dev = _open_any()
    yield dev
    dev.close()


def test_device_identity(device: VulkanDevice) -> None:
    assert isinstance(device.uuid, bytes)
    assert len(device.uuid) == 16
    assert isinstance(device.name, str)
    assert device.name
    assert device.api_version >= (1, 1, 0)
    assert device.name in repr(device)


def test_timeline_host_signal_and_wait(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore(5)
    assert sem.is_timeline
    assert sem.value == 5
    assert sem.block_until(5, timeout=0)
    assert not sem.block_until(6, timeout=0)
    started = time.monotonic()
    assert not sem.block_until(6, timeout=0.05)
    assert time.monotonic() - started >= 0.04
    sem.signal(9)
    assert sem.value == 9
    assert sem.block_until(7)
    assert sem.block_until(9, timeout=1)
    top = min(2**64 - 1, 9 + device._state.max_value_difference)
    sem.signal(top)
    assert sem.value == top


def test_host_wait_wakes_on_signal_from_another_thread(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(sem.block_until(3, timeout=10)))
    waiter.start()
    time.sleep(0.05)
    sem.signal(3)  # must not be blocked by the waiting thread
    waiter.join(10)
    assert results == [True]


def test_submit_signal_then_wait(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    sem.submit_signal(4)
    assert sem.block_until(4, timeout=10)
    assert sem.value == 4
    device.block_until_idle()


def test_submit_wait_gated_on_host_signal(device: VulkanDevice) -> None:
    gate = device.create_timeline_semaphore()
    done = device.create_timeline_semaphore()
    gate.submit_wait(2, then_signal=done, then_signal_value=7)
    assert not done.block_until(7, timeout=0.05)
    gate.signal(1)
    assert not done.block_until(7, timeout=0.05)
    gate.signal(2)
    assert done.block_until(7, timeout=10)
    assert done.value == 7


def test_binary_pairs(device: VulkanDevice) -> None:
    first = device.create_binary_semaphore()
    second = device.create_binary_semaphore()
    done = device.create_timeline_semaphore()
    assert not first.is_timeline
    first.submit_signal()
    first.submit_wait(then_signal=second)
    second.submit_wait(then_signal=done, then_signal_value=1)
    assert done.block_until(1, timeout=10)
    device.block_until_idle()


def test_binary_misuse(device: VulkanDevice) -> None:
    sem = device.create_binary_semaphore()
    with pytest.raises(TypeError, match="submit_signal"):
        sem.signal(1)
    with pytest.raises(TypeError, match="timeline"):
        _ = sem.value
    with pytest.raises(TypeError, match="submit_wait"):
        sem.block_until(1)
    with pytest.raises(TypeError, match="without one"):
        sem.submit_signal(1)
    with pytest.raises(TypeError, match="without one"):
        sem.submit_wait(1)


def test_timeline_misuse(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore(10)
    other = device.create_timeline_semaphore()
    binary = device.create_binary_semaphore()
    with pytest.raises(TypeError, match="must be an int"):
        sem.signal(True)
    with pytest.raises(TypeError, match="must be an int"):
        sem.signal(11.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2\\*\\*64"):
        sem.signal(-1)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        sem.block_until(2**64)
    with pytest.raises(ValueError, match="greater than the current value 10"):
        sem.signal(10)
    with pytest.raises(ValueError, match="greater than the semaphore's current value"):
        sem.submit_signal(3)
    with pytest.raises(TypeError, match="needs a value"):
        sem.submit_signal()
    with pytest.raises(TypeError, match="needs a value"):
        sem.submit_wait()
    with pytest.raises(TypeError, match="timeout"):
        sem.block_until(1, timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        sem.block_until(1, timeout=-1)
    with pytest.raises(TypeError, match="only meaningful together with then_signal"):
        sem.submit_wait(1, then_signal_value=1)
    with pytest.raises(TypeError, match="must be a VulkanSemaphore"):
        sem.submit_wait(1, then_signal=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give then_signal_value"):
        sem.submit_wait(1, then_signal=other)
    with pytest.raises(TypeError, match="leave then_signal_value unset"):
        sem.submit_wait(1, then_signal=binary, then_signal_value=1)
    with pytest.raises(ValueError, match="initial_value"):
        device.create_timeline_semaphore(-1)
    with pytest.raises(TypeError, match="initial_value"):
        device.create_timeline_semaphore(1.5)  # type: ignore[arg-type]


def test_values_against_pending_queue_signals(device: VulkanDevice) -> None:
    gate = device.create_timeline_semaphore()
    sem = device.create_timeline_semaphore()
    # A queue signal to 5 held back by the gate.
    gate.submit_wait(1, then_signal=sem, then_signal_value=5)
    with pytest.raises(ValueError, match="still pending"):
        sem.signal(5)
    with pytest.raises(ValueError, match="still pending"):
        sem.submit_signal(5)
    with pytest.raises(ValueError, match="then_signal_value 4"):
        gate.submit_wait(1, then_signal=sem, then_signal_value=4)
    sem.signal(4)  # below the pending signal: allowed
    gate.signal(1)
    assert sem.block_until(5, timeout=10)
    sem.signal(6)  # the pending signal has executed
    assert sem.value == 6


def test_then_signal_from_another_device(device: VulkanDevice) -> None:
    other_device = _open_any()
    try:
        mine = device.create_timeline_semaphore()
        theirs = other_device.create_timeline_semaphore()
        with pytest.raises(DeviceMismatchError):
            mine.submit_wait(1, then_signal=theirs, then_signal_value=1)
    finally:
        other_device.close()


def test_export_needs_support(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    if device._state.exportable:
        fd = sem.export_fd()
        assert fd >= 0
        os.close(fd)
    else:
        with pytest.raises(VulkanUnavailableError, match="without semaphore export"):
            sem.export_fd()


def test_use_after_close(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    sem.close()
    sem.close()
    assert sem.closed
    for use in (
        lambda: sem.value,
        lambda: sem.signal(1),
        lambda: sem.block_until(0),
        lambda: sem.submit_signal(1),
        lambda: sem.submit_wait(1),
        lambda: sem.export_fd(),
    ):
        with pytest.raises(anyio.ClosedResourceError):
            use()
    live = device.create_timeline_semaphore()
    with pytest.raises(anyio.ClosedResourceError):
        live.submit_wait(1, then_signal=sem, then_signal_value=1)


def test_device_close_closes_everything() -> None:
    with _open_any() as device:
        sem = device.create_timeline_semaphore()
        state = device._state
    assert device.closed
    assert state.destroyed
    assert sem.closed
    device.close()
    with pytest.raises(anyio.ClosedResourceError):
        device.create_timeline_semaphore()
    with pytest.raises(anyio.ClosedResourceError):
        device.create_binary_semaphore()
    with pytest.raises(anyio.ClosedResourceError):
        device.block_until_idle()
    with pytest.raises(anyio.ClosedResourceError):
        sem.signal(1)
    sem.close()


def test_close_during_host_wait_is_deferred(device: VulkanDevice) -> None:
    sem = device.create_timeline_semaphore()
    state = sem._state
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(sem.block_until(1, timeout=0.3)))
    waiter.start()
    time.sleep(0.05)
    sem.close()
    assert not state.destroyed  # still waited on
    waiter.join(10)
    assert results == [False]
    assert state.destroyed


def test_device_close_during_host_wait_is_deferred() -> None:
    device = _open_any()
    sem = device.create_timeline_semaphore()
    state = device._state
    waiter = threading.Thread(target=lambda: sem.block_until(1, timeout=0.3))
    waiter.start()
    time.sleep(0.05)
    device.close()
    assert device.closed
    assert not state.destroyed
    waiter.join(10)
    assert state.destroyed


def test_semaphore_in_pending_batch_outlives_close(device: VulkanDevice) -> None:
    gate = device.create_timeline_semaphore()
    target = device.create_timeline_semaphore()
    gate.submit_wait(1, then_signal=target, then_signal_value=1)
    target.close()
    assert not target._state.destroyed  # the queued batch still signals it
    gate.signal(1)
    device.block_until_idle()
    device.create_binary_semaphore()  # any later call reclaims it
    assert target._state.destroyed


def test_close_with_stuck_queue_leaks_with_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_state, "_CLOSE_DRAIN_TIMEOUT_S", 0.1)
    device = _open_any()
    sem = device.create_timeline_semaphore()
    sem.submit_wait(1)  # nobody will signal it
    with pytest.warns(ResourceWarning, match="leaked"):
        device.close()
    assert device.closed
    assert sem.closed


def test_garbage_collected_objects_are_destroyed() -> None:
    device = _open_any()
    state = device._state
    sem = device.create_timeline_semaphore()
    sem_state = sem._state
    del sem
    gc.collect()
    assert sem_state.destroyed
    del device
    gc.collect()
    assert state.destroyed
