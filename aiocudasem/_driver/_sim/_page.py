"""The shared page of a simulated interprocess event."""

from __future__ import annotations

import ctypes
import mmap
import os

from ... import _hostword


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
