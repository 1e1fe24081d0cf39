"""The low-level layer: the device seam and the notifier's knobs.

Most programs need only the top level (:mod:`aiocudasem`). This module is for code that drives
the library from underneath: a custom or wrapped driver, benchmarks, tuning of the wait strategy,
and monitoring.

- :class:`Driver` is the device seam, a small synchronous Protocol on ``int`` handles;
  :class:`SemaphoreDesc` and :class:`SemOp` are what its semaphore calls take, and
  :func:`get_driver` returns the process-wide ``cuda`` or ``sim`` driver.
- :class:`Tuning` and :func:`configure` set the wait strategy for the whole process.
- :func:`statistics` returns a frozen :class:`Statistics`: the running loop's notifier and
  the process-wide pools and threads, for monitoring and tests.
- :data:`HOST_FUNCTION` is the address of the notifier's C host function (a ``CUhostFn``
  that never takes the GIL), for diagnostics.
"""

from __future__ import annotations

from ._driver import DRIVER_ENV as DRIVER_ENV
from ._driver import Driver as Driver
from ._driver import SemaphoreDesc as SemaphoreDesc
from ._driver import SemOp as SemOp
from ._driver import get_driver as get_driver
from ._handles import HANDLE_TYPES as HANDLE_TYPES
from ._handles import HandleInfo as HandleInfo
from ._notifier import Statistics as Statistics
from ._notifier import Tuning as Tuning
from ._notifier import configure as configure
from ._notifier import statistics as statistics
from ._notify import HOST_FN

#: The address of the C host function that reports completions to the event loop.
HOST_FUNCTION: int = HOST_FN

__all__ = (
    "DRIVER_ENV",
    "HOST_FUNCTION",
    "HANDLE_TYPES",
    "Driver",
    "HandleInfo",
    "SemOp",
    "SemaphoreDesc",
    "Statistics",
    "Tuning",
    "configure",
    "get_driver",
    "statistics",
)
