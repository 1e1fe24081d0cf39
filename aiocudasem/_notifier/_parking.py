"""The parking side of a loop's notifier: coroutines that sleep until their point is done,
one of them the *drainer*, which waits on the fd and delivers completions for all.

A parked coroutine sleeps on a sleeper of its loop (see ``_loops``). The drainer waits on the
fd; when it leaves (done or cancelled) it first delivers whatever is queued, then hands the
role to another sleeper. A cancelled drainer therefore loses nobody's wake-up. When the last
parked coroutine leaves with host functions still armed (abandoned waits'), the loop's fd
watcher collects them as they fire. A device that coroutines are parked on is watched by the
watchdog (``_watchdog``), which flags the loop when it faults."""

from __future__ import annotations

import collections
import itertools
from typing import TYPE_CHECKING

import anyio

from .. import _log
from .._errors import AiocudasemError, DeviceFaultError
from .._hotpath import in_park_order
from ._ahead import Alarms, Doze
from ._chains import Chains
from ._loops import wake
from ._watchdog import _watchdog

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

    from .._driver import Driver
    from ._loops import LoopAdapter, Sleeper
    from ._points import Point

__all__ = ("Parking",)


class Parking(Chains):
    """Who sleeps on which point, who drains the fd, and how the role passes on."""

    def __init__(self, backend: type[AsyncBackend], adapter: LoopAdapter) -> None:
        super().__init__()
        self._backend = backend
        self._new_sleeper = adapter.new_sleeper
        self._wake_crowd = adapter.wake_crowd
        # Watches the fd while no coroutine of the loop is parked and host functions are still
        # armed (abandoned waits'), so that they are collected when they fire.
        self._fd_watcher = adapter.fd_watcher(self._fd, self._on_fd_readable)
        # The points that coroutines of this loop sleep on, oldest first, and how many sleep on
        # each: a point's device is watched while it has sleepers, and _hand_off() finds a
        # sleeper here. Kept per point, not per coroutine, so that finishing a point settles
        # the accounts of all its sleepers at once and a woken crowd leaves cheaply.
        self._sleeping: dict[Point, int] = {}
        self._asleep = 0  # coroutines inside _park(), the drainer included
        self._park_order = itertools.count()  # each sleeper's place in the order of parking
        # The sleepers of parked coroutines with their points, in the order in which they
        # parked, some of them out of the running already (the sleeper done: woken or
        # cancelled; or its point finished, its crowd about to be woken): where _hand_off()
        # looks for an heir. Each leaves it once, from the front when _hand_off() passes it,
        # or in a compaction once most of it is out, so that a crowd leaving at once costs
        # each coroutine O(1), however many of the others were cancelled with it.
        self._candidates: collections.deque[tuple[Sleeper, Point]] = collections.deque()
        # While _complete() runs: the sleepers of the points it finished, woken at its end,
        # in the order in which they parked (see _complete()).
        self._waking: list[dict[Sleeper, int]] | None = None
        self._draining = False
        self._drain_point: Point | None = None
        self._drain_scope: anyio.CancelScope | None = None
        # The sleeper that _hand_off() woke to take over the drainer role, until its coroutine
        # runs: until then nobody else is woken for the role.
        self._heir: Sleeper | None = None
        # The alarms of parked waits that wake ahead of their work's predicted end (_ahead),
        # and the alarm of the drainer's wait, if it has one.
        self._alarms = Alarms(adapter)
        self._alarms.on_due = self._doze_due
        self._drain_doze: Doze | None = None
        self._watched: dict[tuple[Driver, int], int] = {}  # devices of parked points -> count
        self._check = False  # set by the watchdog thread: a device parked on has faulted
        self._wakeups = 0  # times the loop woke from the fd: its drainer, or the fd watcher
        self._faulted = 0  # points of this loop failed by a device fault
        #: Waits that woke ahead, by how: [caught, early, late] (``statistics()``'s ahead_*).
        self._ahead = [0, 0, 0]

    def _finish(self, point: Point, error: AiocudasemError | None) -> None:
        fault = None
        if not point.done and isinstance(error, DeviceFaultError):
            self._faulted += 1
            fault = error
        if self._sleeping.pop(point, 0):
            self._unwatch(point)  # the accounts of all its sleepers, which need not come back
        sleepers = point._finish(error)
        if sleepers:
            if self._waking is not None:
                self._waking.append(sleepers)
            else:
                wake(sleepers)
        if point is self._drain_point and self._drain_scope is not None:
            # The drainer sleeps on the fd, not on its sleeper: wake it so that it can leave.
            self._drain_scope.cancel()
        if fault is not None:  # after the wake-ups, as the watchdog does
            _log.device_fault(point.driver, point.device, fault)

    def _complete(self, tokens: list[int]) -> None:
        """Finish the points whose host functions fired, and those behind them in their
        chains that are done too; then wake their sleepers."""
        armed = self._armed
        waking: list[dict[Sleeper, int]] = []
        self._waking = waking  # nothing below delivers completions: no nested _complete()
        try:
            for token in tokens:
                point = armed.pop(token, None)
                if point is not None:
                    key = (point.driver, point.stream)
                    if self._heads.get(key) is point:
                        del self._heads[key]
                    if point.token == token:  # not taken over by another loop (_may_own)
                        point.token = 0
                        if not point.done:
                            self._succeed(point)
                    self._advance(key)
        finally:
            self._waking = None
            if waking:
                # In the order in which they parked: the order the loop then resumes them in,
                # and a crowd's coroutines were mostly created, and so laid out in memory, in
                # that order too. Point by point, a crowd of 10,000 coroutines dealt
                # round-robin over 64 streams resumes in strides of 64 through memory, and
                # each resume costs up to twice as much (measured on a development machine).
                self._wake_crowd(in_park_order(waking))

    async def _drain(self, point: Point, doze: Doze | None = None) -> None:
        """Be the drainer until ``point`` is done (or ``doze``, its wait's alarm, is due):
        sleep on the fd, deliver completions."""
        self._draining = True
        self._drain_point = point
        self._drain_doze = doze
        self._stop_fd_watch()  # the fd is the drainer's now
        try:
            while not point.done and not self.closed and (doze is None or not doze.due):
                with anyio.CancelScope() as scope:
                    self._drain_scope = scope
                    if not self._check:
                        await self._backend.wait_readable(self._fd)
                        self._wakeups += 1
                self._drain_scope = None
                self._collect()
        finally:
            self._draining = False
            self._drain_point = None
            self._drain_doze = None
            self._drain_scope = None

    def _doze_due(self, doze: Doze) -> None:
        """``doze``'s alarm fired: wake its coroutine, parked or draining, so that it spins."""
        if doze is self._drain_doze and self._drain_scope is not None:
            self._drain_scope.cancel()
            return
        sleeper = doze.wake
        if sleeper is not None and not sleeper.done():
            sleeper.set_result(None)

    def _collect(self) -> None:
        """Deliver queued completions, and run the fault check if the watchdog asked for it.
        Non-blocking."""
        if self.closed:
            return
        tokens = self._c.drain()
        if tokens:
            self._complete(tokens)
        if self._check:
            self._check = False
            self._check_faults()

    def _hand_off(self) -> None:
        """Wake one sleeper so that its coroutine becomes the drainer, unless one woken for
        that has not run yet: a crowd leaving at once wakes one heir, not one each."""
        if self._heir is not None:
            return
        candidates = self._candidates
        while candidates:
            s, point = candidates.popleft()
            # Not woken already, nor cancelled, and not in a finished crowd, whose wake-up
            # may still be on its way (see _complete()).
            if not s.done() and not point.done:
                s.set_result(None)
                self._heir = s
                return

    def _candidate(self, sleeper: Sleeper, point: Point) -> None:
        """``sleeper``'s coroutine parks on ``point``: it may be handed the drainer role."""
        candidates = self._candidates
        candidates.append((sleeper, point))
        if len(candidates) > 2 * self._asleep + 64:
            # Mostly out of the running (a crowd woken while the drainer stays): drop those, in
            # O(len) once per as many parks, so that it stays within twice the parked.
            self._candidates = collections.deque(
                c for c in candidates if not c[0].done() and not c[1].done
            )

    def _start_fd_watch(self) -> None:
        if self._fd_watcher is not None:
            self._fd_watcher.start()

    def _stop_fd_watch(self) -> None:
        if self._fd_watcher is not None:
            self._fd_watcher.stop()

    def _on_fd_readable(self) -> bool:
        """The fd watcher saw the fd readable: collect what fired. Returns whether to keep
        watching: while host functions are armed and no drainer has the fd."""
        if self.closed:
            return False
        self._wakeups += 1
        self._collect()
        return bool(self._armed) and not self._draining

    def _watch(self, point: Point) -> None:
        key = (point.driver, point.device)
        n = self._watched.get(key, 0)
        self._watched[key] = n + 1
        if n == 0:
            _watchdog.add(self, key)

    def _unwatch(self, point: Point) -> None:
        key = (point.driver, point.device)
        n = self._watched.get(key, 0) - 1
        if n > 0:
            self._watched[key] = n
        elif n == 0:
            del self._watched[key]
            _watchdog.remove(self, key)

    def _fault_detected(self) -> None:
        """From the watchdog thread (or the fork handler): a device that coroutines here are
        parked on has faulted. Flag it and wake the loop; its drainer does the rest."""
        self._check = True
        self._c.kick()
