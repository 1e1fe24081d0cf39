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
- :data:`HOST_FUNCTION` and :class:`HostNotifier` are the notifier's C core, for code that
  launches host functions itself: ``user_data = notifier.arm(token)``, then
  ``driver.launch_host_func(stream, HOST_FUNCTION, user_data)`` (``disarm(user_data)`` if that
  launch fails). The host function never takes the GIL and never calls CUDA: it appends
  ``token`` to the notifier's queue and makes ``fileno()`` readable (one write per burst);
  ``drain()`` returns the tokens that came back. ``close()`` closes the fd at once and is safe
  with host functions still outstanding. One per event loop; the library's own waits use
  their own.
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
from ._notify import Notifier as HostNotifier

#: The address of the C host function that reports completions to the event loop.
HOST_FUNCTION: int = HOST_FN

__all__ = (
    "DRIVER_ENV",
    "HOST_FUNCTION",
    "HostNotifier",
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
