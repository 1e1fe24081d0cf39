"""The workloads on the CUDA driver: ``kernels/kernels.cu``, prebuilt into a fatbin (SASS for
sm_75 to sm_120 plus PTX) by scripts/build-kernels.sh. NVRTC compiles the source only for a
device the fatbin has no code for."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._errors import CudaError
from . import SEEN, WeakDriver

if TYPE_CHECKING:
    from .._driver._cuda import CudaDriver

__all__ = ("CudaWorkloads",)

_PORTABLE: Final = 0x1  # CU_MEMHOSTALLOC_PORTABLE
_CC_MAJOR: Final = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR: Final = 76
_KERNEL_NAMES: Final = ("spin", "check_frame", "trap")
_FUNCTION_LOADED: Final = 1  # CU_FUNCTION_LOADING_STATE_LOADED
_FUNCTION_NOT_LOADED: Final = 913  # CUDA_ERROR_FUNCTION_NOT_LOADED
# CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION
_NO_BINARY_FOR_GPU: Final = frozenset({209, 218, 222})
_KERNELS: Final = Path(__file__).resolve().parent / "kernels"


class CudaWorkloads(WeakDriver["CudaDriver"]):
    """The workload kernels and pinned memory of one :class:`CudaDriver`. It reaches into the
    driver's bindings and error translation, which is why it lives beside no other driver."""

    def __init__(self, driver: CudaDriver) -> None:
        super().__init__(driver)
        self._kernels: dict[int, dict[str, int]] = {}  # ordinal -> kernel name -> CUkernel
        self._lock = threading.Lock()
        self._catch_up = driver._before_first_wait(self._load)

    def _attach(self) -> None:
        """Load the kernels for the devices that had their first wait before these workloads
        existed. Called once, outside the workloads table's lock."""
        drv, catch_up, self._catch_up = self._driver, self._catch_up, []
        for ordinal in catch_up:
            drv._run_hook(self._load, ordinal)

    def alloc_pinned(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        drv = self._driver
        drv._use(0)
        # Portable: pinned for every context, so kernels of any device can read it.
        return int(drv._call("cuMemHostAlloc", drv._d.mem_host_alloc, nbytes, _PORTABLE))

    def free_pinned(self, ptr: int) -> None:
        drv = self._driver
        drv._call("cuMemFreeHost", drv._d.mem_free_host, ptr)

    def launch_spin(self, stream: int, ns: int) -> None:
        self._launch(stream, "spin", 1, ctypes.c_uint64(ns))

    def launch_check_frame(self, stream: int, src: int, words: int, frame: int, out: int) -> None:
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

    def launch_trap(self, stream: int) -> None:
        self._launch(stream, "trap", 1)

    # ------------------------------------------------------------------ loading

    def _launch(self, stream: int, name: str, threads: int, *args: Any) -> None:
        drv = self._driver
        ordinal = drv.stream_device(stream)  # also makes the device's primary context current
        kernels = self._kernels.get(ordinal)
        if kernels is None:
            kernels = self._load(ordinal)
        ptrs = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        drv._call(
            "cuLaunchKernel",
            drv._d.launch_kernel,
            kernels[name],
            *(1, 1, 1, threads, 1, 1),  # grid, block
            *(0, stream, ctypes.addressof(ptrs), 0),  # shared memory, stream, arguments, extra
        )

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
                    kernels = {n: self._load_kernel(lib, f"aiocudasem_{n}") for n in _KERNEL_NAMES}
                except BaseException:
                    try:
                        self._driver._d.library_unload(lib)
                    except Exception:  # the load's own error is the one worth reporting
                        pass
                    raise
                self._kernels[ordinal] = kernels
            return kernels

    def _library(self, ordinal: int) -> int:
        """The kernels' CUlibrary: the prebuilt fatbin, or, for a device it has no code for,
        the source compiled by NVRTC for the device's own architecture."""
        drv = self._driver
        d = drv._d
        fatbin = (_KERNELS / "kernels.fatbin").read_bytes()
        try:
            return int(d.library_load_data(fatbin, 0, 0, 0, 0, 0, 0))
        except drv._DriverError as exc:
            if int(getattr(exc, "status", 0)) not in _NO_BINARY_FOR_GPU:
                drv._fail(exc, "cuLibraryLoadData")
        cubin = self._compile(ordinal)
        return int(drv._call("cuLibraryLoadData", d.library_load_data, cubin, 0, 0, 0, 0, 0, 0))

    def _compile(self, ordinal: int) -> bytes:
        """NVRTC: the kernels' source as a cubin for ``ordinal``'s architecture (PTX from a
        newer NVRTC can be rejected by an older driver). Blocks for the compile."""
        from cuda.bindings._v2 import nvrtc

        d = self._driver._d
        dev = self._driver._devices[ordinal]
        major = d.device_get_attribute(_CC_MAJOR, dev)
        minor = d.device_get_attribute(_CC_MINOR, dev)
        source = (_KERNELS / "kernels.cu").read_bytes()
        prog = nvrtc.create_program(source, b"aiocudasem_kernels.cu", None, None)
        try:
            try:
                nvrtc.compile_program(prog, [f"-arch=sm_{major}{minor}".encode()])
            except nvrtc.NvrtcError as exc:
                log = nvrtc.get_program_log(prog).decode(errors="replace")
                raise CudaError(f"NVRTC compile failed: {exc}\n{log}", 218, "NVRTC") from None
            return bytes(nvrtc.get_cubin(prog))
        finally:
            nvrtc.destroy_program(prog)

    def _load_kernel(self, lib: int, name: str) -> int:
        """Return kernel ``name`` of ``lib``, loaded into the current context: under lazy
        loading it would otherwise load at its first launch (docs/lazy-loading.md)."""
        drv = self._driver
        d = drv._d
        try:
            kernel = int(d.library_get_kernel(lib, name.encode()))
            func = d.kernel_get_function(kernel)  # this context's function of the kernel
            d.func_load(func)
            state = int(d.func_is_loaded(func))
        except drv._DriverError as exc:
            drv._fail(exc, f"loading kernel {name} (cuKernelGetFunction, cuFuncLoad)")
        if state != _FUNCTION_LOADED:
            raise CudaError(
                f"cuFuncLoad returned but kernel {name} is still not loaded (loading state "
                f"{state}); its first launch would load it lazily, which can deadlock a "
                "hand-off (see docs/lazy-loading.md)",
                _FUNCTION_NOT_LOADED,
                "CUDA_ERROR_FUNCTION_NOT_LOADED",
            )
        return kernel
