"""The per-loop half of the notifier: one :class:`Notifier` per event-loop run (spin, park,
chains, the drainer, the fault flag), :func:`current_notifier`, and the async generator that
closes a notifier when its loop ends."""

from __future__ import annotations

import collections
import itertools
import time
import weakref
from collections.abc import AsyncGenerator, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from .. import _hotpath, _log, _notify
from .._errors import AiocudasemError, DeviceFaultError
from .._hotpath import in_park_order
from . import _tuning
from ._loops import loop_adapter, never, wake
from ._points import History, Point
from ._pools import give_back
from ._wake import STRATEGIES as _STRATEGIES
from ._watchdog import _watchdog

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

    from .._driver import Driver
    from ._loops import Sleeper

__all__ = ("Notifier",)


class Notifier:
    """The per-loop half of the notifier: the C queue and fd, the armed points, the drainer."""

    def __init__(self, backend: type[AsyncBackend], token: object) -> None:
        # The loop this notifier serves, through its adapter (see _loops): everything that
        # differs between asyncio and trio. What an await reads is copied here, read once.
        self._backend = backend
        self.loop = adapter = loop_adapter(backend, token)
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
        self._new_sleeper = adapter.new_sleeper
        self._wake_crowd = adapter.wake_crowd
        self._c = _notify.Notifier()
        self._fd = self._c.fileno()
        # Watches the fd while no coroutine of the loop is parked and host functions are still
        # armed (abandoned waits'), so that they are collected when they fire.
        self._fd_watcher = adapter.fd_watcher(self._fd, self._on_fd_readable)
        self._tokens = itertools.count(1)
        self._armed: dict[int, Point] = {}  # token -> the point its host function follows
        # Parked points per work stream. Only the oldest of each has a host function: streams
        # are FIFO, so when it fires the others are checked with a query, and a crowd of
        # waiters on one stream costs one host function, not one each.
        self._chains: dict[tuple[Driver, int], dict[Point, None]] = {}
        self._heads: dict[tuple[Driver, int], Point] = {}  # the chain's armed point
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
        self._spinners = 0
        # Wait histories of the streams that have no Stream object to keep one: the library's
        # private streams, and the keys of foreign events.
        self._histories: dict[tuple[int, int], History] = {}  # (id(driver), stream) ->
        self._watched: dict[tuple[Driver, int], int] = {}  # devices of parked points -> count
        self._check = False  # set by the watchdog thread: a device parked on has faulted
        self._wakeups = 0  # times the loop woke from the fd: its drainer, or the fd watcher
        # Awaits of this loop that returned normally, one per coroutine: those that C counts
        # (``_hotpath.wait_complete``) and those that Python counts, in a plain int (an
        # attribute of the C counter costs Python three times as much to add to).
        self._tally = _hotpath.Tally()
        self._completed_here = 0
        self._faulted = 0  # points of this loop failed by a device fault
        self._lifetime: AsyncGenerator[None, None] | None = None
        self.closed = False
        self._ref = weakref.ref(self)
        _live_notifiers.add(self)

    def fileno(self) -> int:
        return self._fd

    @property
    def bare_yield(self) -> bool:
        """The checkpoint is asyncio's bare yield, which ``Stream.wait_complete()`` yields from
        C (``_hotpath.wait_complete``, which reads this once per notifier); on the other loops
        it delegates to :attr:`checkpoint`, read at each wait."""
        return self._bare_yield

    @property
    def _completed(self) -> int:
        return self._tally.completed + self._completed_here

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
            "spinning": self._spinners,
            "watched": len(self._watched),
            "drainer_wakeups": self._wakeups,
            "completed": self._completed,
            "faulted": self._faulted,
        }

    def may_spin(self) -> bool:
        """Whether one more coroutine may spin (query between checkpoints) now: fewer than
        ``max_spinners`` do."""
        return self._spinners < _tuning.current.max_spinners

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
        """Release the loop's fd and forget every point. Idempotent. Host functions still in
        flight keep the C state (not the fd) alive until they return. Points armed here may be
        awaited again from another loop afterwards; their abandoned pooled events go back."""
        if self.closed:
            return
        self.closed = True
        self.serves_running_loop = never  # drops the token: the finished loop is not kept
        self.ready_queue = None
        self.loop.forget()
        if self._fd_watcher is not None:
            self._fd_watcher.stop()  # before the fd closes
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

    def _fault_detected(self) -> None:
        """From the watchdog thread (or the fork handler): a device that coroutines here are
        parked on has faulted. Flag it and wake the loop; its drainer does the rest."""
        self._check = True
        self._c.kick()

    # ------------------------------------------------------------------ waiting

    async def wait_recorded(
        self,
        driver: Driver,
        device: int,
        stream: int,
        event: int,
        pool: list[int],
        history: History,
        started: float | None = None,
        recorded: float | None = None,
    ) -> None:
        """Wait for ``event``, just recorded on ``stream`` and taken from ``pool``, where it
        goes back afterwards (``Stream.wait_complete``, with the stream's ``history``). The
        same as :meth:`wait` on a new point, but the spin phase runs here, on the raw event,
        and a point is made only to park: most awaits of short work never make one, and each
        round of the spin resumes as few frames as possible. ``started``: the wait already
        passed its first checkpoint, which began then (a ``time.perf_counter()``), and found
        the stream busy after it; the event was recorded just now, so it is not queried before
        the next checkpoint. ``recorded``: the event was recorded then, and the wait spun on it
        already (on asyncio, in C: ``_hotpath.spin_recorded``); it parks at once."""
        if recorded is None:
            clock = time.perf_counter
            # The event was recorded just now, and nothing ran since: a wait of this loop that
            # began before this instant may share it, once it is a point (see shared_point()).
            recorded = clock()
            query = driver.event_query
            try:
                if started is None:
                    started = clock()
                    await self.checkpoint()
                    ready = query(event)
                else:
                    ready = False
                if not ready and self.may_spin():
                    deadline = started + history.spin_window()
                    if deadline > started:
                        checkpoint = self.checkpoint
                        self._spinners += 1
                        try:
                            while True:
                                await checkpoint()
                                ready = query(event)
                                if ready or clock() >= deadline:
                                    break
                        finally:
                            self._spinners -= 1
            except BaseException:
                give_back(driver, pool, event)
                raise
            if ready:
                self._completed_here += 1
                history.learn(clock() - started)
                give_back(driver, pool, event)
                return
        elif started is None:
            started = recorded  # a wait given no start began at its record
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
                await self._park(point)
        finally:
            self._leave(point)
        if point.error is not None:
            point._raise_if_failed()
        self._completed_here += 1

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
            raise _busy_elsewhere()
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

    def _query(self, point: Point) -> bool:
        try:
            ready = point.driver.event_query(point.event)
        except AiocudasemError as exc:
            self._finish(point, exc)
            return True
        if ready:
            self._succeed(point)
        return ready

    def _succeed(self, point: Point) -> None:
        """``point``'s work completed: remember how long it took, and finish it."""
        point.history.learn(time.perf_counter() - point.started)
        self._finish(point, None)

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
        self._spinners += 1
        try:
            while True:
                await checkpoint()
                if point.done or query(point) or clock() >= deadline:
                    return
        finally:
            self._spinners -= 1

    def _may_own(self, point: Point) -> bool:
        """Whether this loop may arm and park on ``point``: no other open loop's notifier
        has it. One whose loop has ended loses it here, and so does one that nobody there
        waits for any more whose host function has fired already (its loop has not collected
        it yet: busy, or not running): the work is complete, and a query here sees it."""
        ref = point.owner
        if ref is None or ref is self._ref:
            return True
        owner = ref()
        if (
            owner is not None
            and not owner.closed
            and not (point.waiting == 0 and point.token and owner._c.fired(point.token))
        ):
            return False
        # The other loop's records of it (its chain, its armed token) stay: when it collects
        # the token it finds the point no longer its own and leaves it alone.
        point.owner = None
        point.token = 0
        return True

    def _arm(self, point: Point) -> None:
        """Make sure ``point`` will be woken: join its stream's chain, and launch a host
        function for it if the chain has none outstanding. Raises ``BusyResourceError`` if
        another loop armed it meanwhile (``wait()`` checks first, but a wait that spins or
        passes a checkpoint before it arms can meet a loop that armed it in between): parked
        here, this loop's coroutines would wait for a host function that reports to the
        other loop, and that loop would wake them from its own thread."""
        if point.done:
            return
        if not self._may_own(point):
            raise _busy_elsewhere()
        if point.token:
            return
        if self.closed:
            raise anyio.ClosedResourceError("the event loop's notifier is closed")
        point.owner = self._ref
        key = (point.driver, point.stream)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = {}
        chain[point] = None
        if key not in self._heads:
            self._launch(point)

    def _launch(self, point: Point) -> None:
        drv = point.driver
        token = next(self._tokens)
        user = self._c.arm(token)
        try:
            # The wake strategy in force (see _wake) enqueues the host function; a foreign
            # event's point (a negative stream key, see _foreign) has no work stream to launch
            # it on, so it always takes the side stream.
            wake = _tuning.current.wake if point.stream >= 0 else "side_stream"
            _STRATEGIES[wake].launch(drv, point.device, point.stream, point.event, user)
        except AiocudasemError as exc:
            self._c.disarm(user)
            self._unchain(point)
            self._finish(point, exc)
            self._advance((drv, point.stream))  # the others still need a host function
            return
        except BaseException:
            # Not the driver's refusal (KeyboardInterrupt, say): the host function may have
            # been enqueued already, and freeing its node would let it write freed memory.
            # Leave the node armed; at worst it leaks.
            raise
        point.token = token
        self._armed[token] = point
        self._heads[(drv, point.stream)] = point

    def _unchain(self, point: Point) -> None:
        key = (point.driver, point.stream)
        chain = self._chains.get(key)
        if chain is not None:
            chain.pop(point, None)
            if not chain:
                del self._chains[key]

    def _advance(self, key: tuple[Driver, int]) -> None:
        """The chain's host function fired: finish every point that is done, and give the
        oldest remaining one the next host function."""
        chain = self._chains.get(key)
        if chain is None or key in self._heads:
            return
        remaining = [p for p in chain if not p.done and not self._query(p)]
        if not remaining:
            self._chains.pop(key, None)
            return
        remaining.sort(key=lambda p: p.seq)
        self._chains[key] = dict.fromkeys(remaining)
        self._launch(remaining[0])

    async def _park(self, point: Point, joined: bool = False) -> None:
        """Sleep until ``point`` is done, as the loop's drainer whenever nobody else is.
        ``joined``: this coroutine is a waiter of ``point`` from here on (see :meth:`wait`):
        it leaves the point at the end, and raises what the point failed with."""
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
            try:
                while not point.done:
                    if self.closed:
                        raise anyio.ClosedResourceError(
                            "the event loop is shutting down: its notifier is closed"
                        )
                    if not self._draining:
                        await self._drain(point)
                    elif sleeper.done():
                        # Woken to take over the drainer role, which someone took first: sleep
                        # again.
                        del sleepers[sleeper]
                        sleeper = self._new_sleeper()
                        sleepers[sleeper] = next(self._park_order)
                        self._candidate(sleeper, point)
                    else:
                        await sleeper
                        if self._heir is sleeper:
                            self._heir = None
            finally:
                # The coroutine leaves: settle its accounts, deliver what is queued and hand
                # the drainer role on.
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

    async def _drain(self, point: Point) -> None:
        """Be the drainer until ``point`` is done: sleep on the fd, deliver completions."""
        self._draining = True
        self._drain_point = point
        self._stop_fd_watch()  # the fd is the drainer's now
        try:
            while not point.done and not self.closed:
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
            self._drain_scope = None

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

    def _check_faults(self) -> None:
        """Fail every chain whose device reports a sticky error (or can no longer be used)."""
        checked: dict[tuple[int, int], AiocudasemError | None] = {}
        for key, chain in list(self._chains.items()):
            if not chain:
                continue
            head = next(iter(chain))
            dev = (id(head.driver), head.device)
            if dev not in checked:
                try:
                    head.driver.check_health(head.device)
                    checked[dev] = None
                except AiocudasemError as exc:
                    checked[dev] = exc
            err = checked[dev]
            if err is None:
                continue
            # The host functions will never run: drop the chain. Their C nodes are leaked on
            # purpose (see _notify.c), and so are the events of armed points.
            del self._chains[key]
            self._heads.pop(key, None)
            for point in chain:
                if point.token:
                    self._armed.pop(point.token, None)
                    point.token = 0
                    point.pool = None  # its event stays with the dead context
                self._finish(point, err)


def _busy_elsewhere() -> anyio.BusyResourceError:
    exc = anyio.BusyResourceError("waiting on")
    exc.args = (
        "this point is being awaited in another event loop; await an Event from one event "
        "loop at a time",
    )
    return exc


_live_notifiers: weakref.WeakSet[Notifier] = weakref.WeakSet()

_HISTORY_LIMIT = 4096  # wait histories of handles without a Stream that a notifier keeps


async def _lifetime(ref: weakref.ref[Notifier]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        notifier = ref()
        if notifier is not None:
            notifier.close()
