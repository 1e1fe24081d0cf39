"""The pools the notifier shares across event loops: timing-free events per driver and device,
one side stream per work stream, and the private streams of host-side semaphore waits. All are
keyed by the driver object, weakly."""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from .. import _hotpath, _release
from .._errors import AiocudasemError

if TYPE_CHECKING:
    from .._driver import Driver

__all__ = (
    "destroy_stream",
    "event_pool",
    "give_back",
    "host_wait_streams",
    "record_pooled",
    "side_streams",
    "take_event",
)


class _EventPool:
    """Reusable timing-free events per driver and device. Re-recording an event is always
    allowed by CUDA, and cuStreamWaitEvent captures the state at call time, so an event can go
    back to the pool as soon as no waiter will query it again."""

    #: Free events kept per pool; give_back() destroys the rest, and so does the event path
    #: in C (``_hotpath.spin_recorded``), which is handed this limit below.
    _LIMIT: Final = 4096

    def __init__(self) -> None:
        # Keyed by the driver object, weakly: an id() could be reused by a later driver.
        self._free: weakref.WeakKeyDictionary[Driver, dict[int, list[int]]] = (
            weakref.WeakKeyDictionary()
        )

    def free_list(self, driver: Driver, device: int) -> list[int]:
        """The free events of ``driver``'s ``device``; callers may keep the list."""
        return self._free.setdefault(driver, {}).setdefault(device, [])

    def total(self) -> int:
        """How many events are pooled, across drivers and devices."""
        while True:
            try:  # another thread may add a driver or a device meanwhile: then look again
                per_driver = list(self._free.values())
                return sum(len(free) for d in per_driver for free in list(d.values()))
            except RuntimeError:
                continue

    def _after_fork(self) -> None:
        # The parent's handles mean nothing here; lists already handed out keep theirs, and
        # their driver refuses them.
        self._free = weakref.WeakKeyDictionary()


def take_event(driver: Driver, device: int, free: list[int]) -> int:
    if free:
        try:
            return free.pop()
        except IndexError:  # another thread took the last one
            pass
    return driver.event_create(device)


def record_pooled(driver: Driver, device: int, free: list[int], stream: int) -> int:
    """Take a pooled event of ``device`` (a new one if none is free) and record it on
    ``stream``; if recording fails, the event goes back to ``free`` and the error propagates."""
    event = take_event(driver, device, free)
    try:
        driver.event_record(event, stream)
    except BaseException:
        free.append(event)
        raise
    return event


def give_back(driver: Driver, free: list[int], event: int) -> None:
    """Return a pooled event that nobody will query again to its free list (or destroy it, if
    the list is full)."""
    if len(free) < _EventPool._LIMIT:
        free.append(event)
    else:
        driver.event_destroy(event)


#: How many free private streams a device keeps for host-side waits.
_KEEP: Final = 64
#: How many private streams of abandoned waits a device keeps to reuse once they are idle;
#: beyond it the oldest is destroyed (the driver frees it once its wait completes).
_BLOCKED_LIMIT: Final = 1024
#: How many blocked streams a take() (or a spare side stream's lookup) looks at before it
#: creates a stream: the oldest first,
#: and the still blocked ones go to the back, so that a stream that never passes its wait
#: does not hide the others.
_LOOK: Final = 8
#: The least time between two full sweeps of the blocked streams (or spare side streams),
#: which a completed wait makes so that streams freed by the same progress go at once.
_SWEEP_EVERY: Final = 0.005


class _Blocked:
    """Streams of one device that may still be blocked, oldest first: private streams whose
    waits were abandoned (each with its wait's key, or None), or spare side streams."""

    __slots__ = ("last_sweep", "streams")

    def __init__(self) -> None:
        self.streams: OrderedDict[int, object] = OrderedDict()
        self.last_sweep = 0.0


def _look(
    driver: Driver,
    blocked: _Blocked,
    budget: int,
    destroy: Callable[[int], None],
    first: bool = False,
) -> list[int]:
    """Take up to ``budget`` of the oldest streams of ``blocked`` off the list; return the
    idle ones (``first``: the first idle one only) and put the others at the back. One the
    driver refuses to query (its device has faulted) is given to ``destroy``, quietly. Called
    with the caller's lock held: queries never block."""
    streams = blocked.streams
    idle: list[int] = []
    for _ in range(min(budget, len(streams))):
        stream, key = streams.popitem(last=False)
        try:
            ready = driver.stream_query(stream)
        except AiocudasemError:
            _release.release_quietly(functools.partial(destroy, stream), "a faulted stream")
            continue
        if ready:
            idle.append(stream)
            if first:
                break
        else:
            streams[stream] = key
    return idle


