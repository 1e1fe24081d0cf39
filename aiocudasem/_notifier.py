"""Waiting for a point in a stream without blocking the event loop.

A *point* is an event recorded on a work stream. Awaiting it goes through up to two phases:

1. **Spin** (short and adaptive): query the event between checkpoints. Only streams whose recent
   waits were short spin, for at most ``Tuning.spin_limit`` seconds, and only ``max_spinners``
   coroutines at a time, so long waits and crowds of waiters cost no CPU.
2. **Park**: arm the C host function. It runs on a *side stream* that waits for the event, so
   the work stream never stalls on a host function. The host function appends a token to the C
   queue and wakes the loop's one fd. One of the parked coroutines, the *drainer*, waits on the
   fd and wakes the others; when it leaves (done or cancelled) it hands the role to another.

The drainer also runs the watchdog: CUDA never calls a host function after a context error, so
at least every ``watchdog`` seconds while coroutines are parked it asks the driver whether the
devices they wait on have faulted, and fails their points with :class:`DeviceFaultError`.

There is one :class:`Notifier` per event-loop run (an anyio ``RunVar``), with one fd.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from . import _notify
from ._errors import AiocudasemError, DeviceFaultError

if TYPE_CHECKING:
    from ._driver import Driver

__all__ = ("Point", "Tuning", "configure", "current_notifier", "event_pool", "side_streams")


@dataclass(frozen=True, slots=True)
class Tuning:
    """Knobs of the wait strategy. Change them with :func:`aiocudasem.configure`."""

    #: Longest a coroutine spins (queries between checkpoints) before parking, in seconds.
    #: Streams whose recent waits took longer than this never spin. 0 disables spinning.
    spin_limit: float = 250e-6
    #: At most this many coroutines per event loop spin at once; the rest park at once.
    max_spinners: int = 8
    #: How often a parked drainer checks the devices it waits on for a sticky error, in seconds.
    watchdog: float = 0.05


_tuning = Tuning()


def configure(
    *,
    spin_limit: float | None = None,
    max_spinners: int | None = None,
    watchdog: float | None = None,
) -> Tuning:
    """Change the wait strategy for the whole process and return the new settings.

    Unset arguments keep their value. Raises ``ValueError`` for a negative ``spin_limit``, a
    ``max_spinners`` below 0 or a ``watchdog`` that is not positive.
    """
    global _tuning
    new = _tuning
    if spin_limit is not None:
        if not spin_limit >= 0:
            raise ValueError("spin_limit must be >= 0 seconds")
        new = replace(new, spin_limit=float(spin_limit))
    if max_spinners is not None:
        if not isinstance(max_spinners, int) or max_spinners < 0:
            raise ValueError("max_spinners must be an int >= 0")
        new = replace(new, max_spinners=max_spinners)
    if watchdog is not None:
        if not watchdog > 0:
            raise ValueError("watchdog must be > 0 seconds")
        new = replace(new, watchdog=float(watchdog))
    _tuning = new
    return new


class _EventPool:
    """Reusable timing-free events per driver and device. Re-recording an event is always
    allowed by CUDA, and cuStreamWaitEvent captures the state at call time, so an event can go
    back to the pool as soon as no waiter will query it again."""

    _LIMIT: Final = 4096

    def __init__(self) -> None:
        # Keyed by the driver object, weakly: an id() could be reused by a later driver.
        self._free: weakref.WeakKeyDictionary[Driver, dict[int, list[int]]] = (
            weakref.WeakKeyDictionary()
        )

    def free_list(self, driver: Driver, device: int) -> list[int]:
        """The free events of ``driver``'s ``device``; callers may keep the list."""
        return self._free.setdefault(driver, {}).setdefault(device, [])


def take_event(driver: Driver, device: int, free: list[int]) -> int:
    if free:
        try:
            return free.pop()
        except IndexError:  # another thread took the last one
            pass
    return driver.event_create(device)


class _SideStreams:
    """One side stream per work stream, shared by every loop of the process. A side stream
    carries only event waits and host functions, so a slow host function never delays the
    work stream, and waits on different work streams never queue behind each other."""

    _LIMIT: Final = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: weakref.WeakKeyDictionary[Driver, OrderedDict[int, int]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, driver: Driver, device: int, work: int) -> int:
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.get(work)
            if side is not None:
                table.move_to_end(work)  # type: ignore[union-attr]
                return side
        side = driver.stream_create(device, True, 0)
        evicted: int | None = None
        with self._lock:
            table = self._streams.setdefault(driver, OrderedDict())
            existing = table.get(work)
            if existing is not None:  # lost a race with another thread
                evicted, side = side, existing
            else:
                table[work] = side
                if len(table) > self._LIMIT:
                    evicted = table.popitem(last=False)[1]
        if evicted is not None:
            # Destroying returns at once; queued host functions still run.
            driver.stream_destroy(evicted)
        return side

    def drop(self, driver: Driver, work: int) -> None:
        with self._lock:
            table = self._streams.get(driver)
            side = None if table is None else table.pop(work, None)
        if side is not None:
            driver.stream_destroy(side)


