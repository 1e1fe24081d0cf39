"""The simulated device's model of threads: its state, the lock that guards it, and how work
moves along its streams.

``SimDriver`` is a chain of classes, one per concern and module, each using only those below
it: ``_Core`` (here, with what a fault does to the streams' work), ``_Devices`` (devices and
injected faults), ``_Graphs``, ``_Streams`` (streams, kernels, host functions, events),
``_Semaphores``, ``_Memory`` (host words, pinned memory), ``_Ipc`` (interprocess events) and
``SimDriver`` itself (the constructor's checks).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from typing import TYPE_CHECKING, Final

from ... import _hostword
from ._model import _ForkedLock, _Stream
from ._page import _IpcPage
from ._status import _CAPTURE_INVALIDATED, _CAPTURE_UNSUPPORTED, _INVALID_HANDLE, _error
from ._steps import _Polled, _Step

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._model import _Event, _Node, _Semaphore


# How often a simulated stream waiting on a host memory word (or on an interprocess event's
# page) looks at it again. A store by another process does not tell the simulator, as it does
# not tell a GPU, which polls the word too; a store in this process tells it at once (the
# simulator's own writes, and notify_word()). A new wait is looked at every 0.2 ms, and the
# period doubles up to 20 ms, so that waits nobody will satisfy (those of cancelled host waits
# stay enqueued for good) cost a few hundred loads a second in all, not a core.
_POLL_MIN_S: Final = 0.0002
_POLL_MAX_S: Final = 0.02

# A stream's worker thread with nothing to run ends after this long; the next kernel or host
# function starts another. A stream blocked in a wait needs no thread: whatever satisfies the
# wait completes it.
_IDLE_S: Final = 0.25
#: How many operations a stream holds before an enqueue on it blocks the calling thread until
#: the device drains one, as a GPU's queue of commands does once it is full. A GPU's depth
#: depends on the driver and the GPU (an H100 blocked an enqueue with fewer than 5,000
#: operations pending on a stream); a test may set a ``SimDriver``'s ``queue_depth`` lower.
QUEUE_DEPTH: Final = 4096


class _Core:
    """The state of a simulated device and its thread model (see the module's docstring)."""

    def __init__(self, devices: int, name: str, stream_mem_ops: bool) -> None:
        # The arguments are checked by SimDriver.__init__.
        self._mem_ops = stream_mem_ops
        # Registered host memory: address -> (device, size). The device address is the host
        # address, as on a GPU that can use the host pointer for registered memory.
        self._words: dict[int, tuple[int, int]] = {}
        self._graphs: dict[int, list[_Node]] = {}  # graph -> its nodes, in the order added
        self._execs: dict[int, dict[int, _Node]] = {}  # executable graph -> node -> its copy
        self._exec_graphs: dict[int, int] = {}  # executable graph -> the graph it came from
        # Executable graph -> the stream and position of the end of its latest launch: CUDA
        # orders each launch of an executable graph behind its previous launches.
        self._exec_last: dict[int, tuple[_Stream, int]] = {}
        self.name = name
        self._devices = devices
        self._lock = threading.Lock()
        # What each blocked stream and host thread waits on, by key: a _Semaphore, a _Stream
        # (its completed count), an _IpcPage, ("word", address), ("blocked", device) (a stream
        # of the device blocked on an external semaphore, for destroy_semaphore), or
        # ("fault", device) (for host threads). A change wakes the waiters of its key only.
        self._watchers: dict[object, dict[_Stream | threading.Condition, None]] = {}
        # The keys that blocked streams' polled steps wait on (words and interprocess events'
        # pages), each with the value its waiters were last attempted at (None: not yet
        # polled), and the poller thread that looks at them.
        self._polled: dict[object, int | None] = {}
        self._poller: threading.Thread | None = None
        self._poll_wake = threading.Condition(self._lock)
        self._poll_fast = False  # a new polled wait: poll fast again for a while
        self._ids = itertools.count(0x1000, 0x10)
        self._streams: dict[int, _Stream] = {}
        self._events: dict[int, _Event] = {}
        self._sems: dict[int, _Semaphore] = {}  # imported handle -> semaphore
        self._sem_devices: dict[int, int] = {}
        # The file an exported fd refers to -> its semaphore. Keyed by the file, not the fd
        # number, like a real export: a copy of the fd (dup(), or passed over a Unix socket)
        # imports the same semaphore, and a number reused by an unrelated fd does not.
        self._exports: dict[tuple[int, int], _Semaphore] = {}
        self._faults: dict[int, int] = {}
        self._host_fns: dict[int, Callable[[int | None], None]] = {}
        self._blocked: dict[int, int] = {}  # device -> streams blocked in a semaphore wait
        self._pinned: dict[int, ctypes.Array[ctypes.c_char]] = {}  # mem_host_alloc's memory
        #: See QUEUE_DEPTH. Threads blocked in an enqueue on a full stream wait on ``_room``.
        self.queue_depth = QUEUE_DEPTH
        self._room = threading.Condition(self._lock)
        self._room_waiters = 0
        # The legacy default stream, handle 0, on device 0.
        self._streams[0] = _Stream(0, 0, self._lock)

    def _after_fork(self) -> None:
        # Every call takes the lock first: a lock that refuses makes every call fail clearly,
        # where the inherited one might be held forever by a worker thread that is gone.
        self._lock = _ForkedLock(self.name)  # type: ignore[assignment]

    # ------------------------------------------------------------------ lookups

    def _check_device(self, ordinal: int, what: str) -> None:
        if not isinstance(ordinal, int) or not 0 <= ordinal < self._devices:
            raise _error(101, what)  # CUDA_ERROR_INVALID_DEVICE
        status = self._faults.get(ordinal)
        if status is not None:
            raise _error(status, what)

    def _fault(self, ordinal: int, status: int) -> None:
        # Called with the lock held.
        self._faults.setdefault(ordinal, status)
        # Host threads first: the library's fault watchdog is one of them, and it wakes the
        # event loops.
        for w in self._watchers.pop(("fault", ordinal), {}):
            assert isinstance(w, threading.Condition)
            w.notify()
        if self._room_waiters:
            self._room.notify_all()
        for s in list(self._streams.values()):
            if s.device == ordinal:
                s.ops.clear()
                self._unwatch(s)
                if s.thread is not None:
                    s.cond.notify()
                elif s.destroyed:
                    del self._streams[s.handle]

    def _stream(self, handle: int, what: str, *, capturable: bool = False) -> _Stream:
        """The stream ``handle``. On a capturing stream, a call that is not ``capturable``
        is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, as
        cuStreamQuery does on a GPU; a capturable one, once the capture is invalidated, is
        refused with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED."""
        s = self._any_stream(handle, what)
        if s.capture is not None:
            if not capturable:
                s.capture_ok = False
                raise _error(_CAPTURE_UNSUPPORTED, what)
            if not s.capture_ok:
                raise _error(_CAPTURE_INVALIDATED, what)
        return s

    def _any_stream(self, handle: int, what: str) -> _Stream:
        """The stream ``handle``, capturing or not (for the calls a capture allows always)."""
        s = self._streams.get(handle)
        if s is None or s.destroyed:
            raise _error(_INVALID_HANDLE, what)
        self._check_device(s.device, what)
        return s

    def _mapped(self, device: int, address: int) -> bool:
        # Called with the lock held.
        return any(
            d == device and start <= address < start + length
            for start, (d, length) in self._words.items()
        )

    # ------------------------------------------------------------------ moving work along

    def _push(self, s: _Stream, op: Callable[[], None] | _Step) -> None:
        # Called with the lock held. A full stream blocks the caller, as a GPU's full queue
        # of commands does, until the device drains an operation, faults, or the stream goes.
        while len(s.ops) >= self.queue_depth and s.device not in self._faults and not s.destroyed:
            self._room_waiters += 1
            try:
                self._room.wait()
            finally:
                self._room_waiters -= 1
        s.ops.append(op)
        s.submitted += 1
        if len(s.ops) == 1:  # at the head: otherwise what is ahead of it moves it on
            changed: list[object] = []
            self._advance(s, changed)
            self._settle(changed)

    def _advance(self, s: _Stream, changed: list[object]) -> None:
        """Complete the steps at the head of ``s`` that can complete, then hand what comes
        next to the worker thread (a kernel or host function) or watch what the blocked step
        waits on. Appends the keys of what changed to ``changed``. Called with the lock
        held."""
        ops = s.ops
        while ops:
            if s.device in self._faults:
                return  # _fault dropped the stream's work
            op = ops[0]
            if not isinstance(op, _Step):
                if s.thread is None:
                    s.thread = threading.Thread(
                        target=self._run,
                        args=(s,),
                        name=f"aiocudasem-sim-{id(self):x}-{s.handle:#x}",
                        daemon=True,
                    )
                    s.thread.start()
                else:
                    s.cond.notify()
                return
            key = op.attempt(self, s, changed)
            if s.device in self._faults:
                return
            if key is not None:
                self._watch(s, op, key)
                return
            ops.popleft()
            s.done += 1
            changed.append(s)
            if self._room_waiters:
                self._room.notify_all()
        if s.destroyed and s.thread is None:
            self._streams.pop(s.handle, None)

    def _watch(self, s: _Stream, op: _Step, key: object) -> None:
        # Called with the lock held.
        s.watching = key
        self._watchers.setdefault(key, {})[s] = None
        if not isinstance(op, _Polled):
            return
        self._polled.setdefault(key, None)
        if op.fresh:
            op.fresh = False
            self._poll_fast = True
            if self._poller is None:
                self._poller = threading.Thread(
                    target=self._poll, name=f"aiocudasem-sim-{id(self):x}-poll", daemon=True
                )
                self._poller.start()
            else:
                self._poll_wake.notify()

    def _unwatch(self, s: _Stream) -> None:
        # Called with the lock held.
        key, s.watching = s.watching, None
        if key is None:
            return
        waiters = self._watchers.get(key)
        if waiters is not None:
            waiters.pop(s, None)
            if not waiters:
                del self._watchers[key]

    def _settle(self, changed: list[object]) -> None:
        """Wake the waiters of every key in ``changed``: attempt the blocked streams' steps
        here (which may change more), and notify the host threads, which look for
        themselves. Called with the lock held."""
        while changed:
            waiters = self._watchers.pop(changed.pop(), None)
            if waiters is None:
                continue
            for w in waiters:
                if isinstance(w, _Stream):
                    w.watching = None
                    self._advance(w, changed)
                else:
                    w.notify()

    def _run(self, s: _Stream) -> None:
        """The worker thread of ``s``: runs its kernels and host functions, outside the lock.
        Ends when the stream has nothing to run for a while, at once once destroyed."""
        changed: list[object] = []
        while True:
            with self._lock:
                op = self._next_call(s)
                if op is None:
                    return
            op()  # outside the lock: a kernel may block, a host function may call back
            with self._lock:
                if s.ops and s.ops[0] is op:  # else a fault dropped it
                    s.ops.popleft()
                    s.done += 1
                    if self._room_waiters:
                        self._room.notify_all()
                    changed.append(s)
                    self._advance(s, changed)
                    self._settle(changed)
            del op  # not kept while the worker idles: it may hold an event's page

    def _next_call(self, s: _Stream) -> Callable[[], None] | None:
        """The kernel or host function at the head of ``s``, once there is one; None when the
        thread should end (then it is no longer the stream's). Called with the lock held."""
        deadline = None
        while True:
            ops = s.ops
            if ops and not isinstance(ops[0], _Step) and s.device not in self._faults:
                return ops[0]
            if s.destroyed or s.device in self._faults:
                break
            now = time.monotonic()
            if deadline is None:
                deadline = now + _IDLE_S
            elif now >= deadline:
                break
            s.cond.wait(deadline - now)
        s.thread = None
        if s.destroyed and not s.ops:
            self._streams.pop(s.handle, None)
        return None

    def _poll(self) -> None:
        """The poller thread: looks at the memory that polled steps wait on (which another
        process may write), quickly after a new wait came, then ever more slowly, and wakes
        the waiters of what changed. Ends when no polled step is left."""
        period = _POLL_MIN_S
        with self._lock:
            while self._polled:
                self._poll_wake.wait(period)
                if self._poll_fast:
                    self._poll_fast = False
                    period = _POLL_MIN_S
                else:
                    period = min(2 * period, _POLL_MAX_S)
                for key, seen in list(self._polled.items()):
                    if key not in self._watchers:
                        del self._polled[key]  # its waits completed or were dropped
                        continue
                    now = self._peek(key)
                    if now is None or now != seen:
                        self._settle([key])
                        if key in self._polled:
                            self._polled[key] = now
            self._poller = None

    def _peek(self, key: object) -> int | None:
        """The value of the memory a polled key names; None for a word no longer registered
        (whose waits must look, and fault). Called with the lock held."""
        if isinstance(key, _IpcPage):
            return _hostword.load(key.completed)
        assert isinstance(key, tuple)
        address = key[1]
        for start, (_, length) in self._words.items():
            if start <= address < start + length:
                return _hostword.load(address)
        return None

    def _sleep(
        self,
        ready: Callable[[], bool],
        key: object,
        device: int | None,
        timeout: float | None = None,
        polled: bool = False,
    ) -> bool:
        """Block a host thread until ``ready()``, waking only when ``key`` changes, the device
        faults, or (``polled``) to look again. False after a fault of ``device`` or
        ``timeout`` seconds. Called with the lock held; ``ready`` runs under it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        period = _POLL_MIN_S if polled else None
        keys = (key,) if device is None else (key, ("fault", device))
        cond: threading.Condition | None = None
        while not ready():
            if device is not None and device in self._faults:
                return False
            wait = period
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                wait = left if wait is None else min(wait, left)
            if period is not None:
                period = min(2 * period, _POLL_MAX_S)
            if cond is None:
                cond = threading.Condition(self._lock)
            for k in keys:
                self._watchers.setdefault(k, {})[cond] = None
            try:
                cond.wait(wait)
            finally:
                for k in keys:
                    waiters = self._watchers.get(k)
                    if waiters is not None:
                        waiters.pop(cond, None)
                        if not waiters:
                            del self._watchers[k]
        return True
