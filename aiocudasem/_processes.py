"""Handing an exported semaphore or a host timeline to another process: :func:`send_semaphore`
and :func:`receive_semaphore`, :func:`send_host_timeline` and :func:`receive_host_timeline`,
over a Unix socket with anyio's ``send_fds``/``receive_fds``.

A semaphore travels as its exported fd (``SCM_RIGHTS``) with one fixed-size message that says
what the fd is: a protocol tag and version, and the :class:`HandleType`'s name. A host
timeline travels as the fd of its shared page, with a message of its own tag. Nothing else is
shared: each side has its own driver and context, and the receiver imports the fd as
:func:`import_semaphore` does, or maps the page as :func:`open_host_timeline` does.
"""

from __future__ import annotations

import os
import socket
from typing import Final

import anyio.abc

from ._checks import check_open_fd
from ._driver import Driver
from ._handles import HandleType, lookup
from ._semaphore import ExternalSemaphore, import_semaphore
from ._timeline import HostTimeline, open_host_timeline

__all__ = ("receive_host_timeline", "receive_semaphore", "send_host_timeline", "send_semaphore")

_TAG: Final = b"aiocudasem-semaphore 1 "
_TIMELINE_TAG: Final = b"aiocudasem-host-timeline 1"
_SIZE: Final = 64  # every message is padded to this size, so that one receive takes it whole


async def send_semaphore(
    stream: anyio.abc.UNIXSocketStream, fd: int, handle_type: HandleType, *, close: bool = True
) -> None:
    """Send an exported semaphore ``fd`` of ``handle_type`` over a Unix socket, for the
    process at the other end to take with :func:`receive_semaphore`. Use a socket for
    semaphores only: plain bytes sent before a semaphore's message join it.

    ``fd`` is what a producer exports (for example ``VulkanSemaphore.export_fd()``); only the
    fd handle types can travel this way. With ``close`` (the default) this process's copy is
    closed once it is sent, since the receiver owns the semaphore from then on; it stays open
    if sending fails. A checkpoint. Raises ``TypeError`` for a ``stream`` that is not an
    ``anyio.abc.UNIXSocketStream`` (a plain ``socket.socket`` included), ``TypeError`` and
    ``ValueError`` for a bad ``fd`` or handle type, and what anyio's ``send_fds`` raises for
    the socket (``BrokenResourceError`` once the peer has gone).
    """
    _check_stream(stream, "send_semaphore")
    if not isinstance(handle_type, HandleType):
        raise TypeError(f"handle_type must be an aiocudasem.HandleType, not {handle_type!r}")
    row = lookup(handle_type)
    if row is None or row.passed_as != "fd":
        raise ValueError(
            f"{handle_type.name} is not passed as an fd, so it cannot be sent over a socket: "
            "send an OPAQUE_FD or TIMELINE_SEMAPHORE_FD semaphore"
        )
    check_open_fd(fd)
    message = (_TAG + handle_type.name.encode()).ljust(_SIZE, b" ")
    await stream.send_fds(message, [fd])
    if close:
        os.close(fd)


