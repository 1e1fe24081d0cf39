"""The steps of a simulated stream: the operations that run no code of the user's (waits,
signals, event records, memory writes), which the simulator completes under its lock."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from ... import _hostword
from ._status import _ILLEGAL_ADDRESS, _U64

if TYPE_CHECKING:
    from .._protocol import SemOp
    from ._core import _Core
    from ._model import _Event, _Semaphore, _Stream
    from ._page import _IpcPage


_I64_SIGN: Final = 1 << 63


class _Step:
    """An operation that runs no code of the user's: a wait, a semaphore signal, an event
    record, a memory write. The simulator completes it under its lock, as soon as it reaches the
    head of its stream and can complete, from whichever thread made that possible; only kernels
    and host functions need the stream's worker thread. So a blocked stream costs no thread,
    and a change wakes only the streams that wait on what changed."""

    __slots__ = ()

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        """Complete if possible and return None, else return the key (see
        ``SimDriver._watchers``) whose change may let it complete. Appends the keys of what it
        changed to ``changed``. Called with the lock held."""
        raise NotImplementedError


class _Polled(_Step):
    """A wait on memory that another process may write, which no in-process change reports:
    the poller looks at it again."""

    __slots__ = ("fresh",)

    def __init__(self) -> None:
        self.fresh = True  # not yet watched: its first polls come fast


class _SemWait(_Step):
    """A batch of external semaphore waits, satisfied in order: a timeline value >= N, or one
    signal of a binary semaphore, consumed."""

    __slots__ = ("blocked", "items", "next")

    def __init__(self, items: list[tuple[_Semaphore, int]]) -> None:
        self.items = items
        self.next = 0  # the first wait not yet satisfied
        self.blocked = False  # counted in SimDriver._blocked

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        items = self.items
        while self.next < len(items):
            sem, value = items[self.next]
            if sem.value < value:
                if not self.blocked:
                    self.blocked = True
                    drv._blocked[s.device] = drv._blocked.get(s.device, 0) + 1
                return sem
            if sem.binary:
                sem.value = 0  # one wait per signal: tested and consumed under the lock
            self.next += 1
        if self.blocked:
            drv._blocked[s.device] -= 1
            changed.append(("blocked", s.device))
        return None


class _Signals(_Step):
    __slots__ = ("items",)

    def __init__(self, items: list[tuple[_Semaphore, int]]) -> None:
        self.items = items

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        for sem, value in self.items:
            if not sem.stuck:
                sem.value = value
                changed.append(sem)
        return None


class _SeqWait(_Step):
    """Wait until stream ``src`` has completed ``seq`` operations (an event's record)."""

    __slots__ = ("seq", "src")

    def __init__(self, src: _Stream | None, seq: int) -> None:
        self.src = src
        self.seq = seq

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        src = self.src
        return None if src is None or src.done >= self.seq else src


class _Stamp(_Step):
    __slots__ = ("event",)

    def __init__(self, event: _Event) -> None:
        self.event = event

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        self.event.stamp = time.perf_counter()
        return None


class _WordWait(_Polled):
    __slots__ = ("address", "value")

    def __init__(self, address: int, value: int) -> None:
        super().__init__()
        self.address = address
        self.value = value

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        if not drv._mapped(s.device, self.address):
            # Unregistered under a pending wait: the GPU's read would fault.
            drv._fault(s.device, _ILLEGAL_ADDRESS)
            return None
        if (_hostword.load(self.address) - self.value) % _U64 < _I64_SIGN:
            return None  # (int64_t)(*address - value) >= 0, as the driver compares
        return ("word", self.address)


class _WordWrite(_Step):
    __slots__ = ("address", "value")

    def __init__(self, address: int, value: int) -> None:
        self.address = address
        self.value = value

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        if not drv._mapped(s.device, self.address):
            drv._fault(s.device, _ILLEGAL_ADDRESS)
            return None
        _hostword.store(self.address, self.value)
        changed.append(("word", self.address))
        return None


class _IpcWait(_Polled):
    """Wait until an interprocess event's record ``target`` has completed, in any process; then,
    for a record (``complete`` set), complete record ``complete``. The wait holds the page: the
    event may be destroyed meanwhile."""

    __slots__ = ("complete", "page", "target")

    def __init__(self, page: _IpcPage, target: int, complete: int | None = None) -> None:
        super().__init__()
        self.page = page
        self.target = target
        self.complete = complete

    def attempt(self, drv: _Core, s: _Stream, changed: list[object]) -> object | None:
        page = self.page
        if not page.reached(self.target):
            return page
        if self.complete is not None:
            # Also after the event was destroyed here: the record still completes, for every
            # other process, as CUDA's does.
            _hostword.advance(page.completed, self.complete)
            changed.append(page)
        return None


def _waits(resolved: list[tuple[_Semaphore, SemOp]]) -> _SemWait:
    # A binary semaphore's wait is for a signal (a value of 1), which it consumes.
    return _SemWait([(sem, 1 if sem.binary else op.value) for sem, op in resolved])


def _signals(resolved: list[tuple[_Semaphore, SemOp]]) -> _Signals:
    return _Signals([(sem, 1 if sem.binary else op.value) for sem, op in resolved])
