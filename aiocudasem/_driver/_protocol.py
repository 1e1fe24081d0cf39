"""The device seam's declarations: the driver Protocol and the records it passes, and what
every driver of this package shares (registration for fork safety, the errors of a driver that
cannot run). The drivers' packages import this module, not the package, which picks a driver
(``get_driver()``) and imports them when asked."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio

from .._errors import DeviceMismatchError, DriverUnavailableError

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = (
    "DRIVER_ENV",
    "Driver",
    "SemOp",
    "SemaphoreDesc",
    "TrackedDriver",
    "check_stream_handle",
    "cuda_stream_handle",
    "forked_error",
    "stream_handle",
    "track",
    "unavailable",
)

#: Environment variable that picks the default driver: ``cuda`` (default) or ``sim``. Read by
#: every ``get_driver(None)`` call, that is by every call given ``driver=None``; surrounding
#: whitespace is ignored and an empty value means ``cuda``.
DRIVER_ENV = "AIOCUDASEM_DRIVER"


@dataclass(frozen=True, slots=True)
class SemaphoreDesc:
    """What to import: the fields of ``CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC``."""

    #: A ``HandleType`` value.
    handle_type: int
    #: The fd, for the fd types.
    fd: int = -1
    #: The Win32 ``HANDLE``, for the Win32 and D3D types.
    win32_handle: int = 0
    #: The address of a NUL-terminated UTF-16 name, kept alive by the caller during the call.
    win32_name: int = 0
    #: The ``NvSciSyncObj`` address, for ``NVSCISYNC``.
    nvsci_obj: int = 0
    #: The descriptor's CUDA flags.
    flags: int = 0


@dataclass(frozen=True, slots=True)
class SemOp:
    """One entry of a wait or signal batch, on a driver semaphore handle."""

    #: The driver's semaphore handle (``ExternalSemaphore.handle``).
    sem: int
    #: The fence value: timelines and D3D fences.
    value: int = 0
    #: The keyed mutex's key.
    key: int = 0
    #: The keyed mutex's acquire timeout, waits only (``0xFFFFFFFF`` waits forever).
    timeout_ms: int = 0
    #: The address of an ``NvSciSyncFence``.
    nvsci_fence: int = 0
    #: The flags of the entry's CUDA parameters (``SKIP_NVSCIBUF_MEMSYNC``).
    flags: int = 0


@runtime_checkable
class Driver(Protocol):
    """The operations the library needs from a device: devices and their health, streams,
    events (interprocess ones too), external semaphores, host functions, semaphore nodes of
    graphs and 64-bit words of mapped host memory. All calls are synchronous and cheap (they
    enqueue, query or create). ``stream_synchronize`` and ``event_synchronize`` block, and so
    may ``destroy_semaphore``: on an H200 it waited until no stream was blocked on a
    semaphore.

    Work to run on the streams (kernels, pinned memory) is not part of it: the demo, the tests
    and the benchmarks get theirs from ``aiocudasem.testing.workloads()``."""

    #: The driver's name: ``"cuda"`` or ``"sim"`` (a ``SimDriver`` may be given another).
    name: str
    #: True for a simulated device.
    simulated: bool

    # devices
    def device_count(self) -> int:
        """The number of devices."""
        ...

    def device_uuid(self, ordinal: int) -> bytes:
        """The device's 16-byte UUID; it equals Vulkan's ``deviceUUID`` for the same GPU."""
        ...

    def device_name(self, ordinal: int) -> str:
        """The device's name, for people."""
        ...

    def check_health(self, ordinal: int) -> None:
        """Raise DeviceFaultError if the device's context hit a sticky error."""
        ...

    # streams
    def stream_create(self, ordinal: int, non_blocking: bool, priority: int) -> int:
        """Create a stream in the device's primary context and return its handle."""
        ...

    def stream_destroy(self, stream: int) -> None:
        """Destroy a stream; the driver frees it once its enqueued work completes."""
        ...

    def stream_device(self, stream: int) -> int:
        """The ordinal of the stream's device. The real driver raises DeviceMismatchError for a
        stream outside that device's primary context. Safe on a stream that is capturing a
        graph: it leaves the capture intact."""
        ...

    def stream_capturing(self, stream: int) -> bool:
        """True while the stream is capturing a graph (``cuStreamIsCapturing``), also once
        that capture has been invalidated and not yet ended. Leaves the capture intact."""
        ...

    def stream_query(self, stream: int) -> bool:
        """True if all work enqueued on the stream has completed."""
        ...

    def stream_synchronize(self, stream: int) -> None:
        """Block until all work enqueued on the stream has completed."""
        ...

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Make work enqueued later on the stream wait for the event, on the GPU."""
        ...

    def launch_host_func(self, stream: int, fn: int, user_data: int) -> None:
        """Enqueue a host function: ``fn`` is the address of a C ``CUhostFn``, called with
        ``user_data``."""
        ...

    # events
    def event_create(self, ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        """``blocking``: ``event_synchronize`` on it sleeps in the driver instead of spinning
        (``CU_EVENT_BLOCKING_SYNC``)."""
        ...

    def event_destroy(self, event: int) -> None:
        """Destroy an event."""
        ...

    def event_record(self, event: int, stream: int) -> None:
        """Record the event on the stream: it captures the work enqueued so far."""
        ...

    def event_query(self, event: int) -> bool:
        """True if the work the event captured has completed."""
        ...

    def event_synchronize(self, event: int) -> None:
        """Block until the event's work is done. Raise DeviceFaultError if the device's context
        hits a sticky error first, on whichever of its streams."""
        ...

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Milliseconds between two completed events created with ``timing=True``."""
        ...

    # external semaphores
    def import_semaphore(self, ordinal: int, desc: SemaphoreDesc) -> int:
        """Import an external semaphore into the device and return its handle. On success
        the driver owns ``desc.fd``."""
        ...

    def destroy_semaphore(self, sem: int) -> None:
        """Destroy an imported semaphore. May block (see above)."""
        ...

    def enqueue_semaphore_waits(self, ops: Sequence[SemOp], stream: int) -> None:
        """Enqueue the waits on the stream in one ``cuWaitExternalSemaphoresAsync`` call."""
        ...

    def enqueue_semaphore_signals(self, ops: Sequence[SemOp], stream: int) -> None:
        """Enqueue the signals on the stream in one ``cuSignalExternalSemaphoresAsync``
        call."""
        ...

    # graphs
    def graph_add_semaphore_node(
        self, graph: int, dependencies: Sequence[int], ops: Sequence[SemOp], signal: bool
    ) -> int:
        """Add an external semaphore wait node (``signal`` False) or signal node to the graph
        (a ``CUgraph``), after the nodes ``dependencies``; return the new node's handle
        (``cuGraphAddExternalSemaphoresWaitNode`` / ``SignalNode``)."""
        ...

    def graph_exec_set_semaphore_node(
        self, graph_exec: int, node: int, ops: Sequence[SemOp], signal: bool
    ) -> None:
        """Set the parameters of a semaphore node in an executable graph (a
        ``CUgraphExec``), for its later launches (``cuGraphExecExternalSemaphoresWaitNode
        SetParams`` / ``Signal``); the number of semaphores stays the node's."""
        ...

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        """Launch the executable graph on the stream (``cuGraphLaunch``)."""
        ...

    def graph_semaphore_nodes(self, graph: int, signal: bool) -> list[int]:
        """The graph's external semaphore wait nodes (``signal`` False) or signal nodes, in the
        order ``cuGraphGetNodes`` gives them (the order they were added or captured)."""
        ...

    # interprocess events
    def ipc_event_create(self, ordinal: int) -> int:
        """Create an event that other processes can open (``cuEventCreate`` with
        ``CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING``); destroy it with
        :meth:`event_destroy`. Raise ``UnsupportedFeatureError`` where the device has no
        interprocess events."""
        ...

    def ipc_event_export(self, event: int) -> bytes:
        """The 64 bytes of the interprocess event's handle (``cuIpcGetEventHandle``), for
        another process's :meth:`ipc_event_open`."""
        ...

    def ipc_event_open(self, ordinal: int, handle: bytes) -> int:
        """Open another process's interprocess event from its 64-byte handle
        (``cuIpcOpenEventHandle``) on the device; it behaves as an event created here without
        timing, and is destroyed with :meth:`event_destroy`."""
        ...

    # host memory words (host timelines)
    def host_register(self, ordinal: int, address: int, size: int) -> int:
        """Page-lock ``size`` bytes of host memory at ``address`` and map them for the device
        (``cuMemHostRegister`` with ``PORTABLE | DEVICEMAP``); return the device address of
        ``address``. Raise :class:`UnsupportedFeatureError` if the device cannot use 64-bit
        stream memory operations on mapped host memory."""
        ...

    def host_unregister(self, address: int) -> None:
        """Undo :meth:`host_register` (``cuMemHostUnregister``). No enqueued operation may
        still use the memory."""
        ...

    def notify_word(self, address: int) -> None:
        """The host stored to the registered word at the host address ``address`` (a host
        timeline's signal). The real driver does nothing: the GPU sees the store. A simulated
        device that polls host memory looks at once."""
        ...

    def enqueue_wait_value64(self, stream: int, address: int, value: int) -> None:
        """Make later work on the stream wait, on the GPU, until the 64-bit word at the device
        address ``address`` reaches ``value`` (``cuStreamWaitValue64``, a cyclic
        greater-or-equal: ``(int64_t)(*address - value) >= 0``)."""
        ...

    def enqueue_write_value64(self, stream: int, address: int, value: int) -> None:
        """Write ``value`` to the 64-bit word at the device address ``address`` once earlier
        work on the stream has completed, after a system-wide memory fence
        (``cuStreamWriteValue64``)."""
        ...


