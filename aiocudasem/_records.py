"""Interprocess events per record: :class:`IpcRecorder` in the producing process,
:class:`IpcRecords` in each consuming one, joined over a Unix socket by
:func:`send_ipc_recorder` and :func:`receive_ipc_records`.

An :class:`~aiocudasem.IpcEvent` holds only its most recent record, so a consumer cannot say
which record a wait covered. A recorder pairs the event with a *record count*, a host timeline
that the producer's stream writes after the work of each record: record n writes n
(``Signal(count, n)``), then records the event. The count's page is shared, so a consumer
awaits "record n" by its number (``count.wait_value(n)`` on the host, ``Wait(count, n)`` on its
streams), never misses one and never counts one twice. Records complete in order: a record on
another stream than the one before first waits, on the GPU, for the record before it.

**Lifetimes.** CUDA leaves an opened event undefined once its creator has destroyed it, and
refuses to open a handle whose event is gone (``invalid argument``). So each consumer
acknowledges on a second shared page, a counter that it adds one to once it has released its
copy of the event (or failed to open it), and the recorder's ``aclose()`` waits until every
consumer it sent the event to has acknowledged: with a WARNING after
:data:`~aiocudasem._log.CLOSE_WARNING_S` seconds that names the way out, and at most
``limit_s`` seconds. ``close()`` does not wait.

**A producer that dies.** The consumer's waits are on the count's page, which stays mapped in
the consumer after the producer's death: :meth:`IpcRecords.abandon` moves the count to
``HostTimeline.MAX``, so that every wait on it, GPU and host, goes on, and parked host waits
raise :class:`~aiocudasem.AbandonedError`. Nothing of the consumer waits on the event itself,
so no private stream stays blocked behind a record that will never complete.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Final

import anyio
import anyio.abc
import anyio.lowlevel

from . import _log
from ._checks import check_uint
from ._entries import Signal, Wait
from ._events import IpcEvent, IpcEventHandle, create_ipc_event, open_ipc_event
from ._processes import _check_stream
from ._stream import Stream, expect_stream
from ._timeline import LIMIT, HostTimeline, create_host_timeline, open_host_timeline

if TYPE_CHECKING:
    from types import TracebackType
    from typing import Self

    from ._driver import Driver

__all__ = (
    "IpcRecorder",
    "IpcRecords",
    "create_ipc_recorder",
    "receive_ipc_records",
    "send_ipc_recorder",
)

_TAG: Final = b"aiocudasem-ipc-records 1"
_TAG_SIZE: Final = 32
_HANDLE_SIZE: Final = 64
_UUID_SIZE: Final = 16
_SIZE: Final = _TAG_SIZE + _HANDLE_SIZE + _UUID_SIZE  # one message: the tag, the event's handle
#: How long ``IpcRecorder.aclose()`` waits for the consumers' acknowledgements by default.
CLOSE_LIMIT_S: Final = 30.0
_WAY_OUT: Final = (
    "Each consumer acknowledges once it has released its IpcRecords (aclose() or close()): "
    "close them first. To release without waiting, call close(), or pass a shorter limit_s= "
    "to aclose(); a consumer that still holds the event then holds an undefined one."
)


class IpcRecorder:
    """The producer's end: an interprocess event and a count of its records. Make one with
    :func:`create_ipc_recorder`, send it to each consumer with :func:`send_ipc_recorder`, and
    :meth:`record` on a stream: each record gets the next number, 1, 2, 3, ...

    Release it with ``aclose()`` (or ``async with``), which waits until every consumer it was
    sent to has released its :class:`IpcRecords` (see the module's rule on lifetimes), or with
    ``close()``, which does not wait.
    """

    __slots__ = ("_acks", "_count", "_event", "_last_stream", "_sent", "_timeline")
    _acks: HostTimeline
    _count: int
    _event: IpcEvent
    _last_stream: int | None
    _sent: int
    _timeline: HostTimeline

    def __init__(self) -> None:
        raise TypeError("use aiocudasem.create_ipc_recorder() to make an IpcRecorder")

    @classmethod
    def _create(cls, event: IpcEvent, timeline: HostTimeline, acks: HostTimeline) -> Self:
        self = object.__new__(cls)
        self._event = event
        self._timeline = timeline
        self._acks = acks
        self._count = 0
        self._sent = 0
        self._last_stream = None
        return self

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"records={self._count}"
        return f"<IpcRecorder device={self._event._device} {state} sent={self._sent}>"

    @property
    def event(self) -> IpcEvent:
        """The interprocess event, which each record records: its most recent record."""
        return self._event

    @property
    def timeline(self) -> HostTimeline:
        """The record count: the number of the last record whose work has completed."""
        return self._timeline

    @property
    def count(self) -> int:
        """How many records were made: the number of the last one."""
        return self._count

    @property
    def sent(self) -> int:
        """How many consumers the recorder was sent to."""
        return self._sent

    @property
    def outstanding(self) -> int:
        """How many of those have not acknowledged yet (have not released their copy)."""
        if self.closed:
            return 0
        return max(0, self._sent - self._acks.value)

    @property
    def closed(self) -> bool:
        return self._event.closed

    def record(self, stream: Stream) -> int:
        """Record the next record on ``stream``, and return its number n: once the work
        enqueued there so far has completed, the stream writes n to the count and records the
        event. Records complete in order: if the record before this one was made on another
        stream, ``stream`` first waits for it (``Wait(count, n - 1)``). Non-blocking. Raises
        ``TypeError`` for anything but a :class:`~aiocudasem.Stream`,
        :class:`~aiocudasem.DeviceMismatchError` for a stream of another device or driver,
        and ``anyio.ClosedResourceError`` once either is closed."""
        expect_stream(stream, "record()")
        if self.closed:
            raise anyio.ClosedResourceError("record() of a closed IpcRecorder")
        self._event._check_stream(stream)
        n = self._count + 1
        if n >= LIMIT:
            raise OverflowError("an IpcRecorder counts 2**63 - 1 records at most")
        if self._last_stream is not None and self._last_stream != stream.handle:
            stream.enqueue_wait(Wait(self._timeline, n - 1))
        stream.enqueue_signal(Signal(self._timeline, n))
        self._count = n
        self._last_stream = stream.handle
        self._event.record(stream)
        return n

    async def aclose(self, *, limit_s: float | None = CLOSE_LIMIT_S) -> None:
        """Release the recorder once every consumer it was sent to has released its copy of
        the event, ``limit_s`` seconds at most (``None``: no limit); a WARNING after 5 s names
        the way out, and another says so if the limit passes. Then the event is destroyed and
        the pages released (after the work that writes the count, as
        :meth:`HostTimeline.aclose` does). Idempotent. Cancelling it releases at once, as
        :meth:`close` does. Raises ``TypeError``/``ValueError`` for a ``limit_s`` that is not
        a number of seconds, before anything is released."""
        if limit_s is not None:
            if isinstance(limit_s, bool) or not isinstance(limit_s, int | float):
                raise TypeError(f"limit_s must be a number of seconds or None, not {limit_s!r}")
            if not limit_s >= 0:
                raise ValueError(f"limit_s must be at least 0, got {limit_s}")
        if self.closed:
            await anyio.lowlevel.checkpoint()
            return
        try:
            await self._wait_for_consumers(limit_s)
        except BaseException:
            self.close()
            raise
        self._acks.abandon()  # no GPU wait of a cut-short wait on it may hold its page
        self._event.close()
        try:
            await self._timeline.aclose()
        finally:  # cancelled too: its aclose() claims the page, and a thread releases it
            await self._acks.aclose()

    async def _wait_for_consumers(self, limit_s: float | None) -> None:
        sent, acks = self._sent, self._acks
        if acks.value >= sent:
            await anyio.lowlevel.checkpoint()
            return
        what = f"an IpcRecorder (device {self._event._device}, sent to {sent} consumer(s))"
        warn_at = _log.CLOSE_WARNING_S if limit_s is None else min(limit_s, _log.CLOSE_WARNING_S)
        with anyio.move_on_after(warn_at):
            await acks.wait_value(sent)
        if acks.value < sent and (limit_s is None or limit_s > warn_at):
            _log.logger.warning(
                "closing %s has waited %.1f s for %d consumer(s) to release the event and goes "
                "on waiting%s. %s",
                what,
                warn_at,
                sent - acks.value,
                "" if limit_s is None else f", {limit_s:.1f} s at most",
                _WAY_OUT,
            )
            with anyio.move_on_after(math.inf if limit_s is None else limit_s - warn_at):
                await acks.wait_value(sent)
        if acks.value < sent:
            _log.logger.warning(
                "closing %s: %d consumer(s) did not release the event within %.1f s; releasing "
                "it anyway, so their copies are undefined from now on",
                what,
                sent - acks.value,
                limit_s,
            )

    def close(self) -> None:
        """Release the recorder at once, without waiting for the consumers: those that have not
        released their copy of the event hold an undefined one from then on (a WARNING says
        how many). Idempotent."""
        if self.closed:
            return
        left = self.outstanding
        if left:
            _log.logger.warning(
                "closing an IpcRecorder while %d consumer(s) hold its event or have not opened "
                "it yet: their copies are undefined from now on (aclose() waits for them)",
                left,
            )
        self._acks.abandon()  # no GPU wait of a cut-short wait on it may hold its page
        self._event.close()
        self._timeline.close()
        self._acks.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class IpcRecords:
    """A consumer's end: the records of a producer's :class:`IpcRecorder`, received with
    :func:`receive_ipc_records`, awaited by number.

    Release it with ``aclose()``, ``close()`` or ``async with``: its copy of the event is
    destroyed first, then the acknowledgement is made (the producer's ``aclose()`` waits for
    it), then the pages are released. If the producer is gone, :meth:`abandon` first.
    """

    __slots__ = ("_acknowledged", "_acks", "_event", "_timeline")
    _acknowledged: bool
    _acks: HostTimeline
    _event: IpcEvent
    _timeline: HostTimeline

    def __init__(self) -> None:
        raise TypeError("use aiocudasem.receive_ipc_records() to get an IpcRecords")

    @classmethod
    def _create(cls, event: IpcEvent, timeline: HostTimeline, acks: HostTimeline) -> Self:
        self = object.__new__(cls)
        self._event = event
        self._timeline = timeline
        self._acks = acks
        self._acknowledged = False
        return self

    def __repr__(self) -> str:
        if self.closed:
            return "<IpcRecords closed>"
        return f"<IpcRecords device={self._event._device} completed={self._timeline.value}>"

    @property
    def event(self) -> IpcEvent:
        """This process's copy of the producer's event: its most recent record."""
        return self._event

    @property
    def timeline(self) -> HostTimeline:
        """The record count, shared with the producer."""
        return self._timeline

    @property
    def completed(self) -> int:
        """The number of the last record whose work has completed (records complete in
        order). Raises ``anyio.ClosedResourceError`` once closed."""
        return self._timeline.value

    @property
    def closed(self) -> bool:
        return self._acknowledged

    @property
    def abandoned(self) -> bool:
        """True once :meth:`abandon` was called."""
        return self._timeline.abandoned

    async def wait_record(self, n: int) -> None:
        """Wait until the work of record ``n`` has completed in the producer's process: no
        thread blocks and nothing polls (as :meth:`HostTimeline.wait_value`). A record
        completed already returns after a checkpoint; each record is awaited by its number,
        so none is missed or counted twice. A checkpoint; cancelling abandons the wait only:
        its GPU wait stays enqueued, and the release (:meth:`aclose`) waits for it, so call
        :meth:`abandon` first if the producer will record no more (as for
        :meth:`HostTimeline.wait_value`).
        Raises ``TypeError``/``ValueError`` for an ``n`` outside [1, 2**63),
        ``anyio.ClosedResourceError`` once closed, and
        :class:`~aiocudasem.AbandonedError` once abandoned (before or during the wait)."""
        await self._timeline.wait_value(_check_record(n))

    def enqueue_wait(self, stream: Stream, n: int) -> None:
        """Make the work enqueued on ``stream`` from now on wait, on the GPU, for record ``n``
        (``Wait(count, n)``). Non-blocking. Raises ``TypeError`` for anything but a
        :class:`~aiocudasem.Stream`, ``TypeError``/``ValueError`` for an ``n`` outside
        [1, 2**63), and what :meth:`Stream.enqueue_wait` raises."""
        expect_stream(stream, "enqueue_wait()")
        stream.enqueue_wait(Wait(self._timeline, _check_record(n)))

    def abandon(self) -> None:
        """Give up on the producer (it died, or stalled): move the count to
        ``HostTimeline.MAX``, so that every wait for a record, on this process's streams and
        host and on those of the other consumers, goes on without the producer; parked and
        later :meth:`wait_record` calls raise :class:`~aiocudasem.AbandonedError`. Then the
        records can be released. Synchronous and idempotent; raises
        ``anyio.ClosedResourceError`` once closed.

        For a producer that is only stalled, not gone: its next record writes its number over
        the count, which then goes back below ``MAX``. Abandon only a producer that will record
        no more (stopped, or killed)."""
        self._timeline.abandon()

    def _acknowledge(self) -> None:
        """Release the event, then tell the producer (once)."""
        if self._acknowledged:
            return
        self._acknowledged = True
        self._event.close()
        try:
            self._acks._increment()
        except anyio.ClosedResourceError:
            pass

    async def aclose(self) -> None:
        """Release this process's copy of the event, acknowledge to the producer, and release
        the pages (waiting, as :meth:`HostTimeline.aclose` does, for this process's streams to
        pass their waits on the count: :meth:`abandon` first if the producer is gone).
        Idempotent."""
        self._acknowledge()
        try:
            await self._timeline.aclose()
        finally:  # cancelled too: its aclose() claims the page, and a thread releases it
            await self._acks.aclose()

    def close(self) -> None:
        """As :meth:`aclose`, with the pages released by a thread of their own. Idempotent."""
        self._acknowledge()
        self._timeline.close()
        self._acks.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _check_record(n: object) -> int:
    if isinstance(n, int) and not isinstance(n, bool) and not 1 <= n < LIMIT:
        raise ValueError(f"a record's number must be in [1, 2**63) (records count from 1), got {n}")
    return check_uint("a record's number", n, LIMIT)


def create_ipc_recorder(device: int = 0, *, driver: Driver | str | None = None) -> IpcRecorder:
    """Create an :class:`IpcRecorder` on ``device``: an interprocess event, a record count
    and a page of acknowledgements. Synchronous. Raises what :func:`create_ipc_event` and
    :func:`create_host_timeline` raise."""
    event = create_ipc_event(device, driver=driver)
    try:
        timeline = create_host_timeline(device=device, driver=event._driver)
        try:
            acks = create_host_timeline(device=device, driver=event._driver)
        except BaseException:
            timeline.close()
            raise
    except BaseException:
        event.close()
        raise
    return IpcRecorder._create(event, timeline, acks)


async def send_ipc_recorder(stream: anyio.abc.UNIXSocketStream, recorder: IpcRecorder) -> None:
    """Send ``recorder`` over a Unix socket, for the process at the other end to take with
    :func:`receive_ipc_records`: one message, with the event's handle, and the fds of the two
    pages (``SCM_RIGHTS``; this process's copies are closed afterwards). The recorder counts
    the consumer from now on: its ``aclose()`` waits for that consumer's acknowledgement. Use
    the socket as :func:`send_semaphore` says. A checkpoint. Raises ``TypeError`` for a
    ``stream`` that is not an ``anyio.abc.UNIXSocketStream`` or for anything but an
    :class:`IpcRecorder`, ``anyio.ClosedResourceError`` for a closed one, and what anyio's
    ``send_fds`` raises for the socket (then the consumer is not counted)."""
    _check_stream(stream, "send_ipc_recorder")
    if not isinstance(recorder, IpcRecorder):
        raise TypeError(f"expected an aiocudasem.IpcRecorder, not {type(recorder).__name__}")
    if recorder.closed:
        raise anyio.ClosedResourceError("send_ipc_recorder() of a closed IpcRecorder")
    handle = recorder._event.export()
    message = _TAG.ljust(_TAG_SIZE, b" ") + handle.data + handle.device_uuid
    fds = [recorder._timeline.export_fd()]
    try:
        fds.append(recorder._acks.export_fd())
        # Counted before it leaves: a consumer may open and acknowledge before send returns.
        recorder._sent += 1
        try:
            await stream.send_fds(message, fds)
        except BaseException:
            recorder._sent -= 1
            raise
    finally:
        for fd in fds:
            os.close(fd)


async def receive_ipc_records(
    stream: anyio.abc.UNIXSocketStream, *, driver: Driver | str | None = None
) -> IpcRecords:
    """Receive an :class:`IpcRecorder` that the peer sent with :func:`send_ipc_recorder`, and
    open it here: the event on this process's device with its GPU's UUID (as
    :func:`open_ipc_event`), and the pages on that device (``driver`` as for
    :func:`open_ipc_event`).

    A checkpoint; cancelling it before a message arrives receives nothing. If opening fails,
    the producer is acknowledged all the same (it need not wait for this consumer), the fds
    are closed, and the error is raised. Raises ``TypeError`` for a ``stream`` that is not an
    ``anyio.abc.UNIXSocketStream``, ``anyio.EndOfStream`` if the peer closed the connection,
    ``ValueError`` for a message that is not one of this protocol (any fd it carried is
    closed), and what :func:`open_ipc_event` and :func:`open_host_timeline` raise."""
    _check_stream(stream, "receive_ipc_records")
    message, fds = await stream.receive_fds(_SIZE, 3)
    try:
        if len(message) != _SIZE or message[:_TAG_SIZE].rstrip(b" ") != _TAG:
            raise ValueError(
                f"received {message[:_TAG_SIZE]!r}, not an IpcRecorder sent by "
                "aiocudasem.send_ipc_recorder (protocol 1)"
            )
        if len(fds) != 2:
            raise ValueError(f"an IpcRecorder message carries two fds, this one {len(fds)}")
        handle = IpcEventHandle(
            message[_TAG_SIZE : _TAG_SIZE + _HANDLE_SIZE], message[_TAG_SIZE + _HANDLE_SIZE :]
        )
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    values_fd, acks_fd = fds
    event: IpcEvent | None = None
    acks: HostTimeline | None = None
    try:
        event = open_ipc_event(handle, driver=driver)
        acks = open_host_timeline(acks_fd, device=event._device, driver=event._driver)
        timeline = open_host_timeline(values_fd, device=event._device, driver=event._driver)
    except BaseException:
        os.close(values_fd)
        if event is not None:
            event.close()
        _acknowledge_failed(acks, acks_fd, driver)
        raise
    return IpcRecords._create(event, timeline, acks)


def _acknowledge_failed(acks: HostTimeline | None, fd: int, driver: Driver | str | None) -> None:
    """A receive that failed holds nothing of the event: acknowledge, so that the producer
    need not wait for it, and release the page (its fd, if it was not opened)."""
    try:
        if acks is None:
            acks = open_host_timeline(fd, driver=driver)
    except Exception:
        os.close(fd)  # not opened: the fd is still ours, and the producer's bound applies
        return
    try:
        acks._increment()
    finally:
        acks.close()
