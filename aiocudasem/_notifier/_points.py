"""A point: an event recorded on a work stream, and the coroutines waiting for it."""

from __future__ import annotations

import itertools
import time
import weakref
from typing import TYPE_CHECKING

import anyio

from ._pools import give_back

if TYPE_CHECKING:
    from .._driver import Driver
    from .._errors import AiocudasemError
    from ._loop import Notifier

__all__ = ("Point",)


class Point:
    """A recorded event that coroutines wait for. A pooled event goes back to its pool once
    nobody can query it any more."""

    __slots__ = (
        "device",
        "done",
        "driver",
        "error",
        "event",
        "owner",
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
        # The notifier whose chain or host function has it, weakly: a loop that ends without
        # finalizing its async generators must not keep the point tied to it forever.
        self.owner: weakref.ref[Notifier] | None = None
        self.sleepers: list[anyio.Event] = []
        self.waiting = 0  # coroutines inside wait()
        self.started = time.perf_counter()
        self.seq = next(Point._seq)  # creation order, which is FIFO order within a stream

    def _finish(self, error: AiocudasemError | None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        self.owner = None
        for s in self.sleepers:
            s.set()
        self.sleepers.clear()
        self._release_event()

    def _release_event(self) -> None:
        pool = self.pool
        if pool is not None:
            self.pool = None
            give_back(self.driver, pool, self.event)

    def _raise_if_failed(self) -> None:
        err = self.error
        if err is not None:
            raise err._for_waiter()
