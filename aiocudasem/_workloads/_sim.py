"""The workloads on the simulated device: Python callables run as kernels by
:meth:`SimDriver.launch`, and ordinary memory standing in for pinned memory."""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING

import numpy as np

from .._errors import CudaError
from . import SEEN, WeakDriver, frame_words

if TYPE_CHECKING:
    from .._driver._sim import SimDriver

__all__ = ("SimWorkloads",)


class _Trap(Exception):
    """Raised by the simulated trap kernel: the simulator faults the context for it."""


class SimWorkloads(WeakDriver["SimDriver"]):
    def __init__(self, driver: SimDriver) -> None:
        super().__init__(driver)
        self._pinned: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def alloc_pinned(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        buf = (ctypes.c_char * nbytes)()
        ptr = ctypes.addressof(buf)
        with self._driver._lock:  # after fork() it refuses, as every simulated call does
            self._pinned[ptr] = buf
        return ptr

    def free_pinned(self, ptr: int) -> None:
        with self._driver._lock:
            if self._pinned.pop(ptr, None) is None:
                raise CudaError(
                    "cuMemFreeHost failed: CUDA_ERROR_INVALID_VALUE (1) [simulated]",
                    1,
                    "CUDA_ERROR_INVALID_VALUE",
                )

    def launch_spin(self, stream: int, ns: int) -> None:
        self._driver.launch(stream, lambda: time.sleep(ns / 1e9))

    def launch_check_frame(self, stream: int, src: int, words: int, frame: int, out: int) -> None:
        if not 0 < words < SEEN:
            raise ValueError(f"words must be in [1, {SEEN}), got {words}")
        expected = frame_words(frame, words)

        def check() -> None:
            data = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(src))
            slot = ctypes.c_uint32.from_address(out + 4 * frame)
            slot.value += int(np.count_nonzero(data != expected)) + SEEN

        self._driver.launch(stream, check)

    def launch_trap(self, stream: int) -> None:
        def trap() -> None:
            raise _Trap

        self._driver.launch(stream, trap)  # CUDA_ERROR_LAUNCH_FAILED, as a real trap
