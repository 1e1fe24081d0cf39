"""Events: points in GPU work that coroutines await.

- :class:`Event`: what :meth:`Stream.record` makes, an event of the library on one of its
  streams, whose waits share the stream's wait history.
- :func:`wait_event`: an event that another library owns (PyTorch, CuPy, cuda.core, a raw
  ``CUevent``), awaited by its handle.
- :class:`IpcEvent`: an event shared between processes. Create one, hand its handle to
  another process (an :class:`IpcEventHandle`, which pickles), open it there, and record and
  await it in either process. CUDA's handle (``CUipcEventHandle``) is 64 opaque bytes that any
  channel can carry; an :class:`IpcEventHandle` adds the UUID of the event's GPU, because the
  other process may number its devices differently (``CUDA_VISIBLE_DEVICES``). An opened event
  is a plain CUDA event of this process, awaited through a private stream.
- ``BaseEvent``: the base of :class:`Event` and :class:`IpcEvent`, the events the library
  owns. A stream waits for either (``Stream.enqueue_event_wait``), and :func:`wait_event`
  awaits either as itself. ``Stream.record()`` makes an ``Event`` and ``IpcEvent.record()``
  takes a ``Stream``: ``_stream`` imports this module, and registers ``Stream`` as a
  ``RecordingStream`` for that check, so that this module needs no import of it.

**Foreign events.** A foreign event has no stream that aiocudasem knows, so its point is keyed
by a *foreign key*, a negative number made from the event's handle and device, where a stream's
point is keyed by the stream's (non-negative) handle. The key gives the event a chain and a
side stream of its own: waiters of one event share one host function, and waits on different
events never queue behind each other. Its host function always goes on the side stream (see
``_notifier._loop``), whatever ``configure(wake=...)`` says, since there is no work stream to
launch it on.

A stream's points come in stream order, so a later point never completes before the chain's
head. An event's records need not: a wait abandoned while its host function is armed leaves
that host function (and its side stream's wait) behind the old record, which may never
complete, and the event may be recorded again. So every abandoned wait (cancelled, or ended by
its loop's shutdown) *retires* its key: the key also carries a generation, and later waits on
the event take a new one, with a new chain and a new side stream. The generations are
process-wide, since side streams outlive an event loop. The retired key's side stream becomes
a spare (``_pools.side_streams.retire``): a later key takes it once its host function has run,
and a completed wait destroys the idle spares, so that a wait cancelled again and again makes
streams only while the abandoned ones are still blocked, and leaves none behind once the work
completes.
"""

from __future__ import annotations

import abc
import itertools
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from . import _log, _release
from ._checks import check_device, check_ordinal, resolve_device, resolve_driver
from ._driver import Driver
from ._entries import driver_label
from ._errors import AiocudasemError, CudaError, DeviceFaultError, DeviceMismatchError
from ._lifetime import OnDevice, Owned
from ._notifier import Point, current_notifier, side_streams, wait_private_stream

if TYPE_CHECKING:
    from typing import Self

    from ._stream import Stream

__all__ = (
    "BaseEvent",
    "Event",
    "IpcEvent",
    "IpcEventHandle",
    "RecordingStream",
    "create_ipc_event",
    "foreign_key",
    "open_ipc_event",
    "wait_event",
)

_CAPTURED_EVENT: Final = 907  # CUDA_ERROR_CAPTURED_EVENT: a query of an event recorded in capture


class BaseEvent(Owned):
    """Base of :class:`Event` and :class:`~aiocudasem.IpcEvent`: a CUDA event of this process
    that the library owns, which a stream can wait for and a coroutine can await."""

    __slots__ = ()

    @staticmethod
    def _destroy(driver: Driver, handle: int) -> None:
        _destroy_event(driver, handle)

    @property
    def _event_driver(self) -> Driver:
        """The driver the event belongs to."""
        raise NotImplementedError

    async def wait(self) -> None:
        """Wait until the event's work has completed (each kind says which work)."""
        raise NotImplementedError


