"""The simulated device: the driver Protocol in pure Python plus threads.

It follows CUDA's semantics closely enough to test the library and users' pipelines without a
GPU:

- each stream is a FIFO; its kernels and host functions run on its own worker thread, which
  ends when it has had none to run for a while, and its waits, signals, records and memory writes
  complete under the simulator's lock as soon as they can, from whichever thread made that
  possible (so a blocked stream costs no thread, and a change wakes only what waits on it); an
  event captures "everything enqueued so far" on its stream;
- a timeline semaphore wait completes when the value is >= N; a binary (opaque) wait consumes one
  signal;
- host functions are real C function pointers, called through ctypes from the worker thread, the
  way the driver calls them, so the real C notifier runs in CI;
- faults can be injected: a sticky context error (every later call fails, pending work and host
  functions are dropped, as after a trapped kernel) and a semaphore whose producer is stuck.
"""

from __future__ import annotations

import ctypes
import fcntl
import itertools
import mmap
import os
import struct
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Final

from ... import _hostword
from ..._errors import STICKY_STATUSES, CudaError, DeviceFaultError, UnsupportedFeatureError
from ..._handles import lookup
from .. import forked_error, track

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .. import SemaphoreDesc, SemOp

__all__ = ("SimDriver", "SimProducer")

_INVALID_VALUE: Final = 1
_INVALID_HANDLE: Final = 400
_NOT_SUPPORTED: Final = 801
_LAUNCH_FAILED: Final = 719
_ILLEGAL_ADDRESS: Final = 700
_INVALID_CONTEXT: Final = 201
_ALREADY_REGISTERED: Final = 712
_NOT_REGISTERED: Final = 713
_ILLEGAL_STATE: Final = 401
_CAPTURE_UNSUPPORTED: Final = 900
_CAPTURE_INVALIDATED: Final = 901
_CAPTURED_EVENT: Final = 907
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
_I64_SIGN: Final = 1 << 63
# A simulated interprocess event handle: a tag, the creating process, its fd of the event's
# page and the page's inode (so that a stale or forged pid/fd naming any other file is refused),
# padded to the 64 bytes of CUipcEventHandle.
_IPC_TAG: Final = b"aiocudasem-sim-ipc-event\0"
_IPC_FORMAT: Final = f"={len(_IPC_TAG)}sqqQ"
_IPC_NAME: Final = "aiocudasem-sim-ipc-event"
# The page can neither shrink nor grow: no process can truncate it under a mapping (SIGBUS).
_IPC_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_U64: Final = 1 << 64

# The symbolic names of every status the simulated device raises (any sticky one can be
# injected), as cuGetErrorName gives them.
_CUDA_NAMES: Final = {
    _INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    _INVALID_CONTEXT: "CUDA_ERROR_INVALID_CONTEXT",
    _INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE",
    _ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    _ALREADY_REGISTERED: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    _NOT_REGISTERED: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    600: "CUDA_ERROR_NOT_READY",
    _NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    _LAUNCH_FAILED: "CUDA_ERROR_LAUNCH_FAILED",
    _CAPTURE_UNSUPPORTED: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    _CAPTURE_INVALIDATED: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    _CAPTURED_EVENT: "CUDA_ERROR_CAPTURED_EVENT",
}


def _file_of(fd: int) -> tuple[int, int]:
    """The file that ``fd`` refers to (its device and inode); raises ``OSError`` for a closed
    fd."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _uint(name: str, value: object, what: str = "an int") -> int:
    """``value`` as an int in [0, 2**64): ``TypeError`` for another type (a bool included),
    ``ValueError`` out of range. ``what`` names the value in the messages."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what} in [0, 2**64), not {type(value).__name__}")
    if not 0 <= value < _U64:
        raise ValueError(f"{name} must be {what} in [0, 2**64), not {value}")
    return value


def _error(status: int, what: str) -> CudaError:
    name = _CUDA_NAMES.get(status, f"CUDA_ERROR_{status}")
    cls = DeviceFaultError if status in STICKY_STATUSES else CudaError
    return cls(f"{what} failed: {name} ({status}) [simulated]", status, name)


class _Semaphore:
    __slots__ = ("binary", "exported", "imported", "stuck", "value")

    def __init__(self, binary: bool, initial: int) -> None:
        self.binary = binary
        self.value = initial  # timeline value, or 1/0 for a signalled/unsignalled binary
        self.stuck = False
        self.imported = 0
        self.exported: set[tuple[int, int]] = set()  # the files of its unimported exports


class _Step:
    """An operation that runs no code of the user's: a wait, a semaphore signal, an event
    record, a memory write. The simulator completes it under its lock, as soon as it reaches the
    head of its stream and can complete, from whichever thread made that possible; only kernels
    and host functions need the stream's worker thread. So a blocked stream costs no thread,
    and a change wakes only the streams that wait on what changed."""

    __slots__ = ()

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
        src = self.src
        return None if src is None or src.done >= self.seq else src


class _Stamp(_Step):
    __slots__ = ("event",)

    def __init__(self, event: _Event) -> None:
        self.event = event

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
        self.event.stamp = time.perf_counter()
        return None


