"""External semaphores on the simulated device: created with their producer, exported as fds,
imported, waited on and signalled from streams."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..._handles import lookup
from ._model import _Node, _Semaphore
from ._producer import SimProducer
from ._status import _INVALID_HANDLE, _INVALID_VALUE, _NOT_SUPPORTED, _error, _uint
from ._steps import _signals, _waits
from ._streams import _Streams

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._protocol import SemaphoreDesc, SemOp
    from ._model import _Stream


def _file_of(fd: int) -> tuple[int, int]:
    """The file that ``fd`` refers to (its device and inode); raises ``OSError`` for a closed
    fd."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class _Semaphores(_Streams):
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

    def _export(self, sem: _Semaphore) -> int:
        fd = os.memfd_create("aiocudasem-sim-semaphore", os.MFD_CLOEXEC)  # a file of its own
        key = _file_of(fd)
        with self._lock:
            self._exports[key] = sem
            sem.exported.add(key)
        return fd

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