class Event(BaseEvent):
    """A point in a stream: everything enqueued on it before :meth:`Stream.record`.

    Several coroutines can wait for one event; they share one notification. Close it with
    :meth:`close` (or ``async with``), or let it be collected: an event may be, without a
    warning.
    """

    __slots__ = ("_point", "_stream")
    _point: Point
    _stream: Stream
    _factory = "use Stream.record() to get an Event"
    _noun = "event"
    _warn_when_collected = False

    @classmethod
    def _create(cls, stream: Stream, handle: int) -> Self:
        self = object.__new__(cls)
        self._stream = stream
        self._point = Point(
            stream._driver, stream._device, stream._handle, handle, None, stream._history
        )
        self._own(handle, stream._driver, handle)
        return self

    @property
    def _event_driver(self) -> Driver:
        return self._stream._driver

    def query(self) -> bool:
        """True if the captured work has completed. Non-blocking."""
        return self._stream._driver.event_query(self.handle)

    async def wait(self) -> None:
        """Wait until the captured work has completed. A checkpoint; cancelling abandons the
        wait only. Raises :class:`DeviceFaultError` if the device faults meanwhile,
        ``anyio.ClosedResourceError`` for a closed event, and ``anyio.BusyResourceError``
        while another event loop, still running, waits for the event or holds its armed
        notification: await an event from one event loop at a time."""
        self.handle  # noqa: B018 - raises ClosedResourceError once closed
        try:
            await current_notifier().wait(self._point)
        except CudaError as exc:
            if exc.status != _CAPTURED_EVENT:
                raise
            raise exc._explained(
                "the event was recorded on a stream that was capturing a CUDA graph, so it "
                "marks a point in the graph, not work that will complete; record it outside "
                "capture, or await aiocudasem.launch_graph() of the graph"
            ) from None

    def close(self) -> None:
        """Destroy the event. Idempotent. Raises ``anyio.BusyResourceError`` while a coroutine
        waits on it: close it once those waits are over. A driver failure becomes a
        ``RuntimeWarning``; after a device fault it succeeds quietly."""
        if self._point.waiting and not self._point.done:
            raise anyio.BusyResourceError("waiting on")
        super().close()


class RecordingStream(abc.ABC):  # noqa: B024 - a registration point, not an interface
    """What :meth:`IpcEvent.record` records on: the library's ``Stream``, which registers
    itself here (``_stream`` sits above this module, which therefore does not import it)."""

    __slots__ = ()


# ---------------------------------------------------------------- interprocess events

_HANDLE_SIZE: Final = 64
_UUID_SIZE: Final = 16


@dataclass(frozen=True, slots=True)
class IpcEventHandle:
    """What another process needs to open an interprocess event: plain, picklable data. Get
    one from :meth:`IpcEvent.export`; open it with :func:`open_ipc_event`."""

    #: CUDA's handle: the 64 bytes of ``CUipcEventHandle``.
    data: bytes
    #: The 16-byte UUID of the event's GPU, by which the opening process finds its ordinal.
    device_uuid: bytes

    def __post_init__(self) -> None:
        for name, value, size in (
            ("data", self.data, _HANDLE_SIZE),
            ("device_uuid", self.device_uuid, _UUID_SIZE),
        ):
            if not isinstance(value, bytes):
                raise TypeError(f"IpcEventHandle.{name} must be bytes, not {type(value).__name__}")
            if len(value) != size:
                raise ValueError(f"IpcEventHandle.{name} must have {size} bytes, not {len(value)}")


