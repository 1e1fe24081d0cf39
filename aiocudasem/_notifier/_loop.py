"""The notifier of one event-loop run: :class:`Notifier` (its waits, its counters and its
lifetime, on the parking and chain layers of ``_parking`` and ``_chains``), and the async
generator that closes it when its loop ends."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio

from .. import _hotpath
from . import _tuning
from ._ahead import (
    Doze,
    learn_caught,
    learn_early,
    learn_late,
    learn_overran,
    learn_parked,
    plan,
)
from ._chains import busy_elsewhere
from ._loops import loop_adapter, never, wake
from ._parking import Parking
from ._points import History, Point
from ._watchdog import _watchdog

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

    from .._driver import Driver

__all__ = ("Notifier",)


class Notifier(Parking):
    """The notifier of one event-loop run: its adapter, the waits (spin, arm, park), the
    counters, and its lifetime. The layers below it: :class:`~._parking.Parking` (sleepers,
    the drainer) on :class:`~._chains.Chains` (host functions, chains, faults)."""

    def __init__(self, backend: type[AsyncBackend], token: object) -> None:
        # The loop this notifier serves, through its adapter (see _loops): everything that
        # differs between asyncio and trio. What an await reads is copied here, read once.
        self.loop = adapter = loop_adapter(backend, token)
        super().__init__(backend, adapter)
        #: Whether the running loop is still the one this notifier serves: how
        #: current_notifier() finds it again (``_hotpath.Finder`` calls it on every await).
        self.serves_running_loop = adapter.serves_running_loop
        #: The loop's checkpoint, called directly (one coroutine frame less per yield).
        self.checkpoint = adapter.checkpoint
        self._bare_yield = adapter.bare_yield
        #: asyncio's queue of ready callbacks, where the loop has one to read (not uvloop): a
        #: spin on asyncio queries again without yielding while it is empty (see
        #: ``_hotpath.spin_recorded``).
        self.ready_queue = adapter.ready_queue
        # Wait histories of the streams that have no Stream object to keep one: the library's
        # private streams, and the keys of foreign events.
        self._histories: dict[tuple[int, int], History] = {}  # (id(driver), stream) ->
        #: The counters that the wait in C keeps (``_hotpath.wait_complete``): the awaits it
        #: saw return normally, and the waits spinning now (every spin counts there). Read
        #: by :meth:`statistics` and :meth:`may_spin` only.
        self.counters = _hotpath.Counters()
        # The awaits of this loop that returned normally through the parks and points here, in
        # a plain int (an attribute of the C counters costs Python three times as much to add
        # to).
        self._completed_here = 0
        self._lifetime: AsyncGenerator[None, None] | None = None
        #: What must not outlive the loop, by a key of the caller's: each is called once, at
        #: the start of :meth:`close`, unless its key was removed before (a host stage that
        #: its task never ran, which releases its position on the stream there).
        self.at_close: dict[object, Callable[[], None]] = {}
        _live_notifiers.add(self)

    def fileno(self) -> int:
        return self._fd

    def fds(self) -> set[int]:
        """The fds this loop's notifier holds until the loop ends: its own, and the timer fd of
        its alarms once a wait has woken ahead (see ``_ahead``)."""
        alarm = self._alarms.fileno()
        return {self._fd} if alarm is None else {self._fd, alarm}

    @property
    def bare_yield(self) -> bool:
        """The checkpoint is asyncio's bare yield, which ``Stream.wait_complete()`` yields from
        C (``_hotpath.wait_complete``, which reads this and :attr:`counters` once per
        notifier); on the other loops it awaits :attr:`checkpoint`, read at each wait."""
        return self._bare_yield

    @property
    def _completed(self) -> int:
        return self.counters.completed + self._completed_here

    def statistics(self) -> dict[str, int]:
        """This loop's counters, by the names of :class:`~aiocudasem.lowlevel.Statistics`'
        per-loop fields, whose docstrings define them."""
        c = self._c.stats()
        return {
            "pending": c["pending"],
            "fired": c["fired"],
            "wakeups": c["wakeups"],
            "armed": len(self._armed),
            "chained": sum(len(chain) for chain in self._chains.values()),
            "parked": self._asleep,
            "spinning": self.counters.spinning,
            "watched": len(self._watched),
            "drainer_wakeups": self._wakeups,
            "completed": self._completed,
            "faulted": self._faulted,
            "ahead_caught": self._ahead[0],
            "ahead_early": self._ahead[1],
            "ahead_late": self._ahead[2],
        }

    def may_spin(self) -> bool:
        """Whether one more coroutine may spin (query between checkpoints) now: fewer than
        ``max_spinners`` do. The wait in C asks it too."""
        return self.counters.spinning < _tuning.current.max_spinners

    # ------------------------------------------------------------------ lifetime

    def _bind_to_loop(self) -> None:
        """Close this notifier when the running loop shuts down.

        Every loop finalizes the async generators that were first iterated inside it when it
        ends: asyncio and uvloop in ``shutdown_asyncgens()`` (``asyncio.run``, ``Runner`` and
        anyio call it), trio at the end of ``trio.run`` and of a guest run. So a generator
        started here, whose ``finally`` closes the notifier, ties the notifier to the loop
        without any event-loop-specific code. It is started synchronously: it yields before
        awaiting anything."""
        agen = _lifetime(weakref.ref(self))
        try:
            agen.asend(None).send(None)
        except StopIteration:
            pass
        # asyncio keeps only a weak set of generators: hold it for as long as we live.
        self._lifetime = agen

    def close(self) -> None:
        """Release the loop's fd and forget every point, after the calls of :attr:`at_close`.
        Idempotent. Host functions still in flight keep the C state (not the fd) alive until
        they return. Points armed here may be awaited again from another loop afterwards; their
        abandoned pooled events go back."""
        if self.closed:
            return
        self.closed = True
        at_close, self.at_close = self.at_close, {}
        for call in at_close.values():
            call()
        self.serves_running_loop = never  # drops the token: the finished loop is not kept
        self.ready_queue = None
        self.loop.forget()
        if self._fd_watcher is not None:
            self._fd_watcher.stop()  # before the fd closes
        self._alarms.close()
        _live_notifiers.discard(self)
        for key in self._watched:
            _watchdog.remove(self, key)
        self._watched.clear()
        points: dict[Point, None] = dict.fromkeys(self._armed.values())
        for chain in self._chains.values():
            points.update(chain)
        for p in points:
            p.token = 0
            p.owner = None
            if not p.done and p.waiting == 0:
                p._release_event()
        self._armed.clear()
        self._chains.clear()
        self._heads.clear()
        self._candidates.clear()
        try:
            for p in self._sleeping:  # a coroutine still parked (the loop is going away) sees
                wake(p.sleepers)  # `closed`
        finally:
            self._sleeping.clear()
            if self._drain_scope is not None:
                self._drain_scope.cancel()
            self._c.close()

    # ------------------------------------------------------------------ waiting

    async def wait_recorded(
        self,
        driver: Driver,
        device: int,
        stream: int,
        event: int,
        pool: list[int],
        history: History,
        started: float,
        recorded: float,
    ) -> None:
        """Park on ``event``, recorded on ``stream`` at ``recorded`` (a ``time.perf_counter()``)
        and taken from ``pool``, where it goes back afterwards, for a wait of
        ``Stream.wait_complete()`` that began at ``started`` and has spun already, if it might
        (``_hotpath.wait_complete``, which calls this): the same as :meth:`wait` on a new point
        past its spin, with the stream's ``history``. Most awaits of short work never get
        here, and never make a point."""
        point = Point(driver, device, stream, event, pool, history)
        point.started = started
        point.recorded = recorded
        point.waiting += 1
        newest = history.newest
        if newest is None or newest.recorded < recorded:
            history.newest = point  # not over a newer one (a spinner may park late)
        try:
            self._arm(point)
            if not point.done:
                await self._park_ahead(point)
        finally:
            self._leave(point)
        if point.error is not None:
            point._raise_if_failed()
        self._completed_here += 1

    async def _park_ahead(self, point: Point) -> None:
        """Park on ``point``, armed, a wait of ``Stream.wait_complete()``: with a steady
        prediction of its stream's waits, wake just before the predicted end and spin over it
        (see ``_ahead``), then park again if the work is still running. What happened teaches
        the prediction."""
        history, started = point.history, point.started
        alarms = self._alarms
        planned = plan(alarms, history, started)
        if planned is None:
            await self._park(point)
            if point.done and point.error is None:
                learn_parked(history, time.perf_counter() - started)
            return
        wake_at, spin_until, spin_max = planned
        clock = time.perf_counter
        doze = Doze(wake_at)
        if wake_at > clock() and alarms.add(doze):
            try:
                await self._park(point, doze=doze)
            finally:
                alarms.discard(doze)
            if point.done:  # its host function (or another waiter's query) came first
                if point.error is None:
                    learn_early(history, clock() - started)
                    self._ahead[1] += 1
                return
        if self.may_spin():
            checkpoint, query, counters = self.checkpoint, self._query, self.counters
            counters.spinning += 1
            began = clock()
            spin_until = min(spin_until, began + spin_max)
            first = True
            try:
                while True:
                    if point.done or query(point):
                        if point.error is None:
                            now = clock()
                            if first:
                                learn_early(history, now - started)
                                self._ahead[1] += 1
                            else:
                                learn_caught(history, now - started, now - began)
                                self._ahead[0] += 1
                        return
                    first = False
                    now = clock()
                    if now >= spin_until:
                        learn_late(history, now - started, now - began)
                        self._ahead[2] += 1
                        break
                    await checkpoint()
            finally:
                counters.spinning -= 1
            await self._park(point)
            if point.done and point.error is None:
                learn_overran(history, clock() - started)  # by how much it ran past
            return
        await self._park(point)

    def shared_point(self, history: History, started: float) -> Point | None:
        """The stream's newest parked point, if a wait that began at ``started`` (and found
        the stream busy after its first checkpoint) may share it: this loop's, still awaited,
        and recorded strictly after ``started`` (the same clock reading could come after the
        record), so that it covers all the work enqueued before the wait began and at most the
        work enqueued during its first checkpoint besides, as a point of its own would. The
        waiters of a stream that park thus share one event and one point."""
        point = history.newest
        if (
            point is not None
            and point.recorded > started
            and point.waiting
            and not point.done
            and point.owner is self._ref
        ):
            return point
        return None

    def wait(self, point: Point) -> Coroutine[Any, Any, None]:
        """Wait until ``point`` completes. Always a checkpoint. Raises what the point failed
        with (``DeviceFaultError`` after a device fault). Cancellation abandons the wait
        only: the point stays armed and other waiters keep their wake-ups.

        A point that this loop armed already (a crowd's shared point) is parked on directly:
        the coroutine returned is ``_park()`` itself, so each waiter of a crowd has one
        coroutine less to resume when the crowd is woken."""
        if self._armed_here(point):
            return self._park(point, joined=True)
        return self._wait(point)

    def _armed_here(self, point: Point) -> bool:
        """Whether ``point`` is pending with a host function that this loop armed: its
        waiters may park on it directly."""
        return bool(point.token) and not point.done and point.owner is self._ref

    async def _wait(self, point: Point) -> None:
        if not point.done and not self._may_own(point):
            await self._backend.checkpoint_if_cancelled()
            raise busy_elsewhere()
        # Each path below passes a full checkpoint (the first one, the spin loop's or the
        # park's), so there is no separate cancellation check up front.
        point.waiting += 1
        try:
            if point.done:
                await self.checkpoint()
            elif point.token:  # armed by an earlier waiter: share its host function
                await self._park(point)
            else:
                # A checkpoint first, which gives the GPU a moment, so that the first query is
                # more often the last.
                await self.checkpoint()
                if not point.done and not self._query(point):
                    await self._settle(point)
        finally:
            self._leave(point)
        if point.error is not None:
            point._raise_if_failed()
        self._completed_here += 1

    async def _settle(self, point: Point) -> None:
        """The first query found ``point`` pending: spin, arm and park as needed."""
        await self._spin(point)
        if not point.done:
            self._arm(point)
            if not point.done:
                await self._park(point)

    def _leave(self, point: Point) -> None:
        """A waiter of ``point`` leaves, done, failed or cancelled."""
        point.waiting -= 1
        if not point.done and point.waiting == 0:
            if not point.token:
                # Abandoned without a host function of its own: nobody will query it again.
                self._unchain(point)
                point.owner = None
            # An armed point's host function does not need the event (cuStreamWaitEvent
            # captured it), and nobody will query an abandoned pooled point: give it back now
            # rather than when (or if) the host function fires.
            point._release_event()

    async def _park(self, point: Point, joined: bool = False, doze: Doze | None = None) -> None:
        """Sleep until ``point`` is done, as the loop's drainer whenever nobody else is.
        ``joined``: this coroutine is a waiter of ``point`` from here on (see :meth:`wait`):
        it leaves the point at the end, and raises what the point failed with. ``doze``: the
        wait's alarm (see :meth:`_park_ahead`), which ends the sleep early when it fires."""
        if joined:
            if not self._armed_here(point):
                # Finished or disarmed since wait() looked (the coroutine was not awaited at
                # once): the general path, which passes its checkpoint.
                await self._wait(point)
                return
            point.waiting += 1
        try:
            sleeping = self._sleeping
            count = sleeping.get(point, 0)
            sleeping[point] = count + 1
            if not count:
                self._watch(point)
            sleeper = self._new_sleeper()
            sleepers = point.sleepers
            sleepers[sleeper] = next(self._park_order)
            self._asleep += 1
            self._candidate(sleeper, point)
            if doze is not None:
                doze.wake = sleeper
            try:
                while not point.done and (doze is None or not doze.due):
                    if self.closed:
                        raise anyio.ClosedResourceError(
                            "the event loop is shutting down: its notifier is closed"
                        )
                    if not self._draining:
                        await self._drain(point, doze)
                    elif sleeper.done():
                        # Woken to take over the drainer role, which someone took first: sleep
                        # again.
                        del sleepers[sleeper]
                        sleeper = self._new_sleeper()
                        sleepers[sleeper] = next(self._park_order)
                        self._candidate(sleeper, point)
                        if doze is not None:
                            doze.wake = sleeper
                    else:
                        await sleeper
                        if self._heir is sleeper:
                            self._heir = None
            finally:
                # The coroutine leaves: settle its accounts, deliver what is queued and hand
                # the drainer role on.
                if doze is not None:
                    doze.wake = None
                self._asleep -= 1
                if self._heir is sleeper:
                    self._heir = None
                if not sleeper.done():
                    # Left without being woken (the drainer, or a wait that failed): whoever
                    # wakes its point's crowd skips it.
                    sleeper.cancel()
                if not point.done:
                    sleepers.pop(sleeper, None)
                # Unless the point's _finish() here settled the accounts of all its sleepers:
                left = sleeping.get(point)
                if left is not None:
                    if left > 1:
                        sleeping[point] = left - 1
                    else:
                        del sleeping[point]
                        self._unwatch(point)
                if not self.closed:
                    # Deliver what is queued before leaving. Nobody may be draining right now:
                    # this coroutine may have been cancelled before it drained, and the next
                    # drainer may be cancelled too. And if one is, it sleeps on the fd, which the
                    # loop looks at only between its passes over the ready tasks: after a crowd's
                    # wake-up, thousands of them. So whoever leaves first delivers what arrived
                    # meanwhile.
                    if self._check or self._c.queued():
                        self._collect()
                    if not self._draining:
                        self._hand_off()  # then hand the role on
                        if self._heir is None and self._armed:
                            # Nobody is left to take it: watch the fd until what is armed
                            # (abandoned waits' host functions) has fired and been collected.
                            self._start_fd_watch()
        finally:
            if joined:
                self._leave(point)
        if joined:
            if point.error is not None:
                point._raise_if_failed()
            self._completed_here += 1

    def history(self, driver: Driver, stream: int) -> History:
        """The wait history of ``stream``, a stream handle (or a foreign event's key) that has
        no :class:`~aiocudasem.Stream` to keep one."""
        key = (id(driver), stream)
        h = self._histories.get(key)
        if h is None:
            if len(self._histories) >= _HISTORY_LIMIT:
                self._histories.clear()
            h = self._histories[key] = History()
        return h

    async def _spin(self, point: Point) -> None:
        """Called once the first query found ``point`` pending: query it between checkpoints
        for a while if this stream's waits tend to be short, and not more than
        ``max_spinners`` coroutines at a time."""
        window = point.history.spin_window()
        if window <= 0 or not self.may_spin():
            return
        deadline = point.started + window
        checkpoint, query, clock = self.checkpoint, self._query, time.perf_counter
        counters = self.counters
        counters.spinning += 1
        try:
            while True:
                await checkpoint()
                if point.done or query(point) or clock() >= deadline:
                    return
        finally:
            counters.spinning -= 1


_live_notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()

_HISTORY_LIMIT = 4096  # wait histories of handles without a Stream that a notifier keeps


async def _lifetime(ref: weakref.ref[Notifier]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        notifier = ref()
        if notifier is not None:
            notifier.close()
