"""Memory on the simulated device: registered host words, which streams wait on and write
(host timelines), and the pinned memory of the workloads."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from ..._errors import UnsupportedFeatureError
from ._semaphores import _Semaphores
from ._status import (
    _ALREADY_REGISTERED,
    _INVALID_HANDLE,
    _INVALID_VALUE,
    _NOT_REGISTERED,
    _U64,
    _error,
)
from ._steps import _WordWait, _WordWrite

if TYPE_CHECKING:
    from ._model import _Stream


class _Memory(_Semaphores):
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

    def kernel_store64(self, stream: int, address: int, value: int) -> None:
        """What a kernel's store into registered host memory does (``aiocudasem_publish()``
        of ``aiocudasem/progress.cuh``), for a simulated kernel that :meth:`launch` runs on
        ``stream``: store ``value`` to the word at ``address``, a release, and let the streams
        waiting on it look at once. It is called from the kernel, so it holds also on a stream
        destroyed since the launch. An address that is not registered host memory of the
        stream's device faults the device with CUDA_ERROR_ILLEGAL_ADDRESS, as the GPU's store
        would (the kernel's page was unmapped under it, say), and raises ``DeviceFaultError``;
        so does a device that faulted already. Not part of the :class:`Driver` protocol: the
        workloads use it."""
        what = "a kernel's store to host memory"
        with self._lock:
            s = self._streams.get(stream)
            if s is None or not 0 <= value < _U64:
                raise _error(_INVALID_HANDLE if s is None else _INVALID_VALUE, what)
            self._check_device(s.device, what)
            changed: list[object] = []
            _WordWrite(address, value).attempt(self, s, changed)  # faults if not registered
            self._check_device(s.device, what)
            self._settle(changed)

    def notify_word(self, address: int) -> None:
        """Tell the simulated device that the host stored to the registered word at
        ``address``: the streams waiting on it look at once. Without it they see the store all
        the same, within 20 ms, as they see a store by another process. Raises ``TypeError``
        for an ``address`` that is not an int."""
        if isinstance(address, bool) or not isinstance(address, int):
            raise TypeError(f"address must be an int, not {type(address).__name__}")
        with self._lock:
            self._settle([("word", address)])

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
