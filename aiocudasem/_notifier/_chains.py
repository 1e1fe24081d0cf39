"""The host-function side of a loop's notifier: which points have a host function armed, the
chains of parked points behind them per work stream, and what happens when one fires or a
device faults. :class:`Chains` is the lowest layer of :class:`~._loop.Notifier`: the parking
layer (``_parking``) finishes the points and wakes their sleepers, the notifier (``_loop``)
waits.

Parked points are chained per work stream, and only the oldest of each chain has a host
function: streams are FIFO, so when it fires the others are checked with a query, and a crowd
of waiters on one stream costs one host function, not one each. The one exception is a point
armed in its stream (:meth:`Chains.arm_in_stream`, a host stage's): its host function is on the
work stream itself, so that it fires when the stream gets there, even though the stream then
waits for the loop to act; on the side stream it could queue behind a later point's wait for
that very work."""

from __future__ import annotations

import itertools
import time
import weakref
from typing import TYPE_CHECKING

import anyio

from .. import _notify
from .._errors import AiocudasemError
from . import _tuning
from ._wake import STRATEGIES as _STRATEGIES

if TYPE_CHECKING:
    from .._driver import Driver
    from ._points import Point

__all__ = ("Chains", "busy_elsewhere")


class Chains:
    """The C queue and fd of one loop, the armed points and their chains."""

    def __init__(self) -> None:
        self._c = _notify.Notifier()
        self._fd = self._c.fileno()
        self._tokens = itertools.count(1)
        self._armed: dict[int, Point] = {}  # token -> the point its host function follows
        # Parked points per work stream, and each chain's armed point (its head).
        self._chains: dict[tuple[Driver, int], dict[Point, None]] = {}
        self._heads: dict[tuple[Driver, int], Point] = {}
        self.closed = False
        self._ref = weakref.ref(self)

    def _finish(self, point: Point, error: AiocudasemError | None) -> None:
        """Finish ``point`` (done, or failed with ``error``) and wake its sleepers: the
        parking layer's."""
        raise NotImplementedError

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
            raise busy_elsewhere()
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

    def arm_in_stream(self, point: Point) -> None:
        """Arm ``point``, whose event was just recorded, with its host function launched on
        its work stream right behind the event, whatever ``configure(wake=...)`` says: it fires
        once the stream reaches this position. For a point that the stream itself waits for
        once it completes (a host stage's turn, ``_stages``): a host function on the side
        stream could queue behind the wait of a later point, whose work waits for the stage.
        The point joins its stream's chain as any armed point, and heads it if nothing does.
        Raises ``anyio.ClosedResourceError`` once closed, and what the launch raises
        (``AiocudasemError``), having armed nothing."""
        if self.closed:
            raise anyio.ClosedResourceError("the event loop's notifier is closed")
        drv = point.driver
        token = next(self._tokens)
        user = self._c.arm(token)
        try:
            _STRATEGIES["work_stream"].launch(drv, point.device, point.stream, point.event, user)
        except AiocudasemError:
            self._c.disarm(user)
            raise
        point.owner = self._ref
        point.token = token
        self._armed[token] = point
        key = (drv, point.stream)
        self._chains.setdefault(key, {})[point] = None
        self._heads.setdefault(key, point)

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
        first = remaining[0]
        if first.token:  # armed in its stream already (arm_in_stream)
            self._heads[key] = first
        else:
            self._launch(first)

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


def busy_elsewhere() -> anyio.BusyResourceError:
    exc = anyio.BusyResourceError("waiting on")
    exc.args = (
        "this point is being awaited in another event loop; await an Event from one event "
        "loop at a time",
    )
    return exc
