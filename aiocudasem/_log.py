"""The library's log records, on the ``aiocudasem`` logger, and the process-wide counts behind
them that :func:`aiocudasem.lowlevel.statistics` reports.

Three things are logged, each where it happens:

- a **device fault**: ERROR, once per device of a driver, when the fault watchdog or a wait
  (a query of its point, or the launch of its host function) finds the device's context in a
  sticky error. A ``DeviceFaultError`` that an enqueue or a record raises straight to its
  caller is the caller's to report, and is not logged here;
- a **leak**: WARNING, when the release of a stream or semaphore collected without
  ``close()`` or ``aclose()`` runs (at the library's next use, not inside the collector), and
  when releasing an object fails;
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

__all__ = ("device_fault", "faults_seen", "lazy_loading", "leaked", "leaks", "logger")

logger: Final = logging.getLogger("aiocudasem")
logger.addHandler(logging.NullHandler())

_lock = threading.Lock()
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
