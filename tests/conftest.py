"""Shared fixtures: every async test runs on asyncio, asyncio+uvloop and trio."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from aiocudasem.testing import SimDriver

_BACKENDS: list[Any] = [
    pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="asyncio+uvloop"),
    pytest.param(("trio", {}), id="trio"),
]


@pytest.fixture(params=_BACKENDS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(autouse=True)
def _unlocked_watchdog() -> Iterator[None]:
    """anyio's wait_all_tasks_blocked() on asyncio re-samples every 100 ms and waits while any
    task is runnable; a parked drainer's watchdog wakes every 50 ms by default, and the two can
    stay in phase for seconds. A period with no small common multiple with 100 ms avoids that."""
    import aiocudasem

    aiocudasem.configure(watchdog=0.0371)
    yield
    aiocudasem.configure(watchdog=aiocudasem.Tuning().watchdog)


@pytest.fixture
def sim() -> Iterator[SimDriver]:
    """A fresh simulated machine with two devices."""
    drv = SimDriver(devices=2)
    yield drv
    gc.collect()


def open_fds() -> set[int]:
    """The process's open fds, without the transient one that lists them."""
    return {int(n) for n in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{n}")}


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
