"""The workloads on the CUDA driver: ``kernels/kernels.cu``, prebuilt into a fatbin (SASS for
sm_75 to sm_120 plus PTX) by scripts/build-kernels.sh, with the package's ``include/`` on the
include path (the progress kernel publishes through ``aiocudasem/progress.cuh``). NVRTC
compiles the source only for a device the fatbin has no code for."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._driver import Driver
from .._driver._protocol import stream_handle
from .._errors import CudaError
from ._common import _MISMATCH, SEEN, StreamArg, WeakDriver, check_progress

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ("CudaWorkloadDriver", "CudaWorkloads")

_KERNEL_NAMES: Final = ("spin", "check_frame", "trap", "progress")
# CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION
_NO_BINARY_FOR_GPU: Final = frozenset({209, 218, 222})
_KERNELS: Final = Path(__file__).resolve().parent / "kernels"
_INCLUDE: Final = Path(__file__).resolve().parents[1] / "include"


class CudaWorkloadDriver(Driver, Protocol):
    """What the workloads use of the CUDA driver: the :class:`~aiocudasem._driver.Driver`
    protocol and the methods ``CudaDriver`` offers for them beside it (its section "kernels,
    pinned memory" documents each). Nothing else of the driver is touched here."""

    def before_first_wait(self, hook: Callable[[int], object]) -> list[int]: ...
    def run_hook(self, hook: Callable[[int], object], ordinal: int) -> None: ...
    def mem_host_alloc(self, nbytes: int) -> int: ...
    def mem_free_host(self, ptr: int) -> None: ...
    def compute_capability(self, ordinal: int) -> tuple[int, int]: ...
    def library_load_data(self, image: bytes) -> int: ...
    def library_unload(self, library: int) -> None: ...
    def library_load_kernel(self, library: int, name: str) -> int: ...
    def launch_kernel(
        self, kernel: int, grid: int, block: int, stream: int, params: int
    ) -> None: ...


class CudaWorkloads(WeakDriver[CudaWorkloadDriver]):
    """The workload kernels and pinned memory of one ``CudaDriver``, through the methods of
    :class:`CudaWorkloadDriver` only."""

    def __init__(self, driver: CudaWorkloadDriver) -> None:
        super().__init__(driver)
        self._kernels: dict[int, dict[str, int]] = {}  # ordinal -> kernel name -> CUkernel
        self._lock = threading.Lock()
        self._catch_up = driver.before_first_wait(self._load)

    def _attach(self) -> None:
        """Load the kernels for the devices that had their first wait before these workloads
        existed. Called once, outside the workloads table's lock."""
        drv, catch_up, self._catch_up = self._driver, self._catch_up, []
        for ordinal in catch_up:
            drv.run_hook(self._load, ordinal)

    def alloc_pinned(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        # Portable: pinned for every context, so kernels of any device can read it.
        return self._driver.mem_host_alloc(nbytes)

    def free_pinned(self, ptr: int) -> None:
        self._driver.mem_free_host(ptr)

    def launch_spin(self, stream: StreamArg, ns: int) -> None:
        stream = stream_handle("launch_spin()", stream, self._driver, _MISMATCH)
        self._launch(stream, "spin", 1, ctypes.c_uint64(ns))

    def launch_check_frame(
        self, stream: StreamArg, src: int, words: int, frame: int, out: int
    ) -> None:
        stream = stream_handle("launch_check_frame()", stream, self._driver, _MISMATCH)
        if not 0 < words < SEEN:
            raise ValueError(f"words must be in [1, {SEEN}), got {words}")
        self._launch(
            stream,
            "check_frame",
            256,
            ctypes.c_void_p(src),
            ctypes.c_uint32(words),
            ctypes.c_uint32(frame),
            ctypes.c_void_p(out),
        )

    def launch_trap(self, stream: StreamArg) -> None:
        stream = stream_handle("launch_trap()", stream, self._driver, _MISMATCH)
        self._launch(stream, "trap", 1)

    def launch_progress(
        self,
        stream: StreamArg,
        word: int,
        count: int,
        ns: int,
        *,
        start: int = 0,
        trap_at: int | None = None,
        stamps: int | None = None,
    ) -> None:
        stream = stream_handle("launch_progress()", stream, self._driver, _MISMATCH)
        trap = check_progress(word, count, ns, start, trap_at, stamps)
        self._launch(
            stream,
            "progress",
            1,
            ctypes.c_void_p(word),
            ctypes.c_uint64(start),
            ctypes.c_uint32(count),
            ctypes.c_uint64(ns),
            ctypes.c_uint64(trap),
            ctypes.c_void_p(stamps),
        )

    # ------------------------------------------------------------------ loading

    def _launch(self, stream: int, name: str, threads: int, *args: Any) -> None:
        drv = self._driver
        ordinal = drv.stream_device(stream)  # also makes the device's primary context current
        kernels = self._kernels.get(ordinal)
        if kernels is None:
            kernels = self._load(ordinal)
        ptrs = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        drv.launch_kernel(kernels[name], 1, threads, stream, ctypes.addressof(ptrs))

    def _load(self, ordinal: int) -> dict[str, int]:
        """Load the kernels into ``ordinal``'s primary context, which must be current.

        Loading a module into a context waits until no stream of that context is blocked (seen
        on an H200 under lazy loading: a first launch, or cuKernelGetFunction, while any stream
        waited on an external semaphore that the host signals only afterwards, never returned).
        So the driver runs this before its first semaphore wait on the device, and at latest it
        runs at the first launch; after it, launching loads nothing."""
        with self._lock:  # one load per device, even if two threads get here first
            kernels = self._kernels.get(ordinal)
            if kernels is None:
                lib = self._library(ordinal)
                try:
                    kernels = {
                        n: self._driver.library_load_kernel(lib, f"aiocudasem_{n}")
                        for n in _KERNEL_NAMES
                    }
                except BaseException:
                    try:
                        self._driver.library_unload(lib)
                    except Exception:  # the load's own error is the one worth reporting
                        pass
                    raise
                self._kernels[ordinal] = kernels
            return kernels

    def _library(self, ordinal: int) -> int:
        """The kernels' CUlibrary: the prebuilt fatbin, or, for a device it has no code for,
        the source compiled by NVRTC for the device's own architecture."""
        drv = self._driver
        fatbin = (_KERNELS / "kernels.fatbin").read_bytes()
        try:
            return drv.library_load_data(fatbin)
        except CudaError as exc:
            if exc.status not in _NO_BINARY_FOR_GPU:
                raise
        return drv.library_load_data(self._compile(ordinal))

    def _compile(self, ordinal: int) -> bytes:
        """NVRTC: the kernels' source as a cubin for ``ordinal``'s architecture (PTX from a
        newer NVRTC can be rejected by an older driver). Blocks for the compile."""
        from cuda.bindings._v2 import nvrtc

        major, minor = self._driver.compute_capability(ordinal)
        source = (_KERNELS / "kernels.cu").read_bytes()
        prog = nvrtc.create_program(source, b"aiocudasem_kernels.cu", None, None)
        try:
            try:
                options = [f"-arch=sm_{major}{minor}".encode(), f"-I{_INCLUDE}".encode()]
                nvrtc.compile_program(prog, options)
            except nvrtc.NvrtcError as exc:
                log = nvrtc.get_program_log(prog).decode(errors="replace")
                raise CudaError(f"NVRTC compile failed: {exc}\n{log}", 218, "NVRTC") from None
            return bytes(nvrtc.get_cubin(prog))
        finally:
            nvrtc.destroy_program(prog)
