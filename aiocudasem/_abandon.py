"""What external semaphores and host timelines share as the two ends of a producer's channel:
the tasks parked in their host-side waits, closing them, and giving up on the producer.

- **Closing wakes the parked.** As trio's ``notify_closing`` does for a socket, ``close()``,
  ``aclose()`` and ``detach()`` wake every task parked in the object's ``wait_value()`` or
  ``wait_signaled()`` with ``anyio.ClosedResourceError``, from whichever thread they are
  called. No task sleeps on a closed object.
- **Giving up.** ``abandon()`` is for a producer that died, stalled or is no longer wanted.
  The consumer cannot take back the GPU waits it enqueued, but it can satisfy them itself:
  it signals the semaphore (from CUDA, or from the host for a host timeline) so that its own
  streams get past the dead waits and can be closed. Parked host waits, and every later use
  of the object, raise :class:`~aiocudasem.AbandonedError`.

To know what to signal, each object notes the waits that the library enqueues on it: the
highest value waited for (timelines), and how many waits were enqueued against how many
signals (binary semaphores).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ._errors import AbandonedError, AiocudasemError
from ._lifetime import OnDevice
from ._loopcall import call_soon

if TYPE_CHECKING:
    from anyio.lowlevel import EventLoopToken

    from ._driver import Driver

__all__ = ("Abandonable", "Parked")

_PRUNE_AT = 32  # pending binary waits past which the passed ones are forgotten


def _destroy_event_quietly(driver: Driver, event: int) -> None:
    try:
        driver.event_destroy(event)
    except AiocudasemError:
        pass  # a faulted context took it along


class _Waiter:
    __slots__ = ("scope", "thread", "token", "woken")

    def __init__(self, token: EventLoopToken) -> None:
        self.scope = anyio.CancelScope()
        self.thread = threading.get_ident()
        self.token = token
        self.woken = False


class Parked:
    """The tasks parked in one object's host waits, and why they must leave, once they must."""

    __slots__ = ("_error", "_lock", "_waiters")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[_Waiter] = set()
        #: Makes the error that parked and later waits raise, once the object was closed or
        #: abandoned; None while it may be waited on.
        self._error: Callable[[], BaseException] | None = None

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, wait: Callable[[], Awaitable[None]]) -> None:
        """Run ``wait()`` as a parked task: :meth:`notify` ends it with its error."""
        waiter = _Waiter(anyio.lowlevel.current_token())
        with self._lock:
            error = self._error
            if error is None:
                self._waiters.add(waiter)
        if error is not None:
            await anyio.lowlevel.checkpoint_if_cancelled()
            raise error()
        try:
            with waiter.scope:
                await wait()
        finally:
            with self._lock:
                self._waiters.discard(waiter)
        # A wait that completed while the object was closed did complete: only one that the
        # notification cut short raises.
        if waiter.woken and waiter.scope.cancelled_caught:
            error = self._error
            assert error is not None
            raise error()

    def notify(self, error: Callable[[], BaseException]) -> None:
        """Wake every parked task with ``error()`` (the first notification's error stays),
        and make later waits raise it. From any thread; never blocks."""
        with self._lock:
            if self._error is None:
                self._error = error
            waiters = list(self._waiters)
            self._waiters.clear()
        here = threading.get_ident()
        for w in waiters:
            w.woken = True
            if w.thread == here:
                w.scope.cancel()
            else:
                # Another loop's task: its loop cancels it (once it has ended, its tasks are
                # gone with it).
                call_soon(w.token, w.scope.cancel)


class Abandonable(OnDevice):
    """Base of :class:`~aiocudasem.ExternalSemaphore` and :class:`~aiocudasem.HostTimeline`."""

    __slots__ = ("_binary", "_binary_pending", "_gave_up", "_max_waited", "_parked")
    #: Whether each wait consumes a signal of its own.
    _binary: bool
    _parked: Parked
    _gave_up: bool
    #: The highest value that a wait enqueued through the library asked for (timelines).
    _max_waited: int
    #: An event recorded behind each binary wait enqueued through the library, until it is
    #: seen to have passed.
    _binary_pending: list[int]

    def _init_waits(self, binary: bool = False) -> None:
        self._binary = binary
        self._parked = Parked()
        self._gave_up = False
        self._max_waited = 0
        self._binary_pending = []

    def _claim(self) -> bool:
        claimed = super()._claim()
        if claimed:
            self._parked.notify(self._closed_while_waiting)
            pending, self._binary_pending = self._binary_pending, []
            for event in pending:  # CUDA frees an event still to complete once it has
                _destroy_event_quietly(self._driver, event)
        return claimed

    def _closed_while_waiting(self) -> anyio.ClosedResourceError:
        return anyio.ClosedResourceError(
            f"the {self._noun} was closed while this task waited on it, or before"
        )

    @property
    def abandoned(self) -> bool:
        """True once :meth:`abandon` was called."""
        return self._gave_up

    def _check_usable(self, what: str) -> None:
        """Raise for an entry or wait of a closed or abandoned object."""
        if self.closed:
            raise anyio.ClosedResourceError(
                f"{what} of a closed {self._noun} ({self!r}): use one before its aclose()"
            )
        if self.abandoned:
            raise self._abandoned()

    def _check_waitable(self) -> None:
        """Raise for a host wait of a closed or abandoned object."""
        self.handle  # noqa: B018 - raises ClosedResourceError once closed
        if self._gave_up:
            raise self._abandoned()

    def _abandoned(self) -> AbandonedError:
        return AbandonedError(
            f"the {self._noun} was abandoned (abandon() was called: its producer is gone); "
            "its waits were released without the producer, so the data behind them is not "
            "the producer's"
        )

    def _note_wait(self, value: int | None, stream: int) -> None:
        """A wait of the library was enqueued on ``stream``: remember what releases it. A
        timeline's: the highest value. A binary semaphore's: an event behind it, which tells
        when it has passed (each needs a signal of its own)."""
        if value is not None:
            if value > self._max_waited:
                self._max_waited = value
            return
        if not self._binary:
            return
        drv, pending = self._driver, self._binary_pending
        if len(pending) >= _PRUNE_AT:
            kept = []
            for event in pending:
                try:
                    passed = drv.event_query(event)
                except AiocudasemError:
                    passed = False
                if passed:
                    _destroy_event_quietly(drv, event)
                else:
                    kept.append(event)
            pending[:] = kept
        event = drv.event_create(self._device)
        try:
            drv.event_record(event, stream)
        except BaseException:
            _destroy_event_quietly(drv, event)
            raise
        pending.append(event)

    async def _park(self, wait: Callable[[], Awaitable[None]]) -> None:
        await self._parked.wait(wait)

    def _give_up(self) -> None:
        """Mark the object abandoned and wake its parked waiters with ``AbandonedError``."""
        self._gave_up = True
        self._parked.notify(self._abandoned)
