"""Log records on the ``aiocudasem`` logger: device faults (once per device), leaks, and the
lazy-loading advice of the real driver (on a stand-in for its bindings here)."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _log
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aiocudasem" and r.levelno == level]


@pytest.mark.anyio
async def test_a_device_fault_is_logged_once_per_device(
    sim: SimDriver, fault_watchdog: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiocudasem")
    doomed = acs.open_stream(1, driver=sim)
    hold(doomed)
    async with anyio.create_task_group() as tg:

        async def victim() -> None:
            with pytest.raises(acs.DeviceFaultError):
                await doomed.wait_complete()

        for _ in range(5):
            tg.start_soon(victim)
        await anyio.wait_all_tasks_blocked()
        sim.inject_fault(1)
    with pytest.raises(acs.DeviceFaultError):
        await doomed.aclose()
    errors = _records(caplog, logging.ERROR)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "device 1 of the sim driver faulted" in errors[0].getMessage()
    assert "DeviceFaultError" in errors[0].getMessage()


@pytest.mark.anyio
async def test_a_leaked_stream_is_logged_and_counted(
    sim: SimDriver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="aiocudasem")
    before = statistics().leaked
    stream = acs.open_stream(driver=sim)
    with pytest.warns(ResourceWarning, match="collected without close"):
        del stream
        gc.collect()
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "aiocudasem.Stream" in warnings[0].getMessage()
    assert "collected without close() or aclose()" in warnings[0].getMessage()
    assert statistics().leaked == before + 1


def test_the_logger_is_silent_until_the_application_configures_logging() -> None:
    """A library adds no handler but a NullHandler: an unconfigured program prints nothing,
    one that calls logging.basicConfig() sees the records."""
    code = (
        "import gc, warnings, aiocudasem as acs\n"
        "from aiocudasem.testing import SimDriver\n"
        "warnings.simplefilter('ignore')\n"
        "{setup}"
        "s = acs.open_stream(driver=SimDriver())\n"
        "del s; gc.collect()\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", code.format(setup="")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert quiet.stderr == ""
    loud = subprocess.run(
        [sys.executable, "-c", code.format(setup="import logging; logging.basicConfig()\n")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "WARNING:aiocudasem:aiocudasem.Stream" in loud.stderr


def test_lazy_loading_is_logged_once_at_the_first_wait(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.bindings._v2.driver")
    from aiocudasem.lowlevel import SemOp
    from tests.test_cuda_driver_cpu import _Bindings, _driver

    class Lazy(_Bindings):
        def module_get_loading_mode(self) -> int:
            return 2  # CU_MODULE_LAZY_LOADING

    caplog.set_level(logging.WARNING, logger="aiocudasem")
    monkeypatch.setattr(_log, "_lazy_reported", False)
    for _ in range(2):  # two drivers: still once per process
        drv = _driver(Lazy(library_fails=False))
        drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
        drv.enqueue_semaphore_waits([SemOp(1, value=2)], 0x5)
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "CUDA_MODULE_LOADING=EAGER" in warnings[0].getMessage()


def test_eager_loading_logs_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.bindings._v2.driver")
    from aiocudasem.lowlevel import SemOp
    from tests.test_cuda_driver_cpu import _Bindings, _driver

    class Eager(_Bindings):
        def module_get_loading_mode(self) -> int:
            return 1  # CU_MODULE_EAGER_LOADING

    caplog.set_level(logging.WARNING, logger="aiocudasem")
    monkeypatch.setattr(_log, "_lazy_reported", False)
    _driver(Eager(library_fails=False)).enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    assert _records(caplog, logging.WARNING) == []


def test_a_kernel_that_cannot_load_ahead_of_the_first_wait_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.bindings._v2.driver")
    from aiocudasem.lowlevel import SemOp
    from aiocudasem.testing import workloads
    from tests.test_cuda_driver_cpu import _Bindings, _driver

    class Eager(_Bindings):
        def module_get_loading_mode(self) -> int:
            return 1

    caplog.set_level(logging.WARNING, logger="aiocudasem")
    drv = _driver(Eager(library_fails=True))
    workloads(drv)
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)  # the wait itself goes ahead
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "ahead of device 0's first semaphore wait failed" in warnings[0].getMessage()