@runtime_checkable
class TrackedDriver(Driver, Protocol):
    """A driver of this package (``cuda`` or ``sim``), which registers itself with
    :func:`track` when created. Not part of the public protocol: a driver of the user's own is
    never tracked, and needs none of this."""

    def _after_fork(self) -> None:
        """Called in a forked child, on every tracked driver inherited from the parent: from
        then on every call on it raises :class:`DriverUnavailableError`."""
        ...


_live: weakref.WeakSet[TrackedDriver] = weakref.WeakSet()  # every driver object of this process
#: A CUDA driver was initialised in a parent of this (forked) process.
cuda_before_fork = False


def track(driver: TrackedDriver) -> None:
    """Register a new driver object, so that a fork can disable it in the child."""
    _live.add(driver)


def forked_error(name: str) -> DriverUnavailableError:
    reason = "it was initialised before os.fork(), and CUDA cannot be used in a forked child"
    return DriverUnavailableError(
        f"the {name} driver cannot be used in this process: {reason}. Use CUDA only in the "
        "child, or start child processes with multiprocessing's 'spawn' or 'forkserver' "
        "method.",
        reason=reason,
    )


def _after_fork_in_child() -> None:
    """CUDA cannot be used in a forked child, so every driver object inherited from the parent
    refuses every call with a clear :class:`DriverUnavailableError` instead of hanging (the
    simulated device's worker threads and locks did not survive the fork either). A new
    simulated device can be created in the child; a new CUDA driver cannot."""
    global cuda_before_fork
    for drv in list(_live):
        if not drv.simulated:
            cuda_before_fork = True
        drv._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def unavailable(reason: str) -> DriverUnavailableError:
    return DriverUnavailableError(
        f"the CUDA driver cannot be used: {reason}. To run on the simulated device instead, "
        f"pass driver='sim' or set {DRIVER_ENV}=sim.",
        reason=reason,
    )


