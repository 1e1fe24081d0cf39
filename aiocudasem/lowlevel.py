"""The low-level layer: the device seam and the notifier's knobs.

Most programs need only the top level (:mod:`aiocudasem`). This module is for code that drives
the library from underneath: a custom or wrapped driver, benchmarks, tuning of the wait strategy,
and monitoring.

- :class:`Driver` is the device seam, a small synchronous Protocol on ``int`` handles;
  :class:`SemaphoreDesc` and :class:`SemOp` are what its semaphore calls take, and
  :func:`get_driver` returns the process-wide ``cuda`` or ``sim`` driver.
- :class:`Tuning` and :func:`configure` set the wait strategy for the whole process.
"""

from __future__ import annotations

from ._driver import DRIVER_ENV as DRIVER_ENV
from ._driver import Driver as Driver
from ._driver import SemaphoreDesc as SemaphoreDesc
from ._driver import SemOp as SemOp
from ._driver import get_driver as get_driver
from ._handles import HANDLE_TYPES as HANDLE_TYPES
from ._handles import HandleInfo as HandleInfo
from ._notifier import Tuning as Tuning
from ._notifier import configure as configure

__all__ = (
    "DRIVER_ENV",
    "HANDLE_TYPES",
    "Driver",
    "HandleInfo",
    "SemOp",
    "SemaphoreDesc",
    "Tuning",
    "configure",
    "get_driver",
)
