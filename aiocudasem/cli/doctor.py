"""``aiocudasem doctor``: what this machine offers, and any problem in its configuration."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import time

import anyio

from .. import (
    DRIVER_ENV,
    AiocudasemError,
    Driver,
    DriverUnavailableError,
    UnsupportedFeatureError,
    create_host_timeline,
    get_driver,
    open_stream,
)
from ..lowlevel import HOST_FUNCTION, Statistics, statistics
from ..testing import SimDriver
from ._common import DRIVERS, bad_env_message

#: What ``doctor`` advises under lazy module loading, CUDA's default.
LAZY_LOADING_HINT = (
    "hand-offs: launch or load each kernel once before its first hand-off, or set "
    "CUDA_MODULE_LOADING=EAGER; see docs/lazy-loading.md"
)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    """Print the report. Returns 1 if it finds a problem in the configuration (an invalid
    ``$AIOCUDASEM_DRIVER``), which it also names on standard error, else 0: a machine without a
    GPU or without Vulkan is reported, not a problem."""
    print(f"python {sys.version.split()[0]} on {sys.platform}")
    for dist in ("aiocudasem", "cuda-bindings", "anyio", "numpy", "trio", "uvloop"):
        print(f"{dist:>14}: {_version(dist)}")
    print(f"{'notifier':>14}: C extension loaded, host function at {HOST_FUNCTION:#x}")
    uuid = None
    drv = None
    try:
        drv = get_driver("cuda")
        for i in range(drv.device_count()):
            u = drv.device_uuid(i)
            uuid = uuid or u
            print(f"{'cuda':>14}: device {i}: {drv.device_name(i)} (UUID {u.hex()})")
    except DriverUnavailableError as exc:
        # The reason alone: the library's message says how to pick the simulated device in
        # Python, and the "default" line below says it for the command line too.
        print(f"{'cuda':>14}: unavailable: {exc.reason}")
    except AiocudasemError as exc:
        print(f"{'cuda':>14}: unavailable: {exc}")
    if drv is not None:
        _print_loading_mode(drv)
        _print_host_timeline(drv)
    try:
        from ..vulkan import VulkanDevice

        with VulkanDevice.open(uuid=uuid) as vk:
            print(f"{'vulkan':>14}: {vk.name} (UUID {vk.uuid.hex()})")
    except AiocudasemError as exc:
        print(f"{'vulkan':>14}: unavailable: {exc}")
    problem = _print_default()
    # The real GPU when there is one, else a simulated machine of the check's own.
    check = _self_check(drv if isinstance(drv, Driver) else SimDriver())
    problem = problem or check
    if problem is None:
        return 0
    print(f"aiocudasem doctor: problem: {problem}", file=sys.stderr)
    return 1


def _print_default() -> str | None:
    """The default driver's line; returns the problem with ``$AIOCUDASEM_DRIVER``, if any."""
    sim = "the simulated device is --driver sim (driver='sim' in Python)"
    raw = os.environ.get(DRIVER_ENV, "")
    value = raw.strip()
    if not value:
        print(f"{'default':>14}: cuda (${DRIVER_ENV} is not set); {sim}")
        return None
    if value in DRIVERS:
        print(f"{'default':>14}: {value} ({DRIVER_ENV}={value}); {sim}")
        return None
    problem = f"{bad_env_message(raw, flag=False)}. Until then, library calls without driver= fail"
    print(f"{'default':>14}: PROBLEM: {problem}")
    return problem


def _print_loading_mode(drv: object) -> None:
    # Only the real driver has a loading mode; it is not part of the Driver protocol.
    query = getattr(drv, "module_loading_mode", None)
    if query is None:
        return
    try:
        mode = str(query())
    except AiocudasemError as exc:
        print(f"{'module loading':>14}: unknown: {exc}")
        return
    setting = os.environ.get("CUDA_MODULE_LOADING")
    source = f"CUDA_MODULE_LOADING={setting}" if setting else "CUDA's default"
    print(f"{'module loading':>14}: {mode} ({source})")
    if mode == "lazy":
        print(f"{'':>14}  {LAZY_LOADING_HINT}")


class _Collect(logging.Handler):
    """Keeps the library's log records of the self-check, to print them in the report."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


#: The library's logger (``aiocudasem._log``), by its public name.
logger = logging.getLogger("aiocudasem")


def _print_host_timeline(drv: object) -> None:
    """Whether device 0 can have host timelines: one is created and released."""
    if not isinstance(drv, Driver):
        return
    try:
        timeline = create_host_timeline(driver=drv)
    except UnsupportedFeatureError as exc:
        print(f"{'host timeline':>14}: unavailable on device 0: {exc}")
        return
    except Exception as exc:  # a report, never a traceback
        print(f"{'host timeline':>14}: unknown: creating one failed: {exc!r}")
        return
    timeline.close()
    print(
        f"{'host timeline':>14}: supported on device 0 (64-bit stream memory operations on "
        "mapped host memory)"
    )


def _self_check(drv: Driver) -> str | None:
    """Wait for one point of a new stream through the notifier, on ``drv`` (the real GPU when
    there is one, else the simulated device), and print the statistics seen from inside the
    loop and the library's log records meanwhile. Returns the problem, if the wait failed."""

    async def one_wait() -> tuple[float, Statistics]:
        async with open_stream(driver=drv) as stream:
            event = stream.record()
            t0 = time.perf_counter()
            with anyio.fail_after(10):
                await event.wait()
            took = time.perf_counter() - t0
            event.close()
            return took, statistics()

    collect = _Collect()
    logger.addHandler(collect)
    try:
        took, stats = anyio.run(one_wait)
    except Exception as exc:
        problem = f"a wait on the {drv.name} driver failed: {exc!r}"
        print(f"{'self-check':>14}: PROBLEM: {problem}")
        return problem
    finally:
        logger.removeHandler(collect)
    how = (
        "a host function woke the loop"
        if stats.fired
        else "its first queries found the work complete, no host function needed"
    )
    print(
        f"{'self-check':>14}: a wait on the {drv.name} driver completed in "
        f"{took * 1e6:.0f} us ({how})"
    )
    print(
        f"{'statistics':>14}: in that loop: completed {stats.completed}, faulted "
        f"{stats.faulted}, parked {stats.parked}, spinning {stats.spinning}, pending "
        f"{stats.pending}; in this process: notifiers {stats.notifiers}, side streams "
        f"{stats.side_streams}, pooled events {stats.pooled_events}, watchdog threads "
        f"{stats.watchdog_threads}, faults seen {stats.faults_seen}, leaked {stats.leaked}"
    )
    for line in collect.lines:
        print(f"{'log':>14}: {line}")
    configured = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    root = logging.getLogger().handlers
    where = (
        "handled by the application"
        if configured or root
        else "no handler configured: records are dropped until logging is configured, "
        "for example with logging.basicConfig()"
    )
    level = logging.getLevelName(logger.getEffectiveLevel())
    print(f"{'logging':>14}: logger 'aiocudasem', level {level}; {where}")
    return None