class IpcEvent(BaseEvent, OnDevice):
    """A CUDA event shared between processes (``CU_EVENT_INTERPROCESS``): one process creates
    it with :func:`create_ipc_event` and exports it; others open it with
    :func:`open_ipc_event`. Either side may :meth:`record` it on a stream, make a stream wait
    for it (:meth:`Stream.enqueue_event_wait`), :meth:`query` it and ``await``
    :meth:`wait`; each of those sees the event's most recent record, in whichever process.

    The creator's event must outlive every opened copy: CUDA leaves the behaviour of an opened
    event undefined once the creating process has destroyed it (or exited). A consumer should
    watch its producer (a socket it holds, say) and stop waiting when it goes away. Release it
    with ``aclose()``, ``close()`` or ``async with``; interprocess events have no timing.
    """

    __slots__ = ("_opened", "_waiters")
    _opened: bool
    _waiters: int
    _factory = "use aiocudasem.create_ipc_event() or aiocudasem.open_ipc_event()"
    _noun = "interprocess event"

    @classmethod
    def _create(cls, driver: Driver, device: int, handle: int, opened: bool) -> Self:
        self = object.__new__(cls)
        self._driver = driver
        self._device = device
        self._opened = opened
        self._waiters = 0
        self._own(handle, driver, handle)
        return self

    def _describe(self) -> str:
        how = "opened" if self._opened else "created"
        return f"aiocudasem.IpcEvent {self._handle:#x} ({how}, device {self._device})"

    @property
    def _event_driver(self) -> Driver:
        return self._driver

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle={self._handle:#x}"
        how = "opened" if self._opened else "created"
        return f"<IpcEvent {how} device={self._device} {state}>"

    @property
    def opened(self) -> bool:
        """True for an event opened from another process's handle, False for one created
        here."""
        return self._opened

    def record(self, stream: Stream) -> None:
        """Record the event on ``stream``: it captures the work enqueued there so far, for
        every process that has the event. Non-blocking. Raises ``TypeError`` for anything but
        a :class:`Stream`, :class:`DeviceMismatchError` for a stream of another device or
        driver, and ``anyio.ClosedResourceError`` once either is closed."""
        if not isinstance(stream, RecordingStream):
            raise TypeError(
                f"record() takes an aiocudasem.Stream, not {type(stream).__name__}: adopt a "
                "foreign stream with aiocudasem.Stream.adopt()"
            )
        handle = self.handle
        self._check_stream(stream)
        self._driver.event_record(handle, stream.handle)

    def _check_stream(self, stream: Stream) -> None:
        """Raise :class:`DeviceMismatchError` unless ``stream`` is of this event's driver and
        device."""
        if stream._driver is not self._driver:
            raise DeviceMismatchError(
                f"the interprocess event belongs to "
                f"{driver_label(self._driver, stream._driver)}, the stream to "
                f"{driver_label(stream._driver, self._driver)}"
            )
        if stream._device != self._device:
            raise DeviceMismatchError(
                f"the interprocess event is on device {self._device}, the stream on device "
                f"{stream._device}"
            )

    def query(self) -> bool:
        """True if the work of the event's most recent record (in any process) has
        completed, or if it was never recorded. Non-blocking."""
        return self._driver.event_query(self.handle)

    async def wait(self) -> None:
        """Wait until the work of the event's most recent record at the time of the call, in
        whichever process it was made, has completed. No thread blocks and nothing polls on
        the host. A checkpoint; cancelling abandons the wait only. Raises
        :class:`DeviceFaultError` if this process's device faults meanwhile and
        ``anyio.ClosedResourceError`` for a closed event."""
        handle = self.handle
        self._waiters += 1
        try:
            driver = self._driver
            if driver.event_query(handle):  # the record of this moment is complete
                await anyio.lowlevel.checkpoint()
                return
            # Capture the record of this moment on a private stream (cuStreamWaitEvent takes
            # the event's state at the call) and await that stream. A query of the event itself
            # would see records made later, in any process, and a wait that spins or chains
            # would then cover a record that may depend on this one.
            await wait_private_stream(
                driver, self._device, lambda stream: driver.stream_wait_event(stream, handle)
            )
        finally:
            self._waiters -= 1

    def export(self) -> IpcEventHandle:
        """The handle to give another process. Only the creator exports: an opened event is
        another process's. Raises ``ValueError`` for an opened event and
        ``anyio.ClosedResourceError`` once closed."""
        handle = self.handle
        if self._opened:
            raise ValueError(
                "this interprocess event was opened from another process's handle: export the "
                "creator's, which is the same event"
            )
        data = self._driver.ipc_event_export(handle)
        return IpcEventHandle(data, self._driver.device_uuid(self._device))

    def close(self) -> None:
        """Destroy this process's event. Idempotent. Raises ``anyio.BusyResourceError`` while a
        coroutine waits on it. Once the creator has closed its event, CUDA leaves its use in the
        other processes undefined: close the opened copies first."""
        if self._waiters and not self.closed:
            raise anyio.BusyResourceError("waiting on")
        super().close()


def create_ipc_event(device: int = 0, *, driver: Driver | str | None = None) -> IpcEvent:
    """Create an interprocess event on ``device``. Synchronous.

    Raises ``TypeError``/``ValueError`` for a bad ``device``,
    :class:`~aiocudasem.UnsupportedFeatureError` for a device without interprocess events,
    and :class:`~aiocudasem.CudaError` if the driver cannot create it.
    """
    drv, ordinal = resolve_device(device, driver)
    return IpcEvent._create(drv, ordinal, drv.ipc_event_create(ordinal), opened=False)


def open_ipc_event(handle: IpcEventHandle, *, driver: Driver | str | None = None) -> IpcEvent:
    """Open, in this process, the interprocess event that another process exported as
    ``handle``, on this process's device with the handle's GPU UUID. Synchronous.

    Raises ``TypeError`` for anything but an :class:`IpcEventHandle`,
    :class:`DeviceMismatchError` if no device of ``driver`` has the handle's UUID,
    :class:`~aiocudasem.UnsupportedFeatureError` for a device without interprocess events,
    and :class:`~aiocudasem.CudaError` if the driver refuses the handle (the creating process
    has gone, or the handle was made in this process).
    """
    if not isinstance(handle, IpcEventHandle):
        raise TypeError(
            f"open_ipc_event() takes an aiocudasem.IpcEventHandle (from IpcEvent.export()), "
            f"not {type(handle).__name__}"
        )
    drv = resolve_driver(driver)
    _release.flush()
    for ordinal in range(drv.device_count()):
        if drv.device_uuid(ordinal) == handle.device_uuid:
            break
    else:
        raise DeviceMismatchError(
            f"no device of the {drv.name} driver has the event's GPU (UUID "
            f"{handle.device_uuid.hex()}): open it on the machine and GPU it was created on"
        )
    return IpcEvent._create(drv, ordinal, drv.ipc_event_open(ordinal, handle.data), opened=True)


def _destroy_event(driver: Driver, handle: int) -> None:
    try:
        driver.event_destroy(handle)
    except DeviceFaultError:
        pass  # the faulted context took the event with it
    except AiocudasemError as exc:
        _log.logger.warning("destroying an event failed: %s", exc)
        warnings.warn(f"destroying an event failed: {exc}", RuntimeWarning, stacklevel=1)


_DEVICE_BITS: Final = 12  # devices per key: ordinals below 4096
_HANDLE_BITS: Final = 64
_RETIRED_LIMIT: Final = 65536  # events per driver whose generation is remembered

# Per driver, (handle, device) -> the generation of the event's key, for events whose key a
# wait has retired; absent means generation 0.
_retired: weakref.WeakKeyDictionary[Driver, OrderedDict[tuple[int, int], int]] = (
    weakref.WeakKeyDictionary()
)
_generations = itertools.count(1)
_lock = threading.Lock()


def foreign_key(handle: int, device: int, generation: int = 0) -> int:
    """The stream key of a foreign event's point: negative, so that it never equals a
    stream's handle, and different for each (handle, device, generation)."""
    return -1 - (generation << (_HANDLE_BITS + _DEVICE_BITS) | handle << _DEVICE_BITS | device)


def _key(driver: Driver, handle: int, device: int) -> int:
    with _lock:
        table = _retired.get(driver)
        generation = 0 if table is None else table.get((handle, device), 0)
    return foreign_key(handle, device, generation)


def _retire(driver: Driver, handle: int, device: int, key: int) -> None:
    """A wait on the event, with ``key``, was abandoned, perhaps with its host function armed:
    later waits take a new key, and the old key's side stream becomes a spare (see the
    module's docstring). Another wait may have retired ``key`` already."""
    with _lock:
        table = _retired.setdefault(driver, OrderedDict())
        if foreign_key(handle, device, table.get((handle, device), 0)) == key:
            table[(handle, device)] = next(_generations)
        table.move_to_end((handle, device))
        if len(table) > _RETIRED_LIMIT:
            table.popitem(last=False)
    side_streams.retire(driver, device, key)


async def wait_event(
    event: object, *, device: int | None = None, driver: Driver | str | None = None
) -> None:
    """Wait until the work captured by ``event`` has completed, as ``event.query()`` would
    report it, without blocking the event loop and without polling.

    ``event`` is a PyTorch ``torch.cuda.Event``, a CuPy ``cupy.cuda.Event``, a cuda.core
    ``Event``, a ``CUevent`` of cuda-bindings, a raw ``CUevent`` handle (an int), or an
    aiocudasem :class:`Event` or :class:`IpcEvent` (awaited as itself). For example, instead
    of polling ``ev.query()``, ``ev.record(torch.cuda.current_stream())`` then
    ``await aiocudasem.wait_event(ev)``.

    - The wait covers the event's most recent record at the time of the call. An event that
      was never recorded is complete, as CUDA's query says (PyTorch creates its CUDA event on
      the first record).
    - ``device`` is the ordinal of the device whose work the event captures. It is read from
      the event where the library says (PyTorch's ``device.index``, cuda.core's
      ``device.device_id``); for a raw handle or a CuPy event it defaults to 0, so pass it
      for an event of another device. It decides which device's faults end the wait with
      :class:`DeviceFaultError`: a fault of another device is not noticed, and the wait does
      not end. The wait itself works across devices. A ``device`` that contradicts the event's
      own is a ``ValueError``.
    - ``driver`` is as for :func:`open_stream` (by default the real CUDA driver).
    - Waiters of one event share one host function. Each foreign event gets a side stream of
      its own, so waits on different events never hold each other up (side streams are
      pooled, 1,024 at most, least recently used first).
    - The event must stay alive, and must not be recorded again, until the wait returns. The
      wait keeps the library's event object alive, but cannot keep a raw handle alive: a raw
      handle must name a live event (CUDA's behaviour for any other is undefined; the
      simulated device raises :class:`CudaError`).
    - A checkpoint; cancelling abandons the observation only. Once a wait has returned, the
      event may be recorded again and awaited again, also after a cancelled wait whose
      record never completes.

    Raises ``TypeError`` for a stream (use :func:`wait_stream`), another aiocudasem object, a
    bool, a float or a string; ``ValueError`` for a null or out-of-range handle or a device
    that does not exist.
    """
    if isinstance(event, BaseEvent):  # an Event or an IpcEvent, awaited as itself
        if device is not None or driver is not None:
            raise ValueError(
                f"an aiocudasem {type(event).__name__} knows its device and driver: call "
                "wait_event(event) without device= or driver="
            )
        await event.wait()
        return
    handle, found = _event_handle(event)
    if device is None:
        device = 0 if found is None else found
    else:
        check_ordinal(device)
        if found is not None and found != device:
            raise ValueError(f"device={device}, but the event belongs to device {found}")
    drv = resolve_driver(driver)
    check_device(drv, device)
    if device >> _DEVICE_BITS:
        raise ValueError(f"device ordinals up to {(1 << _DEVICE_BITS) - 1} are supported")
    if handle == 0:
        # PyTorch creates its CUDA event on the first record: none yet, nothing to wait for.
        await anyio.lowlevel.checkpoint()
        return
    notifier = current_notifier()
    key = _key(drv, handle, device)
    point = Point(drv, device, key, handle, None, notifier.history(drv, key))
    try:
        await notifier.wait(point)
    except BaseException:
        # Abandoned (cancelled, or its loop shutting down, which disarms the point first):
        # its host function may still be queued behind this record.
        if not point.done:
            _retire(drv, handle, device, key)
        raise
    side_streams.sweep(drv, device)


def _event_handle(event: object) -> tuple[int, int | None]:
    """The raw CUevent handle of ``event`` (0: a PyTorch event never recorded), and its device
    ordinal if the event says."""
    kind = type(event).__name__
    # A Stream has __cuda_stream__ too.
    if hasattr(event, "__cuda_stream__") or "Stream" in kind:
        raise TypeError(
            f"{kind} is a stream, not an event: await aiocudasem.wait_stream(stream) for "
            "everything enqueued on a stream"
        )
    if type(event).__module__.partition(".")[0] == "aiocudasem":
        raise TypeError(f"an aiocudasem {kind} is not an event: Stream.record() makes one")
    if isinstance(event, int) and not isinstance(event, bool):
        return _pointer(event, "a CUevent handle", zero_ok=False), None
    for attribute in ("cuda_event", "handle", "ptr"):  # PyTorch, cuda.core, CuPy
        if hasattr(event, attribute):
            raw = getattr(event, attribute)
            what = f"{kind}.{attribute}"
            # PyTorch creates its CUDA event on the first record: 0 until then.
            handle = _pointer(raw, what, zero_ok=attribute == "cuda_event")
            return handle, _event_device(event)
    if kind == "CUevent" and hasattr(event, "__int__"):  # cuda-bindings' handle type
        return _pointer(event, "the CUevent", zero_ok=False), None
    raise TypeError(
        f"cannot wait for an instance of {kind}: pass a torch.cuda.Event, a cupy.cuda.Event, "
        "a cuda.core Event, a CUevent, a raw CUevent handle (int) or an aiocudasem Event"
    )


def _pointer(raw: object, what: str, *, zero_ok: bool) -> int:
    if isinstance(raw, bool) or not (isinstance(raw, int) or type(raw).__name__ == "CUevent"):
        raise TypeError(f"{what} is a {type(raw).__name__}, not a CUevent handle")
    value: int = int(raw)  # type: ignore[call-overload]
    if not (0 if zero_ok else 1) <= value < 1 << 64:
        raise ValueError(f"{what} is {value}: a CUevent handle is a pointer in (0, 2**64)")
    return value


def _event_device(event: object) -> int | None:
    """The device ordinal an event reports: PyTorch's ``device.index`` (None before the first
    record), cuda.core's ``device.device_id``, or a plain int."""
    dev = getattr(event, "device", None)
    for value in (getattr(dev, "index", None), getattr(dev, "device_id", None), dev):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)
