"""The library's log records, on the ``aiocudasem`` logger, and the process-wide counts behind
them that :func:`aiocudasem.lowlevel.statistics` reports.

Four things are logged, each where it happens:

- a **device fault**: ERROR, once per device of a driver, when the fault watchdog or a wait
  (a query of its point, or the launch of its host function) finds the device's context in a
  sticky error. A ``DeviceFaultError`` that an enqueue or a record raises straight to its
  caller is the caller's to report, and is not logged here;
- a **leak**: WARNING, when the release of a stream or semaphore collected without
  ``close()`` or ``aclose()`` runs (at the library's next use, not inside the collector), and
  when releasing an object fails;
- **a slow close**: WARNING, when ``aclose()`` of a stream, an external semaphore or a host
  timeline has waited :data:`CLOSE_WARNING_S` seconds for the device (a wait whose producer is
  gone blocks it for ever): the message names the waits it is probably stuck behind and the
  way out (``abandon()``, or ``close()`` without waiting);
- **lazy loading**: WARNING, once per process, when the first semaphore wait is enqueued on
  the real driver while CUDA loads modules lazily, and when a kernel could not be loaded
  ahead of a device's first wait.

The logger has only a ``NullHandler``, as a library's should: an application sees the records
once it configures logging (``logging.basicConfig()`` is enough). Importing this module
imports nothing else from the library.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Final

__all__ = (
    "CLOSE_WARNING_S",
    "device_fault",
    "faults_seen",
    "lazy_loading",
    "leaked",
    "leaks",
    "logger",
    "slow_close",
)

logger: Final = logging.getLogger("aiocudasem")
logger.addHandler(logging.NullHandler())

_lock = threading.Lock()
#: How long ``aclose()`` waits for the device before it logs a WARNING (and goes on waiting).
CLOSE_WARNING_S = 5.0
# The devices of each driver already reported, and how many in all (drivers come and go).
_faulted: weakref.WeakKeyDictionary[object, set[int]] = weakref.WeakKeyDictionary()
_faults = 0
_leaks = 0
_lazy_reported = False


def device_fault(driver: object, device: int, error: BaseException) -> None:
    """Log that ``device`` of ``driver`` is in a sticky error, once per device of a driver."""
    global _faults
    with _lock:
        devices = _faulted.setdefault(driver, set())
        if device in devices:
            return
        devices.add(device)
        _faults += 1
    name = getattr(driver, "name", type(driver).__name__)
    logger.error(
        "device %d of the %s driver faulted: %s; waits on it fail with DeviceFaultError, and "
        "its context cannot be used again in this process",
        device,
        name,
        error,
    )


def faults_seen() -> int:
    """How many devices (per driver) the library has seen fault in this process."""
    with _lock:
        return _faults


def leaked(what: str) -> None:
    """Log (and count) ``what``, an object collected while still open, when its release runs:
    never from a finalizer (see ``_release``)."""
    global _leaks
    with _lock:
        _leaks += 1
    logger.warning("%s was collected without close() or aclose(); it is released now", what)


def slow_close(what: str, waited: float, stuck: str, way_out: str) -> None:
    """Log that ``aclose()`` of ``what`` has waited ``waited`` seconds for the device."""
    logger.warning(
        "closing %s has waited %.1f s for the device and goes on waiting%s. %s",
        what,
        waited,
        stuck,
        way_out,
    )


def leaks() -> int:
    """How many streams and semaphores were collected while still open in this process."""
    with _lock:
        return _leaks


def lazy_loading() -> None:
    """Log, once per process, that CUDA loads modules lazily while semaphore waits are used."""
    global _lazy_reported
    with _lock:
        if _lazy_reported:
            return
        _lazy_reported = True
    logger.warning(
        "CUDA loads modules lazily (CUDA_MODULE_LOADING=LAZY, the default): a kernel launched "
        "for the first time while a semaphore wait is pending on the device can deadlock until "
        "the wait completes; load each kernel before its first hand-off, or set "
        "CUDA_MODULE_LOADING=EAGER (see docs/lazy-loading.md)"
    )


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)