event_pool = _EventPool()
side_streams = _SideStreams()


class Point:
    """A recorded event that coroutines wait for. A pooled event goes back to its pool once
    nobody can query it any more."""

    __slots__ = (
        "device",
        "done",
        "driver",
        "error",
        "event",
        "pool",
        "seq",
        "sleepers",
        "started",
        "stream",
        "token",
        "waiting",
    )

    _seq = itertools.count()

    def __init__(
        self, driver: Driver, device: int, stream: int, event: int, pool: list[int] | None
    ) -> None:
        self.driver = driver
        self.device = device
        self.stream = stream
        self.event = event
        self.pool = pool  # where the event goes once nobody can query it, if it is pooled
        self.done = False
        self.error: AiocudasemError | None = None
        self.token = 0  # non-zero once the host function is armed
        self.sleepers: list[anyio.Event] = []
        self.waiting = 0  # coroutines inside wait()
        self.started = time.perf_counter()
        self.seq = next(Point._seq)  # creation order, which is FIFO order within a stream

    def _finish(self, error: AiocudasemError | None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        for s in self.sleepers:
            s.set()
        self.sleepers.clear()
        self._release_event()

    def _release_event(self) -> None:
        pool = self.pool
        if pool is not None:
            self.pool = None
            if len(pool) < _EventPool._LIMIT:
                pool.append(self.event)
            else:
                self.driver.event_destroy(self.event)

    def _raise_if_failed(self) -> None:
        err = self.error
        if err is not None:
            # A fresh exception per waiter, so tracebacks of different tasks don't pile up.
            if isinstance(err, DeviceFaultError):
                raise DeviceFaultError(str(err), err.status, err.name)
            raise type(err)(str(err), err.status)


class Notifier:
    """The per-loop half of the notifier: the C queue and fd, the armed points, the drainer."""

    def __init__(self) -> None:
        self._c = _notify.Notifier()
        self._fd = self._c.fileno()
        self._tokens = itertools.count(1)
        self._armed: dict[int, Point] = {}  # token -> the point its host function follows
        # Parked points per work stream. Only the oldest of each has a host function: streams
        # are FIFO, so when it fires the others are checked with a query, and a crowd of
        # waiters on one stream costs one host function, not one each.
        self._chains: dict[tuple[Driver, int], dict[Point, None]] = {}
        self._heads: dict[tuple[Driver, int], Point] = {}  # the chain's armed point
        self._parked: dict[anyio.Event, None] = {}  # sleeping coroutines, oldest first
        self._drainer = False
        self._spinners = 0
        self._recent: dict[tuple[int, int], float] = {}  # (driver, stream) -> recent wait time
        self._checked = time.monotonic()  # when the watchdog last ran

    def stats(self) -> dict[str, int]:
        """Counters for tests and the benchmarks."""
        out = self._c.stats()
        out["armed"] = len(self._armed)
        out["chained"] = sum(len(c) for c in self._chains.values())
        out["parked"] = len(self._parked)
        return out

    def fileno(self) -> int:
        return self._fd

    # ------------------------------------------------------------------ waiting

    async def wait(self, point: Point) -> None:
        """Wait until ``point`` completes. Always a checkpoint. Raises what the point failed
        with (``DeviceFaultError`` after a device fault). Cancellation abandons the wait
        only: the point stays armed and other waiters keep their wake-ups."""
        # Each path below passes a full checkpoint (the spin loop's, the park's, or the one at
        # the end), so there is no separate cancellation check up front.
        point.waiting += 1
        try:
            scheduled = False
            if not point.done and not point.token:
                scheduled = await self._spin(point)
            if not point.done:
                self._arm(point)
            if not point.done:
                await self._park(point)
            elif not scheduled:
                await anyio.lowlevel.checkpoint()
        finally:
            point.waiting -= 1
            if not point.done and point.waiting == 0 and not point.token:
                # Abandoned without a host function of its own: nobody will query it again.
                self._unchain(point)
                point._release_event()
        point._raise_if_failed()

    def _query(self, point: Point) -> bool:
        try:
            ready = point.driver.event_query(point.event)
        except AiocudasemError as exc:
            point._finish(exc)
            return True
        if ready:
            self._learn(point)
            point._finish(None)
        return ready

    def _learn(self, point: Point) -> None:
        key = (id(point.driver), point.stream)
        took = time.perf_counter() - point.started
        old = self._recent.get(key)
        self._recent[key] = took if old is None else 0.75 * old + 0.25 * took
        if len(self._recent) > 4096:
            self._recent.clear()

    async def _spin(self, point: Point) -> bool:
        """Pass a checkpoint, query the point, then spin if this stream's waits tend to be
        short. The checkpoint comes first: it gives the GPU a moment, so the first query is
        more often the last. Returns True (a schedule point was passed)."""
        await anyio.lowlevel.checkpoint()
        if point.done or self._query(point):
            return True
        tuning = _tuning
        recent = self._recent.get((id(point.driver), point.stream))
        if recent is None:
            window = tuning.spin_limit
        elif recent > tuning.spin_limit:
            return True
        else:
            window = min(tuning.spin_limit, 2.0 * recent + 20e-6)
        if window <= 0 or self._spinners >= tuning.max_spinners:
            return True
        deadline = point.started + window
        self._spinners += 1
        try:
            while True:
                await anyio.lowlevel.checkpoint()
                if point.done or self._query(point) or time.perf_counter() >= deadline:
                    return True
        finally:
            self._spinners -= 1

    def _arm(self, point: Point) -> None:
        """Make sure ``point`` will be woken: join its stream's chain, and launch a host
        function for it if the chain has none outstanding."""
        if point.token or point.done:
            return
        key = (point.driver, point.stream)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = {}
        chain[point] = None
        if key not in self._heads:
            self._launch(point)

    def _launch(self, point: Point) -> None:
        drv = point.driver
        side = side_streams.get(drv, point.device, point.stream)
        token = next(self._tokens)
        user = self._c.arm(token)
        try:
            drv.stream_wait_event(side, point.event)
            drv.launch_host_func(side, _notify.HOST_FN, user)
        except AiocudasemError as exc:
            self._c.disarm(user)
            self._unchain(point)
            point._finish(exc)
            self._advance((drv, point.stream))  # the others still need a host function
            return
        except BaseException:
            self._c.disarm(user)
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

    async def _park(self, point: Point) -> None:
        sleeper = anyio.Event()
        point.sleepers.append(sleeper)
        self._parked[sleeper] = None
        try:
            while not point.done:
                if not self._drainer:
                    self._drainer = True
                    try:
                        await self._drain_once()
                    finally:
                        self._drainer = False
                elif sleeper.is_set():
                    # Woken to take over the drainer role, or spuriously: sleep again.
                    self._parked.pop(sleeper, None)
                    point.sleepers.remove(sleeper)
                    sleeper = anyio.Event()
                    point.sleepers.append(sleeper)
                    self._parked[sleeper] = None
                else:
                    await sleeper.wait()
        finally:
            self._parked.pop(sleeper, None)
            if sleeper in point.sleepers:
                point.sleepers.remove(sleeper)
            if not self._drainer:
                self._hand_off()

    def _hand_off(self) -> None:
        """Wake one parked coroutine so that it becomes the drainer. Sleepers already woken
        are dropped on the way, so a crowd finishing at once costs O(1) each."""
        parked = self._parked
        while parked:
            s = next(iter(parked))
            del parked[s]
            if not s.is_set():
                s.set()
                return

    async def _drain_once(self) -> None:
        period = _tuning.watchdog
        with anyio.move_on_after(max(0.0, self._checked + period - time.monotonic())):
            await anyio.wait_readable(self._fd)
        self._complete(self._c.drain())
        # By elapsed time, so that a busy device cannot postpone the check of a faulted one.
        if time.monotonic() - self._checked >= period:
            self._checked = time.monotonic()
            self._watchdog()

    def _complete(self, tokens: list[int]) -> None:
        armed = self._armed
        for token in tokens:
            point = armed.pop(token, None)
            if point is not None:
                point.token = 0
                key = (point.driver, point.stream)
                if self._heads.get(key) is point:
                    del self._heads[key]
                if not point.done:
                    self._learn(point)
                    point._finish(None)
                self._advance((point.driver, point.stream))

    def _watchdog(self) -> None:
        checked: dict[tuple[int, int], AiocudasemError | None] = {}
        for key, chain in list(self._chains.items()):
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
                    point.pool = None  # its event stays with the dead context
                point._finish(err)


_NOTIFIER: anyio.lowlevel.RunVar[Notifier] = anyio.lowlevel.RunVar("aiocudasem_notifier")


def current_notifier() -> Notifier:
    """The notifier of the running event loop, created on first use."""
    try:
        return _NOTIFIER.get()
    except LookupError:
        n = Notifier()
        _NOTIFIER.set(n)
        return n
