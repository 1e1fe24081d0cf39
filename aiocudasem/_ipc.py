"""Interprocess CUDA events: create one, hand its handle to another process (it pickles), open
it there, and record and await it in either process.

CUDA's handle (``CUipcEventHandle``) is 64 opaque bytes that any channel can carry; an
:class:`IpcEventHandle` adds the UUID of the event's GPU, because the other process may number
its devices differently (``CUDA_VISIBLE_DEVICES``). An opened event is a plain CUDA event of
this process, so waiting on it goes through the same path as :func:`~aiocudasem.wait_event`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from . import _release
from ._checks import resolve_device, resolve_driver
from ._entries import driver_label
from ._errors import DeviceMismatchError
from ._events import BaseEvent
from ._lifetime import OnDevice
from ._notifier import wait_private_stream
from ._stream import Stream

if TYPE_CHECKING:
    from typing import Self

    from ._driver import Driver

__all__ = ("IpcEvent", "IpcEventHandle", "create_ipc_event", "open_ipc_event")

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
        if not isinstance(stream, Stream):
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