class _WordWait(_Polled):
    __slots__ = ("address", "value")

    def __init__(self, address: int, value: int) -> None:
        super().__init__()
        self.address = address
        self.value = value

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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

    def attempt(self, drv: SimDriver, s: _Stream, changed: list[object]) -> object | None:
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


class _IpcPage:
    """The state of a simulated interprocess event, in a page of shared memory that every
    process that opened the event maps: how many records were made (in any process), and the
    highest record whose work has completed. CUDA's IPC handle carries no fd, so the handle
    names the creating process and its fd, which another process opens through /proc.

    The page owns its fd and stays mapped for as long as anything refers to it: the event, and
    every record and stream wait still pending on it (as CUDA keeps a destroyed event's
    resources until its pending work is done). Nothing reads an unmapped page."""

    __slots__ = ("fd", "ino", "map", "view")

    def __init__(self, fd: int) -> None:
        # Raises OSError or ValueError without taking fd: the caller closes it then.
        page = mmap.mmap(fd, mmap.PAGESIZE)
        self.view = (ctypes.c_uint64 * 2).from_buffer(page)
        self.map = page
        self.ino = os.fstat(fd).st_ino
        self.fd = fd  # last: from here on the page owns the fd

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is None:
            return  # __init__ failed: the caller keeps its fd
        try:
            del self.view  # the export that would keep the map from closing
            self.map.close()
            os.close(fd)
        except Exception:  # interpreter shutdown
            pass

    @property
    def recorded(self) -> int:
        return ctypes.addressof(self.view)

    @property
    def completed(self) -> int:
        return self.recorded + 8

    def reached(self, target: int) -> bool:
        return _hostword.load(self.completed) >= target

    def latest(self) -> int:
        return _hostword.load(self.recorded)

    def next_record(self) -> int:
        """Count one more record, atomically across processes; return its number."""
        while True:
            current = _hostword.load(self.recorded)
            if _hostword.advance(self.recorded, current + 1) == current:
                return current + 1


