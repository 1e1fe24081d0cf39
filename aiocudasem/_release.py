"""Releasing a driver object from ``aclose()`` or from its ``weakref.finalize`` safety net.

A finalizer runs inside the garbage collector, in whichever thread happened to allocate, and
that thread may be holding a lock the release needs: the simulated device's lock while it
allocates, the side-stream table's lock, a driver's own. Calling the driver from there can
deadlock. So a finalizer only queues the release (``deque.append`` takes no lock that Python
code can hold), and :func:`flush` runs the queue at safe points: when the library is next
entered (a stream or semaphore is created, a wait starts), from a fault watchdog thread each
time it looks for parked work, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import Final

import anyio
import anyio.lowlevel

from . import _log
from ._errors import AiocudasemError, DeviceFaultError, DriverUnavailableError
from ._loopcall import call_soon

__all__ = (
    "collected",
    "defer",
    "flush",
    "in_thread",
    "in_worker",
    "now",
    "pending",
    "release_quietly",
)

# (release, what it releases, whether it was leaked: collected while still open)
_deferred: deque[tuple[Callable[[], None], str, bool]] = deque()


def now(destroy: Callable[[], None]) -> None:
    """Release now (``close()``, ``aclose()``): a device fault is no error (the faulted context
    took the object with it); other failures raise."""
    _run(destroy, "", collected=False)


def collected(
    destroy: Callable[[], None], what: str, *, warn: bool = True, inline: bool = False
) -> None:
    """From a finalizer: queue the release for :func:`flush` (``inline``: release now, for a
    release that takes no lock that Python code can hold) and, if ``warn``, warn with a
    ``ResourceWarning``. The queueing comes first, so that warnings-as-errors cannot skip the
    release. The leak is logged (and counted) by :func:`flush`, not here: a finalizer may run
    inside any allocation, even one made while the logging module or a handler holds a lock,
    so it calls no handler and takes no lock."""
    _collected(destroy, what, warn=warn, inline=inline)


def _collected(destroy: Callable[[], None], what: str, *, warn: bool, inline: bool) -> None:
    later = "it is released at the library's next use"
    if inline:
        try:
            destroy()
        except Exception:  # flush() tries again, and reports a second failure
            pass
        else:
            destroy, later = _nothing, "it was released"
    if warn or destroy is not _nothing:
        _deferred.append((destroy, what, warn))
    if warn:
        warnings.warn(
            f"{what} was collected without close() or aclose(); {later}",
            ResourceWarning,
            stacklevel=3,
        )


def _nothing() -> None:
    pass


def defer(destroy: Callable[[], None], what: str) -> None:
    """From a finalizer of an object that may be left to the collector (an Event): queue its
    release for :func:`flush`, without a warning."""
    _collected(destroy, what, warn=False, inline=False)


def pending() -> int:
    """How many collected objects wait for :func:`flush`."""
    return len(_deferred)


def flush() -> None:
    """Release what finalizers queued, logging each leaked object first. Never raises:
    failures become ``RuntimeWarning``."""
    while True:
        try:
            destroy, what, leaked = _deferred.popleft()
        except IndexError:
            return
        try:
            if leaked:
                _log.leaked(what)
            release_quietly(destroy, what)
        except Exception as exc:  # a warning turned into an error must not stop the queue
            del exc


def release_quietly(destroy: Callable[[], None], what: str) -> None:
    """Release as a finalizer must: a faulted context or a parent's driver after fork() is
    not an error, and other failures become ``RuntimeWarning``."""
    _run(destroy, what, collected=True)


def in_thread(destroy: Callable[[], None], what: str) -> None:
    """Release in a thread of its own, quietly (:func:`release_quietly`), without waiting: for
    a release that can block on the device (destroying a semaphore, unregistering a page)."""
    threading.Thread(
        target=release_quietly,
        args=(destroy, what),
        name="aiocudasem-release",
        daemon=True,
    ).start()


_WAY_OUT: Final = (
    "If its producer is gone, call abandon() on it (the streams that wait on it then go on); "
    "to release it without waiting, call close()."
)


async def in_worker(destroy: Callable[[], None], what: str, abandoned: Callable[[], None]) -> None:
    """``aclose()``'s release of an object whose release can block on the device: run
    ``destroy`` in a daemon thread of its own and wait for it without blocking the event loop,
    logging a slow close after ``CLOSE_WARNING_S``.
    Exactly one of the thread and the cancellation path releases: if the wait is cancelled
    before the thread has started, ``abandoned()`` releases instead (without waiting), so
    nothing leaks. A failure of the release is raised here, or logged once nobody waits.

    Not a worker thread of anyio: on asyncio those are not daemon threads, and one left blocked
    on the device by a cancelled wait kept the interpreter from exiting. The thread tells the
    loop through its token, which never blocks the thread and fails (ignored) once the loop has
    ended, so that nothing waits on the loop either."""
    claim = threading.Lock()
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    handoff = _Handoff()

    def run() -> None:
        if not claim.acquire(blocking=False):
            return
        error: BaseException | None = None
        try:
            now(destroy)
        except BaseException as exc:
            error = exc
        if handoff.finish(error):
            call_soon(token, done.set)  # False once the loop has ended: its waiter left too
        elif error is not None:
            _log.logger.warning("destroying %s failed: %s", what, error)

    try:
        threading.Thread(target=run, name="aiocudasem-release", daemon=True).start()
        with anyio.move_on_after(_log.CLOSE_WARNING_S):
            await done.wait()
        if not done.is_set():
            _log.slow_close(what, _log.CLOSE_WARNING_S, "", _WAY_OUT)
            await done.wait()
    except BaseException:
        if claim.acquire(blocking=False):
            abandoned()
        else:
            error = handoff.leave()
            if error is not None:
                _log.logger.warning("destroying %s failed: %s", what, error)
        raise
    if handoff.error is not None:
        raise handoff.error


class _Handoff:
    """Who reports the outcome of :func:`in_worker`'s release: the waiting coroutine while it
    waits, whichever of the two comes second otherwise."""

    __slots__ = ("_lock", "error", "finished", "waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.finished = False
        self.waiting = True

    def finish(self, error: BaseException | None) -> bool:
        """The release ended with ``error``: True if the coroutine still waits for it."""
        with self._lock:
            self.finished = True
            self.error = error
            return self.waiting

    def leave(self) -> BaseException | None:
        """The coroutine stops waiting: the release's error, if it has already ended with one
        that nobody else will report."""
        with self._lock:
            self.waiting = False
            return self.error if self.finished else None


def _run(destroy: Callable[[], None], what: str, *, collected: bool) -> None:
    try:
        destroy()
    except DeviceFaultError:
        pass  # the faulted context took the object with it
    except DriverUnavailableError:
        if not collected:
            raise
        # A driver of the parent process, after fork(): the parent still owns the object.
    except AiocudasemError as exc:
        if not collected:
            raise
        _log.logger.warning("destroying %s failed: %s", what, exc)
        warnings.warn(f"destroying {what} failed: {exc}", RuntimeWarning, stacklevel=3)


atexit.register(flush)
