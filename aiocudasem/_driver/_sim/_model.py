"""The simulated device's objects: semaphores, streams, events and graph nodes, and the lock
that stands in for the simulator's in a forked child."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from .._protocol import forked_error

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._protocol import SemOp
    from ._page import _IpcPage
    from ._steps import _Step


class _Semaphore:
    __slots__ = ("binary", "exported", "imported", "stuck", "value")

    def __init__(self, binary: bool, initial: int) -> None:
        self.binary = binary
        self.value = initial  # timeline value, or 1/0 for a signalled/unsignalled binary
        self.stuck = False
        self.imported = 0
        self.exported: set[tuple[int, int]] = set()  # the files of its unimported exports


class _ForkedLock:
    """Stands in for the simulator's lock in a forked child."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        raise forked_error(self._name)

    def __exit__(self, *exc: object) -> None:
        return None


class _Stream:
    __slots__ = (
        "capture",
        "capture_ok",
        "cond",
        "destroyed",
        "device",
        "done",
        "handle",
        "ops",
        "submitted",
        "thread",
        "watching",
    )

    def __init__(self, handle: int, device: int, lock: threading.Lock) -> None:
        self.handle = handle
        self.device = device
        # Kernels and host functions (callables, run by the worker thread) and steps.
        self.ops: deque[Callable[[], None] | _Step] = deque()
        self.watching: object | None = None  # the key its blocked head step waits on
        self.cond = threading.Condition(lock)
        self.submitted = 0  # ops enqueued
        self.done = 0  # ops finished
        self.destroyed = False
        self.thread: threading.Thread | None = None
        self.capture: list[_Node] | None = None  # while capturing: the graph's nodes
        self.capture_ok = True  # False once the capture is invalidated


class _Event:
    __slots__ = ("captured", "device", "ipc", "seq", "stamp", "stream", "timing")

    def __init__(self, device: int, timing: bool, ipc: _IpcPage | None = None) -> None:
        self.device = device
        self.captured: _Stream | None = None  # last recorded on this stream, in its capture
        self.stream: _Stream | None = None
        self.seq = 0
        self.stamp = 0.0
        self.timing = timing
        self.ipc = ipc  # an interprocess event's shared state


class _Node:
    """A node of a simulated graph: a kernel (a Python callable) or a batch of semaphore waits
    or signals."""

    __slots__ = ("fn", "handle", "kind", "ops")

    def __init__(
        self,
        kind: str,
        *,
        fn: Callable[[], None] | None = None,
        ops: list[SemOp] | None = None,
        handle: int = 0,
    ) -> None:
        self.kind = kind
        self.fn = fn
        self.ops = ops or []
        self.handle = handle

    def copy(self) -> _Node:
        return _Node(self.kind, fn=self.fn, ops=list(self.ops), handle=self.handle)
