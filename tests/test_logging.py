"""Log records on the ``aiocudasem`` logger: device faults (once per device), leaks, and the
lazy-loading advice of the real driver (on a stand-in for its bindings here)."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _log
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold
from tests.conftest import fault_parked_waiters


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "aiocudasem" and r.levelno == level]


@pytest.mark.anyio
async def test_a_device_fault_is_logged_once_per_device(
    sim: SimDriver, fault_watchdog: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiocudasem")
    doomed = await fault_parked_waiters(sim, 1, 5)
    with pytest.raises(acs.DeviceFaultError):
        await doomed.aclose()
    # The watchdog logs after it has woken the loop: the record may come a moment later.
    with anyio.fail_after(5):
        while not _records(caplog, logging.ERROR):
            await anyio.sleep(0.01)
    await anyio.sleep(0.1)  # and only one comes
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
    # Logged when the release runs, at the library's next use: never inside the collector.
    assert _records(caplog, logging.WARNING) == []
    acs.open_stream(driver=sim).close()
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "aiocudasem.Stream" in warnings[0].getMessage()
    assert "collected without close() or aclose()" in warnings[0].getMessage()
    assert statistics().leaked == before + 1


def test_a_collection_inside_the_logging_lock_cannot_deadlock() -> None:
    """A leaked stream in a reference cycle, collected by a pass that runs while the library
    holds its log lock: the finalizer must take no lock (it only queues the release)."""
    code = """
import faulthandler, gc, warnings
faulthandler.dump_traceback_later(20, exit=True)
warnings.simplefilter("ignore")
import aiocudasem
from aiocudasem import _log
from aiocudasem.testing import SimDriver

class D:
    name = "stand-in"

drv = SimDriver()
gc.disable(); gc.collect()
s = aiocudasem.open_stream(driver=drv)
keep = [s]; keep.append(keep); del s
gc.collect(0)  # the cycle moves to generation 1
del keep  # garbage, found by the next generation-1 pass
gc.set_threshold(1, 1); gc.enable()
_log.device_fault(D(), 0, RuntimeError("boom"))  # allocates while holding the lock
gc.disable()
aiocudasem.open_stream(driver=drv).close()  # the library's next use releases and logs it
print("leaks", _log.leaks())
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "leaks 1", proc.stdout + proc.stderr


@pytest.mark.anyio
async def test_a_slow_log_handler_does_not_delay_the_fault_wake_up(
    sim: SimDriver, fault_watchdog: float
) -> None:
    """The watchdog wakes the parked loops before it logs the fault."""

    class Slow(logging.Handler):
        """Slow in the watchdog's thread only: a handler run by the event loop's own thread
        (the loop may see the fault first) holds up that loop, as any handler there does."""

        def emit(self, record: logging.LogRecord) -> None:
            if threading.current_thread().name.startswith("aiocudasem-watchdog"):
                time.sleep(1.0)

    slow = Slow()
    logging.getLogger("aiocudasem").addHandler(slow)
    try:
        doomed = acs.open_stream(1, driver=sim)
        hold(doomed)
        took: list[float] = []

        async def victim() -> None:
            with pytest.raises(acs.DeviceFaultError):
                await doomed.wait_complete()
            took.append(time.perf_counter() - t0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await anyio.wait_all_tasks_blocked()
            t0 = time.perf_counter()
            sim.inject_fault(1)
        with pytest.raises(acs.DeviceFaultError):
            await doomed.aclose()
    finally:
        logging.getLogger("aiocudasem").removeHandler(slow)
    assert took[0] < 0.9, f"the waiter woke {took[0]:.2f} s after the fault"


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


@pytest.mark.anyio
async def test_a_fault_that_an_await_finds_by_its_query_is_logged_once(
    sim: SimDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """An await of a stream that finds the device faulted by its first query (no point, no
    watchdog involved) logs the fault as the notifier does: once per device."""
    caplog.set_level(logging.INFO, logger="aiocudasem")
    before = statistics().faults_seen
    stream = acs.open_stream(driver=sim)
    sim.inject_fault(0)
    for _ in range(3):
        with pytest.raises(acs.DeviceFaultError):
            await stream.wait_complete()
    errors = _records(caplog, logging.ERROR)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "device 0 of the sim driver faulted" in errors[0].getMessage()
    assert statistics().faults_seen == before + 1
    stream.close()
