"""Interprocess events on the simulated device: each one a sealed page of shared memory, whose
handle names the creating process and its fd."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from typing import Final

from ._memory import _Memory
from ._model import _Event
from ._page import _IpcPage
from ._status import _INVALID_CONTEXT, _INVALID_VALUE, _error

# A simulated interprocess event handle: a tag, the creating process, its fd of the event's
# page and the page's inode (so that a stale or forged pid/fd naming any other file is refused),
# padded to the 64 bytes of CUipcEventHandle.
_IPC_TAG: Final = b"aiocudasem-sim-ipc-event\0"
_IPC_FORMAT: Final = f"={len(_IPC_TAG)}sqqQ"
_IPC_NAME: Final = "aiocudasem-sim-ipc-event"
# The page can neither shrink nor grow: no process can truncate it under a mapping (SIGBUS).
_IPC_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


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


class _Ipc(_Memory):
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
