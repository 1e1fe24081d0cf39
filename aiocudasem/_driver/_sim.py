"""The simulated device: the driver Protocol in pure Python plus threads.

It follows CUDA's semantics closely enough to test the library and users' pipelines without a
GPU:

- each stream is a FIFO run by its own worker thread; an event captures "everything enqueued so
  far" on its stream;
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

from .. import _hostword
from .._errors import STICKY_STATUSES, CudaError, DeviceFaultError, UnsupportedFeatureError
from .._handles import lookup
from . import forked_error, track

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from . import SemaphoreDesc, SemOp

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
# How often a simulated stream waiting on a host memory word looks at it again. A host store
# does not tell the simulator, as it does not tell a GPU, which polls the word too.
_WORD_POLL_S: Final = 0.0002
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


def _signalled(sem: _Semaphore) -> Callable[[], bool]:
    return lambda: sem.value >= 1


def _consumer(sem: _Semaphore) -> Callable[[], None]:
    def consume() -> None:
        sem.value = 0

    return consume


def _reached(sem: _Semaphore, value: int) -> Callable[[], bool]:
    return lambda: sem.value >= value


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
    )

    def __init__(self, handle: int, device: int, lock: threading.Lock) -> None:
        self.handle = handle
        self.device = device
        self.ops: deque[Callable[[], None]] = deque()
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
        with self._driver._lock:
            if not sem.stuck:
                sem.value = new
            self._driver._deps.notify_all()

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
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._driver._lock:
            while not sem.value >= target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._driver._deps.wait(left)
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
        self._deps = threading.Condition(self._lock)  # semaphore and event progress
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
        for s in self._streams.values():
            if s.device == ordinal:
                s.ops.clear()
                s.cond.notify_all()
        self._deps.notify_all()

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

    def _push(self, s: _Stream, op: Callable[[], None]) -> None:
        # Called with the lock held.
        s.ops.append(op)
        s.submitted += 1
        if s.thread is None:
            s.thread = threading.Thread(
                target=self._run,
                args=(s,),
                name=f"aiocudasem-sim-{id(self):x}-{s.handle:#x}",
                daemon=True,
            )
            s.thread.start()
        s.cond.notify()

    def _run(self, s: _Stream) -> None:
        while True:
            with self._lock:
                while not s.ops:
                    if s.destroyed or s.device in self._faults:
                        s.thread = None
                        if s.destroyed:
                            self._streams.pop(s.handle, None)
                        return
                    s.cond.wait()
                if s.device in self._faults:
                    s.ops.clear()
                    continue
                op = s.ops[0]
            op()  # outside the lock: ops block on dependencies and call host functions
            with self._lock:
                if s.ops and s.ops[0] is op:
                    s.ops.popleft()
                if s.device not in self._faults:
                    s.done += 1
                self._deps.notify_all()
            del op  # not kept while the worker idles: it may hold an event's page

    def _block_until(
        self, device: int, ready: Callable[[], bool], then: Callable[[], None] | None = None
    ) -> bool:
        """Block a worker until ``ready()`` or a fault. ``ready`` and ``then`` run under the
        lock, together, so that consuming what ``ready`` saw is atomic."""
        with self._lock:
            while not ready():
                if device in self._faults:
                    return False
                self._deps.wait()
            if then is not None:
                then()
            return True

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
            # Like the driver: returns at once, pending work still completes.
            s.destroyed = True
            if s.thread is None:
                del self._streams[stream]
            s.cond.notify_all()

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
        if not self._block_until(s.device, lambda: s.done >= target):
            raise _error(self._faults[s.device], "cuStreamSynchronize")

    def stream_wait_event(self, stream: int, event: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWaitEvent")
            ev = self._event(event, "cuStreamWaitEvent")
            self._not_captured(ev, "cuStreamWaitEvent")
            if ev.ipc is not None:
                page, target = ev.ipc, ev.ipc.latest()  # the latest record, in any process

                def wait() -> None:
                    self._wait_ipc(s.device, page, target)

                self._push(s, wait)
                return
            src, seq = ev.stream, ev.seq  # the state captured now, as the driver does
            self._push(s, lambda: self._wait_seq(s.device, src, seq))

    def _wait_ipc(self, device: int, page: _IpcPage, target: int) -> bool:
        """Block until an interprocess event's record ``target`` has completed: another
        process's stream does not tell this simulator, so it looks at the page every 0.2 ms,
        as a stream waiting on host memory does. False after a fault. The event may be
        destroyed meanwhile: the wait captured the record, and holds the page."""
        with self._lock:
            while device not in self._faults:
                if page.reached(target):
                    return True
                self._deps.wait(_WORD_POLL_S)
            return False

    def _wait_seq(self, device: int, src: _Stream | None, seq: int) -> None:
        if src is not None:
            self._block_until(device, lambda: src.done >= seq)

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
                number = page.next_record()
                self._push(s, lambda: self._complete_ipc(s.device, page, number))
            else:
                self._push(s, lambda: self._stamp(ev))
            ev.stream, ev.seq = s, s.submitted

    def _complete_ipc(self, device: int, page: _IpcPage, number: int) -> None:
        """Record ``number`` of an interprocess event completes after the one before it, in
        whichever process that was made (seen on an H200: a record made after one whose
        process died never completed). Blocks the recording stream until then."""
        if not self._wait_ipc(device, page, number - 1):
            return  # a fault: this device's pending work is gone
        with self._lock:
            # Also after the event was destroyed here: the record still completes, for
            # every other process, as CUDA's does.
            _hostword.advance(page.completed, number)
            self._deps.notify_all()

    @staticmethod
    def _stamp(ev: _Event) -> None:
        ev.stamp = time.perf_counter()

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
            target = page.latest() if page is not None else 0
        if page is not None:
            if not self._wait_ipc(ev.device, page, target):
                raise _error(self._faults[ev.device], "cuEventSynchronize")
            return
        if src is not None and not self._block_until(ev.device, lambda: src.done >= seq):
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
            while self._blocked.get(device, 0) and device not in self._faults:
                self._deps.wait()
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
            self._push(s, self._waits(s, resolved))

    def _waits(self, s: _Stream, resolved: list[tuple[_Semaphore, SemOp]]) -> Callable[[], None]:
        def wait_all() -> None:
            with self._lock:
                self._blocked[s.device] = self._blocked.get(s.device, 0) + 1
            try:
                for sem, op in resolved:
                    if sem.binary:
                        # One wait per signal: test and consume in one critical section.
                        self._block_until(s.device, _signalled(sem), _consumer(sem))
                    else:
                        self._block_until(s.device, _reached(sem, op.value))
            finally:
                with self._lock:
                    self._blocked[s.device] -= 1
                    self._deps.notify_all()

        return wait_all

    def enqueue_semaphore_signals(self, ops: Sequence[SemOp], stream: int) -> None:
        with self._lock:
            s, resolved = self._sem_ops(ops, stream, "cuSignalExternalSemaphoresAsync")
            if s.capture is not None:
                self._capture(s, _Node("signal", ops=list(ops)))
                return
            self._push(s, self._signals(resolved))

    def _signals(self, resolved: list[tuple[_Semaphore, SemOp]]) -> Callable[[], None]:
        def signal_all() -> None:
            with self._lock:
                for sem, op in resolved:
                    if not sem.stuck:
                        sem.value = 1 if sem.binary else op.value
                self._deps.notify_all()

        return signal_all

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
            steps: list[Callable[[], None]] = []
            for node in nodes.values():
                if node.kind == "kernel":
                    assert node.fn is not None
                    steps.append(self._kernel(s, node.fn))
                    continue
                for op in node.ops:
                    if self._sem_devices.get(op.sem) != s.device:
                        raise _error(_INVALID_HANDLE, "cuGraphLaunch")
                resolved = [(self._sems[op.sem], op) for op in node.ops]
                steps.append(
                    self._signals(resolved) if node.kind == "signal" else self._waits(s, resolved)
                )
            last = self._exec_last.get(graph_exec)
            if last is not None and last[0] is not s:
                src, seq = last
                steps.insert(0, lambda: self._wait_seq(s.device, src, seq))
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
            self._push(s, lambda: self._wait_word(s.device, address, value))

    def _wait_word(self, device: int, address: int, value: int) -> None:
        with self._lock:
            while device not in self._faults:
                if not self._mapped(device, address):
                    # Unregistered under a pending wait: the GPU's read would fault.
                    self._fault(device, _ILLEGAL_ADDRESS)
                    return
                if (_hostword.load(address) - value) % _U64 < _I64_SIGN:
                    return  # (int64_t)(*address - value) >= 0, as the driver compares
                self._deps.wait(_WORD_POLL_S)

    def enqueue_write_value64(self, stream: int, address: int, value: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWriteValue64")
            if not 0 <= value < _U64:
                raise _error(_INVALID_VALUE, "cuStreamWriteValue64")
            self._word(s, address, "cuStreamWriteValue64")

            def write() -> None:
                with self._lock:
                    if not self._mapped(s.device, address):
                        self._fault(s.device, _ILLEGAL_ADDRESS)
                        return
                    _hostword.store(address, value)
                    self._deps.notify_all()

            self._push(s, write)