def _tgid(pid: int) -> int | None:
    """The process that ``pid`` (perhaps a thread's id) belongs to, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class SimProducer:
    """The host side of a simulated external semaphore: what a Vulkan renderer, a decoder or a
    peer process would do with its end. Thread-safe."""

    def __init__(self, driver: SimDriver, sem: _Semaphore) -> None:
        self._driver = driver
        self._sem = sem

    @property
    def is_timeline(self) -> bool:
        """True for a timeline semaphore, False for a binary one."""
        return not self._sem.binary

    @property
    def value(self) -> int:
        """The timeline value, or 1 if a binary semaphore is signalled and 0 if not."""
        with self._driver._lock:
            return self._sem.value

    def export_fd(self) -> int:
        """A new fd for this semaphore; ``import_semaphore`` takes ownership of it."""
        return self._driver._export(self._sem)

    def signal(self, value: int | None = None) -> None:
        """Signal from the host: set a timeline to ``value`` or signal a binary semaphore
        (``value`` must then be ``None``). Never blocks. Raises ``TypeError`` for a timeline
        value that is not an int (``None`` included) and ``ValueError`` for one outside
        [0, 2**64) or for a value given to a binary semaphore."""
        sem = self._sem
        new = self._target(
            value,
            binary="a binary semaphore is signalled without a value: signal()",
            timeline="a timeline semaphore is signalled with a value: signal(n)",
        )
        drv = self._driver
        with drv._lock:
            if not sem.stuck:
                sem.value = new
                drv._settle([sem])

    def block_until(self, value: int | None = None, timeout: float | None = None) -> bool:
        """Block until a timeline reaches ``value`` (or a binary one is signalled, consuming
        the signal). Returns False after ``timeout`` seconds. Raises ``TypeError`` and
        ``ValueError`` for a ``value`` as :meth:`signal` does, and for a ``timeout`` that is not
        a number of seconds (or is NaN)."""
        sem = self._sem
        target = self._target(
            value,
            binary="a binary semaphore is waited for without a value",
            timeline="a timeline wait needs a value: block_until(n)",
        )
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(
                    f"timeout must be a number of seconds, not {type(timeout).__name__}"
                )
            if timeout != timeout:  # NaN
                raise ValueError("timeout must be a number of seconds, not NaN")
        with self._driver._lock:
            if not self._driver._sleep(lambda: sem.value >= target, sem, None, timeout):
                return False
            if sem.binary:
                sem.value = 0
            return True

    def _target(self, value: object, *, binary: str, timeline: str) -> int:
        """The value a host signal sets or a host wait waits for: 1 for a binary semaphore,
        which takes no ``value`` (``ValueError`` with ``binary``), else ``value`` as a uint64
        (``TypeError`` with ``timeline`` when it is missing)."""
        if self._sem.binary:
            if value is not None:
                raise ValueError(binary)
            return 1
        if value is None:
            raise TypeError(timeline)
        return _uint("a timeline value", value)

    def set_stuck(self, stuck: bool = True) -> None:
        """Model a producer that died: while stuck, no signal (host or GPU) changes the value."""
        with self._driver._lock:
            self._sem.stuck = stuck


class SimDriver:
    """A simulated CUDA device. ``devices`` is the number of simulated GPUs (an int >= 1);
    ``name`` is the driver's name in messages. Raises ``TypeError`` for a value of the wrong
    type and ``ValueError`` for ``devices`` < 1.

    Prefer a fresh one per test to the process-wide ``get_driver("sim")``: an injected fault
    is sticky for the life of the driver, so a shared one faulted by one test fails the
    next.

    ``stream_mem_ops=False`` models a device without 64-bit stream memory operations: host
    timelines are refused on it, as the real driver refuses them on such a GPU."""

    simulated = True

    def __init__(self, devices: int = 2, name: str = "sim", *, stream_mem_ops: bool = True) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise TypeError(f"devices must be an int >= 1, not {type(devices).__name__}")
        if devices < 1:
            raise ValueError(f"devices must be an int >= 1, not {devices}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not isinstance(stream_mem_ops, bool):
            raise TypeError(f"stream_mem_ops must be a bool, not {type(stream_mem_ops).__name__}")
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
        # The legacy default stream, handle 0, on device 0.
        self._streams[0] = _Stream(0, 0, self._lock)
        track(self)

    def __repr__(self) -> str:
        return f"<SimDriver {self.name!r} devices={self._devices} at {id(self):#x}>"

    def _after_fork(self) -> None:
        # Every call takes the lock first: a lock that refuses makes every call fail clearly,
        # where the inherited one might be held forever by a worker thread that is gone.
        self._lock = _ForkedLock(self.name)  # type: ignore[assignment]

    # ------------------------------------------------------------------ simulator controls

    def create_semaphore(self, timeline: bool = True, initial: int = 0) -> SimProducer:
        """Create an external semaphore owned by a simulated producer: a timeline starting at
        ``initial``, or a binary semaphore, signalled if ``initial`` is 1. Raises
        ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of range."""
        if not isinstance(timeline, bool):
            raise TypeError(f"timeline must be a bool, not {type(timeline).__name__}")
        _uint("initial", initial)
        if not timeline and initial not in (0, 1):
            raise ValueError("a binary semaphore starts at 0 (unsignalled) or 1 (signalled)")
        return SimProducer(self, _Semaphore(not timeline, initial))

    def inject_fault(self, ordinal: int = 0, status: int = 700) -> None:
        """Put device ``ordinal``'s context into a sticky error: pending work is dropped, host
        functions are never called, and every later call on it raises DeviceFaultError.
        Raises ``TypeError`` for a value of the wrong type, ``ValueError`` for a device that
        does not exist or a status that is not sticky."""
        if isinstance(ordinal, bool) or not isinstance(ordinal, int):
            raise TypeError(f"ordinal must be an int, not {type(ordinal).__name__}")
        if not 0 <= ordinal < self._devices:
            raise ValueError(f"device {ordinal} does not exist: {self._devices} device(s)")
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int CUresult, not {type(status).__name__}")
        if status not in STICKY_STATUSES:
            sticky = ", ".join(map(str, sorted(STICKY_STATUSES)))
            raise ValueError(f"{status} is not a sticky CUresult: use one of {sticky}")
        with self._lock:
            self._fault(ordinal, status)

    def _fault(self, ordinal: int, status: int) -> None:
        # Called with the lock held.
        self._faults.setdefault(ordinal, status)
        # Host threads first: the library's fault watchdog is one of them, and it wakes the
        # event loops.
        for w in self._watchers.pop(("fault", ordinal), {}):
            assert isinstance(w, threading.Condition)
            w.notify()
        for s in list(self._streams.values()):
            if s.device == ordinal:
                s.ops.clear()
                self._unwatch(s)
                if s.thread is not None:
                    s.cond.notify()
                elif s.destroyed:
                    del self._streams[s.handle]

    def launch(self, stream: int, fn: Callable[[], None]) -> None:
        """Enqueue a Python callable as a simulated kernel. It runs on the stream's worker
        thread; an exception in it faults the context with CUDA_ERROR_LAUNCH_FAILED.
        ``stream`` is a raw handle: ``sim.launch(stream.handle, fn)``. Raises ``TypeError`` for
        a ``stream`` that is not an int or an ``fn`` that is not callable."""
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise TypeError(
                f"launch() takes a stream handle (an int), not {type(stream).__name__}: "
                "pass stream.handle"
            )
        if not callable(fn):
            raise TypeError(f"fn must be a callable, not {type(fn).__name__}")

        with self._lock:
            s = self._stream(stream, "cuLaunchKernel", capturable=True)
            if s.capture is not None:
                self._capture(s, _Node("kernel", fn=fn))
                return
            self._push(s, self._kernel(s, fn))

    def _kernel(self, s: _Stream, fn: Callable[[], None]) -> Callable[[], None]:
        def kernel() -> None:
            try:
                fn()
            except BaseException:
                self.inject_fault(s.device, _LAUNCH_FAILED)

        return kernel

    # ------------------------------------------------------------------ helpers

    def _check_device(self, ordinal: int, what: str) -> None:
        if not isinstance(ordinal, int) or not 0 <= ordinal < self._devices:
            raise _error(101, what)  # CUDA_ERROR_INVALID_DEVICE
        status = self._faults.get(ordinal)
        if status is not None:
            raise _error(status, what)

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

    def _capture(self, s: _Stream, node: _Node) -> None:
        # Called with the lock held. Captured work on one stream is a chain: each node
        # depends on the one captured before it, which node order already expresses.
        assert s.capture is not None
        self._add_node(s.capture, node)

    def _push(self, s: _Stream, op: Callable[[], None] | _Step) -> None:
        # Called with the lock held.
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

    def notify_word(self, address: int) -> None:
        """Tell the simulated device that the host stored to the registered word at
        ``address``: the streams waiting on it look at once. Without it they see the store all
        the same, within 20 ms, as they see a store by another process. Raises ``TypeError``
        for an ``address`` that is not an int."""
        if isinstance(address, bool) or not isinstance(address, int):
            raise TypeError(f"address must be an int, not {type(address).__name__}")
        with self._lock:
            self._settle([("word", address)])

    def _export(self, sem: _Semaphore) -> int:
        fd = os.memfd_create("aiocudasem-sim-semaphore", os.MFD_CLOEXEC)  # a file of its own
        key = _file_of(fd)
        with self._lock:
            self._exports[key] = sem
            sem.exported.add(key)
        return fd

    # ------------------------------------------------------------------ devices

    def device_count(self) -> int:
        return self._devices

    def device_uuid(self, ordinal: int) -> bytes:
        self._check_device(ordinal, "cuDeviceGetUuid")
        return bytes([0x51, 0x4D] + [ordinal] * 14)

    def device_name(self, ordinal: int) -> str:
        self._check_device(ordinal, "cuDeviceGetName")
        return f"Simulated CUDA device {ordinal}"

    def check_health(self, ordinal: int) -> None:
        with self._lock:
            self._check_device(ordinal, "cuEventQuery")

    # ------------------------------------------------------------------ streams

    def stream_create(self, ordinal: int, non_blocking: bool, priority: int) -> int:
        with self._lock:
            self._check_device(ordinal, "cuStreamCreateWithPriority")
            handle = next(self._ids)
            self._streams[handle] = _Stream(handle, ordinal, self._lock)
            return handle

    def stream_destroy(self, stream: int) -> None:
        with self._lock:
            s = self._streams.get(stream)
            if s is None or s.destroyed or stream == 0:
                raise _error(_INVALID_HANDLE, "cuStreamDestroy")
            # Like the driver: returns at once, pending work still completes. Until then the
            # stream costs a thread only while it has a kernel or host function to run.
            s.destroyed = True
            if s.thread is not None:
                s.cond.notify()
            elif not s.ops:
                del self._streams[stream]

    def stream_device(self, stream: int) -> int:
        with self._lock:
            return self._any_stream(stream, "cuStreamGetCtx").device

    def stream_capturing(self, stream: int) -> bool:
        with self._lock:
            return self._any_stream(stream, "cuStreamIsCapturing").capture is not None

    def begin_capture(self, stream: int) -> None:
        """Begin capturing the stream into a new graph (``cuStreamBeginCapture``). While it
        captures, the stream runs nothing: semaphore waits and signals and kernels
        (:meth:`launch`) become the graph's nodes, in order. Any other call on it (a query, a
        synchronize, a wait for an event, a host function, a memory operation, a graph launch)
        is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) and invalidates the
        capture, as cuStreamQuery does on a GPU. An event recorded on it is a captured event:
        querying, synchronizing or waiting for it is refused with CUDA_ERROR_CAPTURED_EVENT
        (907), until it is recorded again outside capture. (CUDA also lets other streams join
        a capture through such an event; the simulator does not model that.) The legacy
        default stream (0) cannot capture, and a stream that captures already is refused with
        CUDA_ERROR_ILLEGAL_STATE (401), its capture left as it was (both as on an H200)."""
        with self._lock:
            s = self._any_stream(stream, "cuStreamBeginCapture")
            if s.capture is not None:
                raise _error(_ILLEGAL_STATE, "cuStreamBeginCapture")
            if stream == 0:
                raise _error(_CAPTURE_UNSUPPORTED, "cuStreamBeginCapture")
            s.capture, s.capture_ok = [], True

    def end_capture(self, stream: int) -> int:
        """End the stream's capture and return the graph it captured (``cuStreamEndCapture``),
        which :meth:`graph_instantiate` takes. Raises CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        (901) if the capture was invalidated (and ends it), CUDA_ERROR_INVALID_VALUE if the
        stream is not capturing."""
        with self._lock:
            s = self._any_stream(stream, "cuStreamEndCapture")
            nodes, ok = s.capture, s.capture_ok
            if nodes is None:
                raise _error(_INVALID_VALUE, "cuStreamEndCapture")
            s.capture, s.capture_ok = None, True
            if not ok:
                raise _error(_CAPTURE_INVALIDATED, "cuStreamEndCapture")
            handle = next(self._ids)
            self._graphs[handle] = nodes
            return handle

    def stream_query(self, stream: int) -> bool:
        with self._lock:
            s = self._stream(stream, "cuStreamQuery")
            return s.done == s.submitted

    def stream_synchronize(self, stream: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamSynchronize")
            target = s.submitted
            if not self._sleep(lambda: s.done >= target, s, s.device):
                raise _error(self._faults[s.device], "cuStreamSynchronize")

    def stream_wait_event(self, stream: int, event: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWaitEvent")
            ev = self._event(event, "cuStreamWaitEvent")
            self._not_captured(ev, "cuStreamWaitEvent")
            if ev.ipc is not None:
                # The latest record, in any process.
                self._push(s, _IpcWait(ev.ipc, ev.ipc.latest()))
                return
            # The state captured now, as the driver does.
            self._push(s, _SeqWait(ev.stream, ev.seq))

    def launch_host_func(self, stream: int, fn: int, user_data: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuLaunchHostFunc")
            call = self._host_fns.get(fn)
            if call is None:
                call = self._host_fns[fn] = _HOST_FN_TYPE(fn)
            self._push(s, lambda: call(user_data))

    # ------------------------------------------------------------------ events

    def _event(self, event: int, what: str) -> _Event:
        ev = self._events.get(event)
        if ev is None:
            raise _error(_INVALID_HANDLE, what)
        self._check_device(ev.device, what)
        return ev

    def event_create(self, ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        # Every simulated synchronize sleeps on a condition: ``blocking`` changes nothing.
        with self._lock:
            self._check_device(ordinal, "cuEventCreate")
            handle = next(self._ids)
            self._events[handle] = _Event(ordinal, timing)
            return handle

    def event_destroy(self, event: int) -> None:
        with self._lock:
            ev = self._events.pop(event, None)
            if ev is None:
                raise _error(_INVALID_HANDLE, "cuEventDestroy")
            # An interprocess event's page goes when its pending records and waits are done.

    def event_record(self, event: int, stream: int) -> None:
        with self._lock:
            ev = self._event(event, "cuEventRecord")
            s = self._stream(stream, "cuEventRecord", capturable=True)
            if ev.device != s.device:
                raise _error(_INVALID_HANDLE, "cuEventRecord")
            if s.capture is not None:
                if ev.ipc is not None:
                    s.capture_ok = False
                    raise _error(_CAPTURE_UNSUPPORTED, "cuEventRecord")
                # A point in the graph being captured, not work that completes: CUDA's
                # "captured event", which a query refuses.
                ev.captured = s
                return
            ev.captured = None
            page = ev.ipc
            if page is not None:
                # Record ``number`` completes after the one before it, in whichever process
                # that was made (seen on an H200: a record made after one whose process died
                # never completed), and blocks the recording stream until then.
                number = page.next_record()
                self._push(s, _IpcWait(page, number - 1, complete=number))
            else:
                self._push(s, _Stamp(ev))
            ev.stream, ev.seq = s, s.submitted

    def _not_captured(self, ev: _Event, what: str) -> None:
        # Called with the lock held. A query or wait of a captured event is refused, and the
        # capture it belongs to (if still going) is invalidated, as on an H200.
        s = ev.captured
        if s is not None:
            if s.capture is not None:
                s.capture_ok = False
            raise _error(_CAPTURED_EVENT, what)

    def event_query(self, event: int) -> bool:
        with self._lock:
            ev = self._event(event, "cuEventQuery")
            self._not_captured(ev, "cuEventQuery")
            if ev.ipc is not None:
                return ev.ipc.reached(ev.ipc.latest())
            return ev.stream is None or ev.stream.done >= ev.seq

    def event_synchronize(self, event: int) -> None:
        with self._lock:
            ev = self._event(event, "cuEventSynchronize")
            self._not_captured(ev, "cuEventSynchronize")
            src, seq, page = ev.stream, ev.seq, ev.ipc
            if page is not None:
                # Another process's stream does not tell this simulator: look at the page
                # again and again, as a stream waiting on it does.
                target = page.latest()
                ok = self._sleep(lambda: page.reached(target), page, ev.device, polled=True)
            else:
                ok = src is None or self._sleep(lambda: src.done >= seq, src, ev.device)
            if not ok:
                raise _error(self._faults[ev.device], "cuEventSynchronize")

    # ------------------------------------------------------------------ interprocess events

    def ipc_event_create(self, ordinal: int) -> int:
        fd = os.memfd_create(_IPC_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _IPC_SEALS)
            page = _IpcPage(fd)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._check_device(ordinal, "cuEventCreate")  # a failure drops (closes) the page
            handle = next(self._ids)
            self._events[handle] = _Event(ordinal, False, page)
            return handle

    def ipc_event_export(self, event: int) -> bytes:
        with self._lock:
            ev = self._event(event, "cuIpcGetEventHandle")
            if ev.ipc is None:
                raise _error(_INVALID_VALUE, "cuIpcGetEventHandle")  # not interprocess
            raw = struct.pack(_IPC_FORMAT, _IPC_TAG, os.getpid(), ev.ipc.fd, ev.ipc.ino)
            return raw.ljust(64, b"\0")

    def ipc_event_open(self, ordinal: int, handle: bytes) -> int:
        with self._lock:
            self._check_device(ordinal, "cuIpcOpenEventHandle")
        if not isinstance(handle, bytes) or len(handle) != 64:
            raise _error(_INVALID_VALUE, "cuIpcOpenEventHandle")
        tag, pid, fd, ino = struct.unpack_from(_IPC_FORMAT, handle)
        if tag != _IPC_TAG or pid <= 0 or fd < 0:
            raise _error(_INVALID_VALUE, "cuIpcOpenEventHandle")
        if pid == os.getpid() or _tgid(pid) == os.getpid():
            # The handle is for other processes: opening it where it was made is refused (HIP,
            # which mirrors CUDA here, tests for the same error). A thread's id is its process.
            raise _error(_INVALID_CONTEXT, "cuIpcOpenEventHandle")
        path = f"/proc/{pid}/fd/{fd}"
        try:
            # Look before opening: a stale or forged handle may name any file or device.
            if not os.readlink(path).startswith(f"/memfd:{_IPC_NAME} "):
                raise OSError
            own = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            # The creating process has gone, or its event with it, or not an event's page.
            raise _error(_INVALID_VALUE, "cuIpcOpenEventHandle") from None
        try:
            # The page of that event (not one that reused the fd number), sealed against
            # truncation, so that no read of it can fault.
            if os.fstat(own).st_ino != ino or (
                fcntl.fcntl(own, fcntl.F_GET_SEALS) & _IPC_SEALS != _IPC_SEALS
            ):
                raise OSError
            page = _IpcPage(own)
        except (OSError, ValueError):
            os.close(own)
            raise _error(_INVALID_VALUE, "cuIpcOpenEventHandle") from None
        with self._lock:
            handle_id = next(self._ids)
            self._events[handle_id] = _Event(ordinal, False, page)
            return handle_id

    def event_elapsed_ms(self, start: int, end: int) -> float:
        with self._lock:
            a = self._event(start, "cuEventElapsedTime")
            b = self._event(end, "cuEventElapsedTime")
            if not (a.timing and b.timing) or a.stream is None or b.stream is None:
                raise _error(_INVALID_HANDLE, "cuEventElapsedTime")
            if a.stream.done < a.seq or b.stream.done < b.seq:
                raise _error(600, "cuEventElapsedTime")  # CUDA_ERROR_NOT_READY
            return (b.stamp - a.stamp) * 1e3

    # ------------------------------------------------------------------ external semaphores

    def import_semaphore(self, ordinal: int, desc: SemaphoreDesc) -> int:
        with self._lock:
            self._check_device(ordinal, "cuImportExternalSemaphore")
            row = lookup(desc.handle_type)
            if row is None or row.passed_as != "fd":
                # The simulated platform, like Linux on a discrete GPU, has only fd handles.
                raise _error(_NOT_SUPPORTED, "cuImportExternalSemaphore")
            try:
                key = _file_of(desc.fd)
            except OSError:
                raise _error(_INVALID_VALUE, "cuImportExternalSemaphore") from None
            sem = self._exports.get(key)
            if sem is None or desc.flags != 0:
                raise _error(_INVALID_VALUE, "cuImportExternalSemaphore")
            if sem.binary != (row.sync == "binary"):
                raise _error(_INVALID_VALUE, "cuImportExternalSemaphore")
            # Success: the driver owns the fd now, and closes it. The export is spent: another
            # copy of the fd does not import it again.
            del self._exports[key]
            sem.exported.discard(key)
            os.close(desc.fd)
            handle = next(self._ids)
            self._sems[handle] = sem
            self._sem_devices[handle] = ordinal
            sem.imported += 1
            return handle

    def destroy_semaphore(self, sem: int) -> None:
        with self._lock:
            s = self._sems.get(sem)
            if s is None:
                raise _error(_INVALID_HANDLE, "cuDestroyExternalSemaphore")
            self._check_device(self._sem_devices[sem], "cuDestroyExternalSemaphore")
            device = self._sem_devices[sem]
            # Like the driver (seen on an H200): destroying waits until no stream of the device
            # is blocked on an external semaphore.
            self._sleep(lambda: not self._blocked.get(device, 0), ("blocked", device), device)
            if self._sems.pop(sem, None) is None:  # destroyed by another thread meanwhile
                raise _error(_INVALID_HANDLE, "cuDestroyExternalSemaphore")
            del self._sem_devices[sem]
            s.imported -= 1

    def _sem_ops(
        self, ops: Sequence[SemOp], stream: int, what: str
    ) -> tuple[_Stream, list[tuple[_Semaphore, SemOp]]]:
        s = self._stream(stream, what, capturable=True)
        resolved = []
        for op in ops:
            sem = self._sems.get(op.sem)
            if sem is None:
                raise _error(_INVALID_HANDLE, what)
            if self._sem_devices[op.sem] != s.device:
                raise _error(_INVALID_HANDLE, what)
            resolved.append((sem, op))
        return s, resolved

    def enqueue_semaphore_waits(self, ops: Sequence[SemOp], stream: int) -> None:
        with self._lock:
            s, resolved = self._sem_ops(ops, stream, "cuWaitExternalSemaphoresAsync")
            if s.capture is not None:
                self._capture(s, _Node("wait", ops=list(ops)))
                return
            self._push(s, _waits(resolved))

    def enqueue_semaphore_signals(self, ops: Sequence[SemOp], stream: int) -> None:
        with self._lock:
            s, resolved = self._sem_ops(ops, stream, "cuSignalExternalSemaphoresAsync")
            if s.capture is not None:
                self._capture(s, _Node("signal", ops=list(ops)))
                return
            self._push(s, _signals(resolved))

    # ------------------------------------------------------------------ graphs

    def graph_create(self) -> int:
        """Create an empty graph (``cuGraphCreate``) and return its handle: where a program
        on the GPU gets one from CUDA (cuda.core, the bindings, stream capture), a test on the
        simulated device gets one here."""
        with self._lock:
            handle = next(self._ids)
            self._graphs[handle] = []
            return handle

    def graph_add_kernel(
        self, graph: int, fn: Callable[[], None], after: Sequence[int] = ()
    ) -> int:
        """Add a simulated kernel node that runs ``fn`` (as :meth:`launch` does) after the
        nodes ``after``; return the node's handle."""
        if not callable(fn):
            raise TypeError(f"fn must be a callable, not {type(fn).__name__}")
        with self._lock:
            nodes = self._graph(graph, "cuGraphAddKernelNode")
            self._check_dependencies(nodes, after, "cuGraphAddKernelNode")
            return self._add_node(nodes, _Node("kernel", fn=fn))

    def graph_instantiate(self, graph: int) -> int:
        """Instantiate the graph (``cuGraphInstantiate``): an executable copy of its nodes,
        whose semaphore nodes :meth:`graph_exec_set_semaphore_node` may change."""
        with self._lock:
            nodes = self._graph(graph, "cuGraphInstantiate")
            handle = next(self._ids)
            self._execs[handle] = {n.handle: n.copy() for n in nodes}
            self._exec_graphs[handle] = graph
            return handle

    def _graph(self, graph: int, what: str) -> list[_Node]:
        nodes = self._graphs.get(graph) if isinstance(graph, int) else None
        if nodes is None:
            raise _error(_INVALID_HANDLE, what)
        return nodes

    def _check_dependencies(self, nodes: list[_Node], after: Sequence[int], what: str) -> None:
        known = {n.handle for n in nodes}
        if any(d not in known for d in after) or len(set(after)) != len(after):
            raise _error(_INVALID_VALUE, what)

    def _add_node(self, nodes: list[_Node], node: _Node) -> int:
        # Called with the lock held. Nodes run in the order they were added, which is an order
        # that honours every dependency (a node depends only on nodes added before it).
        node.handle = next(self._ids)
        nodes.append(node)
        return node.handle

    def _check_sems(self, ops: Sequence[SemOp], what: str) -> None:
        if not ops or any(op.sem not in self._sems for op in ops):
            raise _error(_INVALID_VALUE, what)

    def graph_add_semaphore_node(
        self, graph: int, dependencies: Sequence[int], ops: Sequence[SemOp], signal: bool
    ) -> int:
        what = f"cuGraphAddExternalSemaphores{'Signal' if signal else 'Wait'}Node"
        with self._lock:
            nodes = self._graph(graph, what)
            self._check_dependencies(nodes, dependencies, what)
            self._check_sems(ops, what)
            return self._add_node(nodes, _Node("signal" if signal else "wait", ops=list(ops)))

    def graph_exec_set_semaphore_node(
        self, graph_exec: int, node: int, ops: Sequence[SemOp], signal: bool
    ) -> None:
        kind = "signal" if signal else "wait"
        what = f"cuGraphExecExternalSemaphores{kind.title()}NodeSetParams"
        with self._lock:
            nodes = self._execs.get(graph_exec) if isinstance(graph_exec, int) else None
            if nodes is None:
                raise _error(_INVALID_HANDLE, what)
            target = nodes.get(node)
            if target is None or target.kind != kind or len(target.ops) != len(ops):
                raise _error(_INVALID_VALUE, what)  # another node, or another count
            if self._exec_graphs[graph_exec] not in self._graphs:
                # The node is named by its handle in the graph, which went with the graph (a
                # GPU refuses it too: seen on an H200).
                raise _error(_INVALID_VALUE, what)
            self._check_sems(ops, what)
            target.ops = list(ops)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        with self._lock:
            nodes = self._execs.get(graph_exec) if isinstance(graph_exec, int) else None
            if nodes is None:
                raise _error(_INVALID_HANDLE, "cuGraphLaunch")
            s = self._stream(stream, "cuGraphLaunch")
            # The parameters of this launch are those set before it.
            steps: list[Callable[[], None] | _Step] = []
            for node in nodes.values():
                if node.kind == "kernel":
                    assert node.fn is not None
                    steps.append(self._kernel(s, node.fn))
                    continue
                for op in node.ops:
                    if self._sem_devices.get(op.sem) != s.device:
                        raise _error(_INVALID_HANDLE, "cuGraphLaunch")
                resolved = [(self._sems[op.sem], op) for op in node.ops]
                steps.append(_signals(resolved) if node.kind == "signal" else _waits(resolved))
            last = self._exec_last.get(graph_exec)
            if last is not None and last[0] is not s:
                steps.insert(0, _SeqWait(*last))
            for step in steps:
                self._push(s, step)
            self._exec_last[graph_exec] = (s, s.submitted)

    def graph_semaphore_nodes(self, graph: int, signal: bool) -> list[int]:
        kind = "signal" if signal else "wait"
        with self._lock:
            return [n.handle for n in self._graph(graph, "cuGraphGetNodes") if n.kind == kind]

    def graph_destroy(self, graph: int) -> None:
        """Destroy a graph (``cuGraphDestroy``); its executable copies go on, but their nodes
        can no longer be set: the graph's node handles went with it."""
        with self._lock:
            if self._graphs.pop(graph, None) is None:
                raise _error(_INVALID_HANDLE, "cuGraphDestroy")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        """Destroy an executable graph (``cuGraphExecDestroy``); launches already enqueued
        still run."""
        with self._lock:
            if self._execs.pop(graph_exec, None) is None:
                raise _error(_INVALID_HANDLE, "cuGraphExecDestroy")
            del self._exec_graphs[graph_exec]
            self._exec_last.pop(graph_exec, None)

    # ------------------------------------------------------------------ host memory words

    def host_register(self, ordinal: int, address: int, size: int) -> int:
        with self._lock:
            self._check_device(ordinal, "cuMemHostRegister")
            if not self._mem_ops:
                raise UnsupportedFeatureError(
                    f"device {ordinal} (Simulated CUDA device {ordinal}) has no 64-bit stream "
                    "memory operations (cuStreamWaitValue64) (CU_DEVICE_ATTRIBUTE_CAN_USE_64_"
                    "BIT_STREAM_MEM_OPS is 0), which a host timeline needs [simulated]"
                )
            if address <= 0 or size <= 0:
                raise _error(_INVALID_VALUE, "cuMemHostRegister")
            for start, (_, length) in self._words.items():
                if start < address + size and address < start + length:
                    raise _error(_ALREADY_REGISTERED, "cuMemHostRegister")
            self._words[address] = (ordinal, size)
            return address

    def host_unregister(self, address: int) -> None:
        with self._lock:
            if self._words.pop(address, None) is None:
                raise _error(_NOT_REGISTERED, "cuMemHostUnregister")

    def _word(self, s: _Stream, address: int, what: str) -> None:
        """Refuse an address outside the memory registered for the stream's device, as the
        driver refuses one it has not mapped. Called with the lock held."""
        for start, (device, length) in self._words.items():
            inside = start <= address and address + 8 <= start + length
            if device == s.device and inside and address % 8 == 0:
                return
        raise _error(_INVALID_VALUE, what)

    def _mapped(self, device: int, address: int) -> bool:
        # Called with the lock held.
        return any(
            d == device and start <= address < start + length
            for start, (d, length) in self._words.items()
        )

    def enqueue_wait_value64(self, stream: int, address: int, value: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWaitValue64")
            if not 0 <= value < _U64:
                raise _error(_INVALID_VALUE, "cuStreamWaitValue64")
            self._word(s, address, "cuStreamWaitValue64")
            self._push(s, _WordWait(address, value))

    def enqueue_write_value64(self, stream: int, address: int, value: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWriteValue64")
            if not 0 <= value < _U64:
                raise _error(_INVALID_VALUE, "cuStreamWriteValue64")
            self._word(s, address, "cuStreamWriteValue64")
            self._push(s, _WordWrite(address, value))

    # ------------------------------------------------------------------ pinned memory

    def mem_host_alloc(self, nbytes: int) -> int:
        """``nbytes`` of host memory that simulated kernels of every device can use: on the
        simulated device, ordinary memory stands in for page-locked memory
        (``cuMemHostAlloc``). Not part of the :class:`Driver` protocol: the workloads use it."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise _error(_INVALID_VALUE, "cuMemHostAlloc")
        buf = (ctypes.c_char * nbytes)()
        ptr = ctypes.addressof(buf)
        with self._lock:  # after fork() it refuses, as every simulated call does
            self._pinned[ptr] = buf
        return ptr

    def mem_free_host(self, ptr: int) -> None:
        """Free memory from :meth:`mem_host_alloc` (``cuMemFreeHost``)."""
        with self._lock:
            if self._pinned.pop(ptr, None) is None:
                raise _error(_INVALID_VALUE, "cuMemFreeHost")