def _nothing(_side: int) -> None:
    pass


class _SideStreams:
    """One side stream per work stream, shared by every loop of the process. A side stream
    carries only event waits and host functions, so a slow host function never delays the
    work stream, and waits on different work streams never queue behind each other.

    The lock is never taken from a finalizer (finalizers defer to :mod:`._release`), so the
    garbage collector running inside a locked section cannot deadlock on it."""

    _LIMIT: Final = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: weakref.WeakKeyDictionary[Driver, OrderedDict[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        # Per driver and device: side streams that serve no work stream any more (see
        # retire()), oldest first, idle or still busy with a host function behind blocked work.
        self._spare: weakref.WeakKeyDictionary[Driver, dict[int, _Blocked]] = (
            weakref.WeakKeyDictionary()
        )

    def enqueue_on(
        self, driver: Driver, device: int, work: int, enqueue: Callable[[int], object]
    ) -> None:
        """Call ``enqueue(side)`` with the side stream that serves ``work`` on ``device``, made
        if there is none yet, and keep the lock meanwhile: another thread's eviction or
        ``drop`` cannot destroy the side stream between the lookup and the enqueue (the driver
        frees a destroyed stream once the work on it completes). ``enqueue`` makes
        non-blocking driver calls only."""
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.get(work)
            if side is not None:
                table.move_to_end(work)  # type: ignore[union-attr]
                enqueue(side)
                return
            new = self._idle_spare(driver, device)
        if new is None:
            new = driver.stream_create(device, True, 0)  # outside the lock: it may take a while
        evicted: int | None = None
        try:
            with self._lock:
                table = self._streams.setdefault(driver, OrderedDict())
                side = table.get(work)
                if side is not None:  # another thread made one meanwhile
                    evicted = new
                    table.move_to_end(work)
                else:
                    side = table[work] = new
                    if len(table) > self._LIMIT:
                        evicted = table.popitem(last=False)[1]
                enqueue(side)
        finally:
            if evicted is not None:
                # Destroying returns at once; host functions queued on it still run. Quietly:
                # a failure here (a faulted device's side stream, say) must not fail a launch
                # whose host function is enqueued already, since the caller would then free the
                # node that the host function writes to.
                _release.release_quietly(
                    functools.partial(driver.stream_destroy, evicted), "an evicted side stream"
                )

    def ensure(self, driver: Driver, device: int, work: int) -> None:
        """Make the side stream that serves ``work`` now, if there is none yet.

        A :class:`~aiocudasem.Stream` makes its side stream when it is opened or adopted, not
        at its first parked wait: creating a CUDA stream can block while host functions are
        pending behind work that cannot progress (on an H200, driver 580: the 14th or 15th
        ``cuStreamCreate`` with 13 or 14 host functions queued behind streams that wait for a
        host timeline), and while it is blocked, so are other threads' ``cuEventRecord``,
        ``cuLaunchHostFunc``, ``cuEventCreate`` and ``cuStreamDestroy``. Made in the middle
        of an await, it would freeze the event loop until that work progresses, and for good
        if the loop itself was to signal it."""
        self.enqueue_on(driver, device, work, _nothing)

    def missing(self, driver: Driver, works: list[int]) -> list[int]:
        """Those of ``works`` that have no side stream now, looked up under one lock."""
        with self._lock:
            table = self._streams.get(driver)
            if table is None:
                return list(works)
            return [w for w in works if w not in table]

    def drop(self, driver: Driver, work: int) -> None:
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.pop(work, None)
        if side is not None:
            driver.stream_destroy(side)

    def record_behind(self, driver: Driver, work: int, event: int) -> bool:
        """Record ``event`` on the side stream that serves ``work``, behind the host functions
        queued there; False if there is none. From any thread: the lock keeps the side stream
        from being destroyed meanwhile (``drop`` and eviction remove it under the lock first)."""
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.get(work)
            if side is None:
                return False
            driver.event_record(event, side)
            return True

    def retire(self, driver: Driver, device: int, work: int) -> None:
        """``work`` (a foreign event's key, see ``_foreign``) needs its side stream no more,
        but a host function may still be queued there behind work that never completes. Keep
        it as a spare, which serves a later key once it is idle (a new key would otherwise
        make a stream per abandoned wait); past :data:`_LIMIT` spares, destroy the oldest
        (the driver frees it once its work completes)."""
        oldest = None
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.pop(work, None)
            if side is None:
                return
            per_driver = self._spare.setdefault(driver, {})
            spare = per_driver.get(device)
            if spare is None:
                spare = per_driver[device] = _Blocked()
            spare.streams[side] = None
            if len(spare.streams) > self._LIMIT:
                oldest = spare.streams.popitem(last=False)[0]
        if oldest is not None:
            _release.release_quietly(
                functools.partial(driver.stream_destroy, oldest), "a spare side stream"
            )

    def _idle_spare(self, driver: Driver, device: int) -> int | None:
        """An idle spare side stream of ``device``, taken off the spares, or None; looks at
        :data:`_LOOK` of them at most. Called with the lock held: queries never block."""
        spare = self._spare.get(driver, {}).get(device)
        if spare is None or not spare.streams:
            return None
        idle = _look(driver, spare, _LOOK, driver.stream_destroy, first=True)
        return idle[0] if idle else None

    def sweep(self, driver: Driver, device: int) -> None:
        """Destroy the spare side streams of ``device`` that are idle now, at most once per
        :data:`_SWEEP_EVERY`: a wait that completed found the device's work progressing."""
        spare = self._spare.get(driver, {}).get(device)
        if spare is None or not spare.streams:
            return
        now = time.monotonic()
        with self._lock:
            if now - spare.last_sweep < _SWEEP_EVERY:
                return
            spare.last_sweep = now
            idle = _look(driver, spare, len(spare.streams), driver.stream_destroy)
        for side in idle:
            _release.release_quietly(
                functools.partial(driver.stream_destroy, side), "a spare side stream"
            )

    def count(self, driver: Driver) -> int:
        with self._lock:
            return len(self._streams.get(driver, ())) + sum(
                len(s.streams) for s in self._spare.get(driver, {}).values()
            )

    def total(self) -> int:
        """How many side streams exist, across drivers, spares included."""
        with self._lock:
            return sum(len(table) for table in self._streams.values()) + sum(
                len(s.streams) for d in self._spare.values() for s in d.values()
            )

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._streams = weakref.WeakKeyDictionary()
        self._spare = weakref.WeakKeyDictionary()


class _HostWaitStreams:
    """Private streams for host-side semaphore awaits, reused once a wait has completed.

    A cancelled wait's stream may stay blocked for a long time, perhaps forever, so it is not
    handed out again as it is; but destroying it and creating another for the next wait costs
    two streams per cancellation (the private stream and its side stream), and creating a
    CUDA stream can block while host functions are queued behind blocked work (see
    ``_SideStreams.ensure``), which is just what abandoned waits leave. So it is *parked* with
    its side stream, and goes back to the free ones once the driver reports it idle: looked
    at when a wait needs a stream and none is free, and when a wait completes. A wait may name
    a *key*: a later wait with an equal key may go behind a parked stream of that key at once,
    blocked or not, because it waits for the same thing (a retry of ``wait_value(n)`` on one
    timeline after a timeout, say), so that a retry loop reuses one stream and one host
    function instead of making a stream per attempt."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: weakref.WeakKeyDictionary[Driver, dict[int, list[int]]] = (
            weakref.WeakKeyDictionary()
        )
        self._blocked: weakref.WeakKeyDictionary[Driver, dict[int, _Blocked]] = (
            weakref.WeakKeyDictionary()
        )

    def take(self, driver: Driver, device: int, key: object = None) -> int:
        """A private stream of ``device`` for a wait with ``key`` (see the class): a parked
        stream of that key, else a free one, else a parked one that has become idle, else a
        new one."""
        with self._lock:
            blocked = self._blocked.get(driver, {}).get(device)
            if key is not None and blocked is not None:
                for stream, parked_key in blocked.streams.items():
                    if parked_key == key:
                        del blocked.streams[stream]
                        return stream
            free = self._free.get(driver, {}).get(device)
            if free:
                return free.pop()
            if blocked is not None and blocked.streams:
                idle = _look(
                    driver, blocked, _LOOK, functools.partial(destroy_stream, driver), first=True
                )
                if idle:
                    return idle[0]
        return driver.stream_create(device, True, 0)

    def park(self, driver: Driver, device: int, stream: int, key: object = None) -> None:
        """Keep ``stream``, whose wait (with ``key``) was abandoned and may still block it,
        until it is idle; past :data:`_BLOCKED_LIMIT` parked streams, destroy the oldest."""
        with self._lock:
            per_driver = self._blocked.setdefault(driver, {})
            blocked = per_driver.get(device)
            if blocked is None:
                blocked = per_driver[device] = _Blocked()
            blocked.streams[stream] = key
            oldest = None
            if len(blocked.streams) > _BLOCKED_LIMIT:
                oldest = blocked.streams.popitem(last=False)[0]
        if oldest is not None:
            _destroy_quietly(driver, oldest)

    def sweep(self, driver: Driver, device: int) -> None:
        """Hand back the parked streams of ``device`` that are idle now (destroying those the
        free ones do not need), at most once per :data:`_SWEEP_EVERY`."""
        blocked = self._blocked.get(driver, {}).get(device)
        if blocked is None or not blocked.streams:
            return
        now = time.monotonic()
        with self._lock:
            if now - blocked.last_sweep < _SWEEP_EVERY:
                return
            blocked.last_sweep = now
            idle = _look(
                driver, blocked, len(blocked.streams), functools.partial(destroy_stream, driver)
            )
        free = self._free.get(driver, {}).get(device)
        for stream in idle:
            if free:  # the free ones serve the next waits: this one is surplus
                _destroy_quietly(driver, stream)
            else:
                self.give(driver, device, stream)
                free = self._free.get(driver, {}).get(device)

    def parked(self, driver: Driver) -> int:
        """How many streams of abandoned waits ``driver`` has parked, idle or not."""
        with self._lock:
            return sum(len(b.streams) for b in self._blocked.get(driver, {}).values())

    def reserve(
        self,
        driver: Driver,
        device: int,
        prepare: Callable[[Driver, int, int], None],
        prepare_new: Callable[[Driver, int, int], None],
    ) -> None:
        """Add one private stream to ``device``'s free ones, with what the wake strategy needs
        for it (its side stream), unless :data:`_KEEP` are free already. Called when a
        semaphore or a host timeline is made, a synchronous call, so that host-side waits,
        one at a time on each of up to that many semaphores, never create a stream in the
        middle of an await, when creating one could block (see ``_SideStreams.ensure``).
        The free ones get their side streams back if an eviction took them. Best effort: a
        failure here is left to the wait itself.

        ``prepare`` and ``prepare_new`` are the wake strategy's ``_wake.prepare_stream`` and
        ``_wake.prepare_new_stream``, which ``_wake.reserve_host_wait_stream`` passes: this
        module comes before ``_wake`` and does not import it."""
        self.sweep(driver, device)
        with self._lock:
            free = self._free.setdefault(driver, {}).setdefault(device, [])
        for stream in side_streams.missing(driver, list(free)):
            with self._lock:
                try:
                    free.remove(stream)  # this thread's now: nobody takes (or destroys) it
                except ValueError:
                    continue  # taken by another thread's wait
            try:
                prepare(driver, device, stream)
            except AiocudasemError:
                pass
            self._give_quietly(driver, device, stream)
        if len(free) >= _KEEP:
            return
        try:
            stream = driver.stream_create(device, True, 0)
        except AiocudasemError:
            return
        try:
            prepare_new(driver, device, stream)  # destroyed if that fails
        except AiocudasemError:
            return
        self._give_quietly(driver, device, stream)

    def give(self, driver: Driver, device: int, stream: int) -> None:
        """Keep ``stream`` for later waits, or destroy it if :data:`_KEEP` are kept already.
        One without a side stream (made during a wait that did not park) goes first in line,
        and ``take()`` pops from the end: the others are handed out first, so that a wait
        that parks finds its side stream made."""
        without_side = bool(side_streams.missing(driver, [stream]))
        with self._lock:
            free = self._free.setdefault(driver, {}).setdefault(device, [])
            surplus = len(free) >= _KEEP
            if surplus:
                pass
            elif without_side:
                free.insert(0, stream)
            else:
                free.append(stream)
        if surplus:
            destroy_stream(driver, stream)

    def _give_quietly(self, driver: Driver, device: int, stream: int) -> None:
        try:
            self.give(driver, device, stream)
        except AiocudasemError:
            pass  # destroying a surplus stream failed: reserve() is best effort

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._free = weakref.WeakKeyDictionary()
        self._blocked = weakref.WeakKeyDictionary()


def _destroy_quietly(driver: Driver, stream: int) -> None:
    try:
        destroy_stream(driver, stream)
    except AiocudasemError:
        pass  # a faulted device: the stream is gone with its context


event_pool = _EventPool()
_hotpath.set_pool_limit(_EventPool._LIMIT)
side_streams = _SideStreams()
host_wait_streams = _HostWaitStreams()


def destroy_stream(driver: Driver, handle: int) -> None:
    """Destroy a work stream and the side stream that serves it (CUDA may hand the same handle
    to a later stream, which must not inherit a side stream with someone else's work)."""
    try:
        side_streams.drop(driver, handle)
    finally:
        driver.stream_destroy(handle)


def _after_fork_in_child() -> None:
    """CUDA cannot be used in a forked child, and the parent's handles mean nothing there."""
    event_pool._after_fork()
    side_streams._after_fork()
    host_wait_streams._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
