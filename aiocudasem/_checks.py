"""Checks of arguments that many entry points share: a driver, a device ordinal, a uint, an
fd."""

from __future__ import annotations

import os

from . import _release
from ._driver import Driver, get_driver

__all__ = (
    "check_device",
    "check_open_fd",
    "check_ordinal",
    "check_uint",
    "resolve_device",
    "resolve_driver",
)


def resolve_driver(driver: Driver | str | None) -> Driver:
    """``None`` or a name through :func:`get_driver`; a driver object as it is."""
    if driver is None or isinstance(driver, str):
        return get_driver(driver)
    if not isinstance(driver, Driver):
        raise TypeError(f"driver must be 'cuda', 'sim', None or a driver object, not {driver!r}")
    return driver


def check_ordinal(device: object) -> int:
    """``device`` as a device ordinal: ``TypeError`` for anything but an int (a bool
    included)."""
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"device must be an int ordinal, not {type(device).__name__}")
    return device


def check_device(driver: Driver, device: int) -> None:
    """``ValueError`` unless ``driver`` has a device ``device``."""
    count = driver.device_count()
    if not 0 <= device < count:
        raise ValueError(f"device {device} does not exist: {count} device(s)")


def check_uint(name: str, value: object, bound: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value < bound:
        raise ValueError(f"{name} must be in [0, 2**{bound.bit_length() - 1}), got {value}")
    return value


def check_open_fd(fd: object) -> tuple[int, os.stat_result]:
    """``fd`` as an open file descriptor, with its ``fstat()``: ``TypeError`` for anything but
    an int (a bool included), ``ValueError`` outside [0, 2**31) or for an fd that is not open."""
    if isinstance(fd, bool) or not isinstance(fd, int):
        raise TypeError(f"fd must be an int file descriptor, not {type(fd).__name__}")
    if not 0 <= fd < 1 << 31:
        raise ValueError(f"fd must be in [0, 2**31), got {fd}")
    try:
        return fd, os.fstat(fd)
    except OSError as exc:
        raise ValueError(f"fd {fd} is not an open file descriptor: {exc.strerror}") from None


def resolve_device(device: object, driver: Driver | str | None) -> tuple[Driver, int]:
    """The driver and device ordinal that a call which creates something on a device is given:
    ``TypeError``/``ValueError`` for a bad ordinal or one the driver lacks. Releases what
    finalizers deferred first, as every entry point that creates does."""
    ordinal = check_ordinal(device)
    if ordinal < 0:
        raise ValueError(f"device must be an ordinal >= 0, not {ordinal}")
    drv = resolve_driver(driver)
    _release.flush()
    check_device(drv, ordinal)
    return drv, ordinal
