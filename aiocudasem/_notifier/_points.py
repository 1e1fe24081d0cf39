"""A point: an event recorded on a work stream, and the coroutines waiting for it; and a
stream's wait history, which decides how long its waits spin."""

from __future__ import annotations

import itertools
import math
import time
import weakref
from typing import TYPE_CHECKING

from .. import _hotpath
from ._pools import give_back

if TYPE_CHECKING:
    from .._driver import Driver
    from .._errors import AiocudasemError
    from ._chains import Chains
    from ._loops import Sleeper

__all__ = ("History", "Point")


#: How long the recent waits on one stream took, which sets how long the next one spins
#: (``spin_window()``, ``learn(took)``), and the newest point parked on it (``newest``), which
#: later waits may share. A :class:`~aiocudasem.Stream` keeps its own, which its waits and the
#: points of its events share; the notifier keeps one per stream handle for the library's
#: private streams and for foreign events. In C (``_hotpath.History``): every await of short
#: work updates one. Its rules are documented there and in docs/architecture.md.
History = _hotpath.History


class Point:
    """A recorded event that coroutines wait for. A pooled event goes back to its pool once
    nobody can query it any more."""

    __slots__ = (
        "device",
        "done",
        "driver",
        "error",
        "event",
        "history",
        "owner",
        "pool",
        "recorded",
        "seq",
        "sleepers",
        "started",
        "stream",
        "token",
        "waiting",
    )

    _seq = itertools.count()

    def __init__(
        self,
        driver: Driver,
        device: int,
        stream: int,
        event: int,
        pool: list[int] | None,
        history: History,
    ) -> None:
        self.driver = driver
        self.device = device
        self.stream = stream
        self.event = event
        self.pool = pool  # where the event goes once nobody can query it, if it is pooled
        self.history = history  # the stream's, which learns how long this wait took
        self.done = False
        self.error: AiocudasemError | None = None
        self.token = 0  # non-zero once the host function is armed
        # The notifier whose chain or host function has it, weakly: a loop that ends without
        # finalizing its async generators must not keep the point tied to it forever.
        self.owner: weakref.ref[Chains] | None = None
        # The sleepers of the coroutines parked on it, each with its place in the order in
        # which the loop's coroutines parked (a dict: O(1) to leave).
        self.sleepers: dict[Sleeper, int] = {}
        self.waiting = 0  # coroutines inside wait()
        self.started = time.perf_counter()
        # When its event was recorded, where that matters (a point that waits may share):
        # the first perf_counter() after the record, with no checkpoint between.
        self.recorded = -math.inf
        self.seq = next(Point._seq)  # creation order, which is FIFO order within a stream

    def _finish(self, error: AiocudasemError | None) -> dict[Sleeper, int]:
        """Mark the point done (failed with ``error`` if not None) and release its event.
        Returns its sleepers, which the caller wakes (see ``Parking._finish``)."""
        if self.done:
            return {}
        self.done = True
        self.error = error
        self.owner = None
        sleepers = self.sleepers
        self.sleepers = {}
        self._release_event()
        return sleepers

    def _release_event(self) -> None:
        """Nobody will query the event any more: a pooled one goes back to its pool, and no
        later wait may share the point (the stream's history forgets it, which also breaks the
        reference cycle between them)."""
        if self.history.newest is self:
            self.history.newest = None
        pool = self.pool
        if pool is not None:
            self.pool = None
            give_back(self.driver, pool, self.event)

    def _raise_if_failed(self) -> None:
        err = self.error
        if err is not None:
            raise err._for_waiter()