def cuda_stream_handle(obj: object) -> int | None:
    """The handle that ``obj``'s ``__cuda_stream__`` gives (the CUDA stream protocol, version
    0: ``(0, handle)``), checked; None if ``obj`` has no ``__cuda_stream__``. Raises
    ``TypeError`` for a value that is not a pair of ints, and ``ValueError`` for another
    version, a handle outside [0, 2**64), or a ``__cuda_stream__()`` that raised. Serves
    ``Stream.adopt()``, the drivers and the workloads alike."""
    proto = getattr(obj, "__cuda_stream__", None)
    if proto is None:
        return None
    name = type(obj).__name__
    try:
        value = proto() if callable(proto) else proto
    except anyio.ClosedResourceError:
        raise  # a closed stream of this library (or another's) says so itself
    except Exception as exc:
        raise ValueError(
            f"cannot use {name} as a CUDA stream: its __cuda_stream__() raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise TypeError(
            f"__cuda_stream__ of {name} returned {value!r}, not a (version, handle) pair of ints"
        )
    version, handle = value
    if version != 0:
        raise ValueError(
            f"__cuda_stream__ of {name} returned protocol version {version}: only version 0, "
            "(0, handle), is defined"
        )
    return check_stream_handle(
        handle, f"__cuda_stream__ of {name} returned the handle {handle}, out of range"
    )


def check_stream_handle(handle: int, what: str) -> int:
    """``handle``, a CUstream handle: an int in [0, 2**64), else ``ValueError`` after
    ``what``."""
    if not 0 <= handle < 1 << 64:
        raise ValueError(f"{what}: a CUstream handle is an int in [0, 2**64)")
    return int(handle)


def stream_handle(where: str, stream: object, driver: object, mismatch: str) -> int:
    """The handle of ``stream`` on ``driver``: an int, or an object with ``__cuda_stream__``
    (the library's ``Stream`` is one: the drivers, below the objects, know it only by the
    protocol), checked as :func:`cuda_stream_handle` does. An object whose ``driver``
    attribute names another driver is refused with ``DeviceMismatchError``: its handle means
    another stream, or none, on this one (two ``SimDriver`` objects number their streams
    alike). ``where`` names the call in the messages; ``mismatch`` is that refusal's message
    after ``where``, with ``{owner}`` and ``{driver}`` (their reprs) to fill in. Serves
    ``SimDriver.launch()`` and the workloads."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return check_stream_handle(stream, f"{where}: the stream handle {stream} is out of range")
    try:
        handle = cuda_stream_handle(stream)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from exc.__cause__
    if handle is None:
        raise TypeError(
            f"{where} takes a stream: an aiocudasem.Stream, another object with "
            f"__cuda_stream__, or a stream handle (an int), not {type(stream).__name__}"
        )
    owner = getattr(stream, "driver", None)
    if owner is not None and owner is not driver:
        raise DeviceMismatchError(f"{where}: " + mismatch.format(owner=owner, driver=driver))
    return handle
