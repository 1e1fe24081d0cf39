"""Shared fixtures: every async test runs on asyncio, asyncio+uvloop and trio."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold

if TYPE_CHECKING:
    from aiocudasem import Driver

_BACKENDS: list[Any] = [
    pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="asyncio+uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(autouse=True)
def _watchdog_off() -> Iterator[None]:
    """The watchdog detects device faults; it must never be how an ordinary completion is
    noticed. The suite therefore runs with it effectively off (a 60 s period), so that a wake-up
    that secretly waited for it times the test out. Tests of fault detection use
    ``fault_watchdog``."""
    import aiocudasem

    aiocudasem.configure(watchdog=60.0)
    yield
    aiocudasem.configure(watchdog=aiocudasem.Tuning().watchdog)


@pytest.fixture
def fault_watchdog() -> float:
    """The default watchdog period, for tests that inject device faults (``_watchdog_off``, an
    autouse fixture, is set up first and restores the default afterwards)."""
    import aiocudasem

    period = aiocudasem.Tuning().watchdog
    aiocudasem.configure(watchdog=period)
    return period


@pytest.fixture
def sim() -> Iterator[SimDriver]:
    """A fresh simulated machine with two devices."""
    drv = SimDriver(devices=2)
    yield drv
    gc.collect()


def open_fds() -> set[int]:
    """The process's open fds, without the transient one that lists them."""
    return {int(n) for n in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{n}")}


def fd_targets(fds: set[int]) -> dict[int, str]:
    """What each fd points at, for assertion messages."""
    out = {}
    for fd in sorted(fds):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            out[fd] = "?"
    return out


def watchdog_events(driver: Driver) -> set[int]:
    """The events that the fault watchdog's threads hold on ``driver``'s devices."""
    from aiocudasem._notifier._watchdog import _watchdog

    with _watchdog._lock:
        sentries = list(_watchdog._sentries.get(driver, {}).values())
    return {s.event for s in sentries if s.event is not None}


@pytest.fixture
def parked() -> Iterator[None]:
    """Spinning off: every wait parks on the notifier."""
    import aiocudasem

    aiocudasem.configure(spin_limit=0)
    yield
    aiocudasem.configure(spin_limit=aiocudasem.Tuning().spin_limit)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from aiocudasem import DriverUnavailableError, get_driver

    try:
        get_driver("cuda")
    except DriverUnavailableError as exc:
        skip = pytest.mark.skip(reason=f"no usable CUDA GPU here: {exc}")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


async def fault_parked_waiters(sim: SimDriver, device: int, waiters: int) -> acs.Stream:
    """Park ``waiters`` coroutines on a stream of ``device`` whose work never ends by itself,
    fault the device, and return once each of them got ``DeviceFaultError``. Returns the
    stream, still open: its ``aclose()`` raises ``DeviceFaultError``."""
    doomed = acs.open_stream(device, driver=sim)
    hold(doomed)

    async def victim() -> None:
        with pytest.raises(acs.DeviceFaultError):
            await doomed.wait_complete()

    async with anyio.create_task_group() as tg:
        for _ in range(waiters):
            tg.start_soon(victim)
        await anyio.wait_all_tasks_blocked()
        sim.inject_fault(device)
    return doomed


async def until_parked() -> None:
    """Return once a coroutine of this process is parked (``statistics().parked``); fail
    after 5 s."""
    from aiocudasem.lowlevel import statistics

    with anyio.fail_after(5):
        while statistics().parked == 0:
            await anyio.sleep(0.001)


def wait_for_child(pid: int, timeout: float) -> int:
    """The exit code of forked child ``pid``; kill it and fail the test if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {timeout} s")


class StallWatch:
    """Measures how long the whole process stood still, for tests that bound how promptly
    something happens. A thread sleeps 1 ms at a time and keeps the longest gap between its
    wake-ups: a garbage collection, another thread holding the GIL or a host that stops the
    process for a while shows up there. A bound of ``limit + watch.stall`` then fails on the
    library's own delays, not on a stall of the machine that the library cannot help."""

    def __init__(self) -> None:
        self.stall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(0.001):
            now = time.perf_counter()
            self.stall = max(self.stall, now - last - 0.001)
            last = now

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