async def receive_semaphore(
    stream: anyio.abc.UNIXSocketStream,
    *,
    device: int = 0,
    driver: Driver | str | None = None,
) -> ExternalSemaphore:
    """Receive a semaphore that the peer sent with :func:`send_semaphore`, and import it on
    ``device`` (``driver`` as for :func:`import_semaphore`).

    A checkpoint; cancelling it before a message arrives receives nothing. Raises
    ``TypeError`` for a ``stream`` that is not an ``anyio.abc.UNIXSocketStream``,
    ``anyio.EndOfStream`` if the peer closed the connection (a producer that exited or was
    killed), ``ValueError`` for a message that is not a semaphore of this protocol (any fd it
    carried is closed), and what :func:`import_semaphore` raises (the fd is closed then too).
    """
    _check_stream(stream, "receive_semaphore")
    # Room for a second fd, so that a message with more than one is refused, not truncated.
    message, fds = await stream.receive_fds(_SIZE, 2)
    try:
        handle_type = _parse(message, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    fd = fds[0]
    try:
        return import_semaphore(handle_type, fd, device=device, driver=driver)
    except BaseException:
        os.close(fd)  # not imported: the fd is still ours
        raise


def _check_stream(stream: object, function: str) -> None:
    """``TypeError`` for anything but anyio's Unix socket stream, before anything is sent,
    received or opened: only it can carry fds."""
    if isinstance(stream, anyio.abc.UNIXSocketStream):
        return
    hint = ""
    if isinstance(stream, socket.socket):
        hint = (
            ": wrap a connected AF_UNIX socket with await anyio.abc.UNIXSocketStream.from_socket()"
        )
    raise TypeError(
        f"{function}() needs an anyio.abc.UNIXSocketStream (from anyio.connect_unix() or "
        f"anyio.create_unix_listener()), not {type(stream).__name__}{hint}"
    )


def _parse(message: bytes, fds: list[int]) -> HandleType:
    if len(message) != _SIZE or not message.startswith(_TAG):
        raise ValueError(
            f"received {message[:_SIZE]!r}, not a semaphore sent by aiocudasem.send_semaphore "
            "(protocol 1)"
        )
    if len(fds) != 1:
        raise ValueError(f"a semaphore message carries one fd, this one {len(fds)}")
    name = message[len(_TAG) :].rstrip(b" ").decode("ascii", "replace")
    try:
        return HandleType[name]
    except KeyError:
        raise ValueError(f"received a semaphore of unknown handle type {name!r}") from None


async def send_host_timeline(stream: anyio.abc.UNIXSocketStream, timeline: HostTimeline) -> None:
    """Send a host timeline over a Unix socket, for the process at the other end to open with
    :func:`receive_host_timeline`: both then share one value. This process keeps its timeline
    (a new fd of its page is sent, and this process's copy of that fd is closed afterwards).
    Use the socket as :func:`send_semaphore` says. A checkpoint. Raises ``TypeError`` for
    a ``stream`` that is not an ``anyio.abc.UNIXSocketStream`` and for anything but a
    :class:`HostTimeline`, ``anyio.ClosedResourceError`` for a closed one, and
    what anyio's ``send_fds`` raises for the socket."""
    _check_stream(stream, "send_host_timeline")
    if not isinstance(timeline, HostTimeline):
        raise TypeError(f"expected an aiocudasem.HostTimeline, not {type(timeline).__name__}")
    fd = timeline.export_fd()
    try:
        await stream.send_fds(_TIMELINE_TAG.ljust(_SIZE, b" "), [fd])
    finally:
        os.close(fd)


async def receive_host_timeline(
    stream: anyio.abc.UNIXSocketStream,
    *,
    device: int = 0,
    driver: Driver | str | None = None,
) -> HostTimeline:
    """Receive a host timeline that the peer sent with :func:`send_host_timeline`, and open
    it on ``device`` (``driver`` as for :func:`open_host_timeline`).

    A checkpoint; cancelling it before a message arrives receives nothing. Raises
    ``TypeError`` for a ``stream`` that is not an ``anyio.abc.UNIXSocketStream``,
    ``anyio.EndOfStream`` if the peer closed the connection, ``ValueError`` for a message that
    is not a host timeline of this protocol (any fd it carried is closed), and what
    :func:`open_host_timeline` raises (the fd is closed then too)."""
    _check_stream(stream, "receive_host_timeline")
    message, fds = await stream.receive_fds(_SIZE, 2)
    try:
        if len(message) != _SIZE or message.rstrip(b" ") != _TIMELINE_TAG:
            raise ValueError(
                f"received {message[:_SIZE]!r}, not a host timeline sent by "
                "aiocudasem.send_host_timeline (protocol 1)"
            )
        if len(fds) != 1:
            raise ValueError(f"a host timeline message carries one fd, this one {len(fds)}")
        return open_host_timeline(fds[0], device=device, driver=driver)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
