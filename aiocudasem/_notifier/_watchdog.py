"""The fault watchdog: one thread per device that coroutines are parked on, asleep in the
driver behind their work, which wakes their loops when the device faults (see
:class:`_Watchdog`)."""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Final

from .. import _log, _release
from .._errors import AiocudasemError, DeviceFaultError
from . import _tuning
from ._pools import side_streams

if TYPE_CHECKING:
    from .._driver import Driver
    from ._parking import Parking
    from ._points import Point

__all__ = ("_watchdog",)

_SLICE: Final = 0.1  # the watchdog thread sleeps at most this long at a time


class _Sentry:
    """The fault watch of one device: the notifiers parked on it, and the thread that watches.
    It names its driver weakly, so that an idle watch never keeps a driver alive."""

    __slots__ = ("device", "driver", "event", "notifiers", "thread")

    def __init__(self, driver: Driver, device: int) -> None:
        self.driver = weakref.ref(driver)
        self.device = device
        self.notifiers: dict[Parking, None] = {}
        self.thread: threading.Thread | None = None
        self.event: int | None = None  # the blocking-sync event, while the thread lives


class _Watchdog:
    """Detects device faults for parked loops, with one thread per device parked on.

    CUDA never calls a host function after a context error, so without this a fault would leave
    parked coroutines asleep forever. The thread of a device sleeps *in the driver*: it records
    an event created with ``CU_EVENT_BLOCKING_SYNC`` behind the host function of a parked
    point, on that point's side stream, and blocks in ``cuEventSynchronize``. That costs no CPU,
    and the driver returns the sticky error as soon as the context faults, whichever stream
    trapped. When the event completes instead (the point's work finished), the thread looks for
    another parked point, at most once per ``Tuning.watchdog`` seconds; with no point to block
    behind, it asks the driver every ``Tuning.watchdog`` seconds. So a fault is noticed at once
    while the device is parked, within one period while it is busy, and a parked device costs
    no wake-up at all.

    On a fault it flags the loops parked on the device and kicks their fds; it never touches a
    loop's state otherwise. It reads a snapshot of their armed points, and records on a side
    stream under the side-stream lock. A thread with nothing to watch ends after a while; one
    blocked behind work that never completes (a semaphore nobody signals) stays blocked, and
    keeps watching its device."""

    _IDLE: Final = 10.0  # a device thread with nothing to watch ends after this many seconds

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sentries: weakref.WeakKeyDictionary[Driver, dict[int, _Sentry]] = (
            weakref.WeakKeyDictionary()
        )

    def _after_fork(self) -> None:
        # Its threads did not survive the fork, and one of them may have held the lock.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sentries = weakref.WeakKeyDictionary()

    def add(self, notifier: Parking, key: tuple[Driver, int]) -> None:
        drv, device = key
        with self._lock:
            per_device = self._sentries.setdefault(drv, {})
            sentry = per_device.get(device)
            if sentry is None:
                sentry = per_device[device] = _Sentry(drv, device)
            idle = not sentry.notifiers
            sentry.notifiers[notifier] = None
            if sentry.thread is None:
                sentry.thread = threading.Thread(
                    target=self._run,
                    args=(sentry,),
                    name=f"aiocudasem-watchdog-{drv.name}:{device}",
                    daemon=True,
                )
                sentry.thread.start()
            elif idle:
                self._wake.notify_all()

    def threads(self) -> int:
        """How many device threads are running."""
        with self._lock:
            return sum(
                s.thread is not None and s.thread.is_alive()
                for per_device in self._sentries.values()
                for s in per_device.values()
            )

    def remove(self, notifier: Parking, key: tuple[Driver, int]) -> None:
        drv, device = key
        with self._lock:
            sentry = self._sentries.get(drv, {}).get(device)
            if sentry is not None:
                sentry.notifiers.pop(notifier, None)

    def _run(self, sentry: _Sentry) -> None:
        try:
            while self._until_watched(sentry):
                started = time.monotonic()
                self._look(sentry)
                # At most one look per period: a busy device costs a few wake-ups a second.
                _sleep_until(started + _tuning.current.watchdog)
        finally:
            drv, event = sentry.driver(), sentry.event
            sentry.event = None
            if drv is not None and event is not None:
                _release.release_quietly(lambda: drv.event_destroy(event), "a watchdog event")

    def _until_watched(self, sentry: _Sentry) -> bool:
        """Wait until some loop is parked on the sentry's device; False if none came for a
        while (the thread then ends, and the next parked loop starts another)."""
        with self._lock:
            deadline = time.monotonic() + self._IDLE
            while not sentry.notifiers:
                left = deadline - time.monotonic()
                if left <= 0:
                    sentry.thread = None
                    drv = sentry.driver()
                    per_device = None if drv is None else self._sentries.get(drv)
                    if per_device is not None and per_device.get(sentry.device) is sentry:
                        del per_device[sentry.device]
                    return False
                self._wake.wait(left)
            return True

    def _look(self, sentry: _Sentry) -> None:
        """Sleep in the driver behind parked work until it completes or the device faults, or
        just ask the driver if nothing parked can be found. The driver is referenced only
        during this call."""
        drv = sentry.driver()
        if drv is None:
            return
        _release.flush()
        try:
            if sentry.event is None:
                sentry.event = drv.event_create(sentry.device, blocking=True)
            if not self._block_behind_parked(drv, sentry, sentry.event):
                drv.check_health(sentry.device)
        except AiocudasemError:
            self._check(drv, sentry)
        except Exception:  # a broken driver: keep watching, at the slow pace
            pass

    def _block_behind_parked(self, drv: Driver, sentry: _Sentry, event: int) -> bool:
        """Record ``event`` behind the host function of the oldest point parked on the device
        and block until it completes or the device faults (then raise). False if no parked
        point was found."""
        with self._lock:
            notifiers = list(sentry.notifiers)
        heads: list[Point] = []
        for n in notifiers:
            heads.extend(n._heads.values())  # a snapshot: list() of a dict is atomic here
        heads.sort(key=lambda p: p.started)
        for p in heads:
            mine = p.driver is drv and p.device == sentry.device and not p.done
            if mine and side_streams.record_behind(drv, p.stream, event):
                drv.event_synchronize(event)
                return True
        return False

    def _check(self, drv: Driver, sentry: _Sentry) -> None:
        """A driver call failed: if the device reports a sticky error, wake its parked loops."""
        try:
            drv.check_health(sentry.device)
        except AiocudasemError as exc:
            with self._lock:
                notifiers = list(sentry.notifiers)
            for n in notifiers:
                n._fault_detected()
            # After the wake-ups: a slow log handler must not delay them.
            if isinstance(exc, DeviceFaultError):
                _log.device_fault(drv, sentry.device, exc)
        except Exception:
            pass


def _sleep_until(deadline: float) -> None:
    # time.sleep: a wake costs about half of a timed Condition.wait's (measured: 78 against
    # 170 us of thread CPU on a small VM). A long wait is slept in slices, so that a smaller
    # configure(watchdog=...) applies within 0.1 s.
    period = _tuning.current.watchdog
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, _SLICE))
        if _tuning.current.watchdog < period:
            deadline -= period - _tuning.current.watchdog
            period = _tuning.current.watchdog


_watchdog = _Watchdog()


def _after_fork_in_child() -> None:
    """The watchdog's threads did not survive a fork: the child starts with none."""
    _watchdog._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
