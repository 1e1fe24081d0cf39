"""The real driver: ``cuda.bindings._v2.driver`` (cuda-bindings 13.5.x).

This is the only module that imports the CUDA bindings. ``_v2`` is marked experimental
upstream, so the project pins ``cuda-bindings>=13.5,<13.6`` and keeps every use of it here.
CUDA's exceptions are translated to :mod:`aiocudasem._errors` on the way out, and nowhere else.

All objects live in each device's primary context, the one the CUDA runtime, PyTorch, CuPy and
cuda.core share, so foreign streams and our events can be mixed.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import numpy as np

from .._errors import STICKY_STATUSES, CudaError, DeviceFaultError, DeviceMismatchError
from .._handles import info
from . import SEEN, forked_error, track, unavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from . import SemaphoreDesc, SemOp

__all__ = ("CudaDriver",)

_T = TypeVar("_T")

_STREAM_NON_BLOCKING: Final = 0x1
_EVENT_BLOCKING_SYNC: Final = 0x1
_PORTABLE: Final = 0x1  # CU_MEMHOSTALLOC_PORTABLE
_EVENT_DISABLE_TIMING: Final = 0x2
_CC_MAJOR: Final = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR: Final = 76
_KERNEL_NAMES: Final = ("spin", "check_frame", "trap")
_FUNCTION_LOADED: Final = 1  # CU_FUNCTION_LOADING_STATE_LOADED
_FUNCTION_NOT_LOADED: Final = 913  # CUDA_ERROR_FUNCTION_NOT_LOADED
_LOADING_MODES: Final = {1: "eager", 2: "lazy"}  # CUmoduleLoadingMode

# The demo, test and benchmark workloads: aiocudasem/_kernels/kernels.cu, prebuilt into a fatbin
# (SASS for sm_75 to sm_120 plus PTX) by scripts/build-kernels.sh. NVRTC compiles the source only
# for a device the fatbin has no code for.
_KERNEL_FILES: Final = "_kernels"
# CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_PTX, CUDA_ERROR_UNSUPPORTED_PTX_VERSION
_NO_BINARY_FOR_GPU: Final = frozenset({209, 218, 222})


def _kernel_dir() -> Path:
    return Path(__file__).resolve().parent.parent / _KERNEL_FILES


class _Forked:
    """Stands in for the bindings in a forked child: every driver call raises."""

    def __getattr__(self, name: str) -> Any:
        raise forked_error("cuda")


class CudaDriver:
    """The CUDA driver API through ``cuda.bindings._v2.driver``."""

    name = "cuda"
    simulated = False

    def __init__(self) -> None:
        try:
            from cuda.bindings._v2 import driver as d
        except ImportError as exc:
            raise unavailable(
                f"cuda.bindings._v2.driver cannot be imported ({exc}); "
                "install cuda-bindings>=13.5,<13.6"
            ) from None
        self._d: Any = d
        self._DriverError: type[Exception] = d.DriverError
        self._NotReady: type[Exception] = d.NotReadyError
        try:
            d.init(0)
            count = d.device_get_count()
        except Exception as exc:  # a missing libcuda surfaces as pathfinder's RuntimeError
            raise unavailable(f"cuInit failed ({exc})") from None
        if count == 0:
            raise unavailable("no CUDA device is present")
        self._count: int = count
        self._lock = threading.Lock()
        self._devices: dict[int, int] = {}  # ordinal -> CUdevice
        self._ordinals: dict[int, int] = {}  # CUdevice -> ordinal
        self._ctx: dict[int, int] = {}  # ordinal -> primary context
        self._probe: dict[int, int] = {}  # ordinal -> never-recorded event, for check_health
        self._kernels: dict[int, dict[str, int]] = {}
        self._kernels_lock = threading.Lock()
        self._preloaded: set[int] = set()  # devices whose kernels were loaded before a wait
        self._wait_dtype = d.external_semaphore_wait_params_v1_dtype
        self._signal_dtype = d.external_semaphore_signal_params_v1_dtype
        track(self)

    def _after_fork(self) -> None:
        # A forked child cannot use the parent's CUDA state: refuse every call clearly.
        self._d = _Forked()

    # ------------------------------------------------------------------ helpers

    def _fail(self, exc: BaseException, what: str) -> NoReturn:
        status = int(getattr(exc, "status", 999))
        try:
            name = str(self._d.get_error_name(status))
        except Exception:
            name = f"CUDA_ERROR_{status}"
        cls = DeviceFaultError if status in STICKY_STATUSES else CudaError
        raise cls(f"{what} failed: {name} ({status})", status, name) from None

    def _call(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, a binding of ``what``, with its error translated by :meth:`_fail`.
        The calls of the hot path (record, query, wait on an event, launch a host function)
        keep their own ``try``: this frame would cost each of them about 0.1 us."""
        try:
            return fn(*args)
        except self._DriverError as exc:
            self._fail(exc, what)

    def _use(self, ordinal: int) -> int:
        """Make ``ordinal``'s primary context current on this thread; return it."""
        ctx = self._ctx.get(ordinal)
        d = self._d
        try:
            if ctx is None:
                if not isinstance(ordinal, int) or not 0 <= ordinal < self._count:
                    raise CudaError(
                        f"device ordinal {ordinal!r} out of range [0, {self._count})",
                        101,
                        "CUDA_ERROR_INVALID_DEVICE",
                    )
                with self._lock:
                    ctx = self._ctx.get(ordinal)
                    if ctx is None:
                        dev = d.device_get(ordinal)
                        ctx = d.device_primary_ctx_retain(dev)
                        self._devices[ordinal] = dev
                        self._ordinals[dev] = ordinal
                        self._ctx[ordinal] = ctx
            if d.ctx_get_current() != ctx:
                d.ctx_set_current(ctx)
        except self._DriverError as exc:
            self._fail(exc, "cuDevicePrimaryCtxRetain")
        return ctx

    # ------------------------------------------------------------------ devices

    def device_count(self) -> int:
        return self._count

    def device_uuid(self, ordinal: int) -> bytes:
        self._use(ordinal)
        uuid = self._call("cuDeviceGetUuid", self._d.device_get_uuid_v2, self._devices[ordinal])
        raw = getattr(uuid, "bytes", uuid)
        if isinstance(raw, (bytes, bytearray)):
            return bytes(raw[:16])
        return bytes(np.asarray(raw).view(np.uint8).ravel()[:16])

    def device_name(self, ordinal: int) -> str:
        self._use(ordinal)
        raw = self._call("cuDeviceGetName", self._d.device_get_name, 256, self._devices[ordinal])
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    def check_health(self, ordinal: int) -> None:
        probe = self._probe.get(ordinal)
        if probe is None:
            probe = self._probe[ordinal] = self.event_create(ordinal)
        self.event_query(probe)

    def module_loading_mode(self) -> str:
        """CUDA's module loading mode in this process (``cuModuleGetLoadingMode``): ``"lazy"``,
        CUDA's default since 12.2, or ``"eager"`` (``CUDA_MODULE_LOADING=EAGER``).

        Not part of the :class:`Driver` protocol: only ``doctor`` reports it, because lazy
        loading can deadlock a hand-off (docs/lazy-loading.md). Never changes the mode, which
        is process-wide and read once by CUDA. Raises :class:`CudaError`.
        """
        mode = int(self._call("cuModuleGetLoadingMode", self._d.module_get_loading_mode))
        name = _LOADING_MODES.get(mode)
        if name is None:
            raise CudaError(
                f"cuModuleGetLoadingMode returned an unknown mode {mode}",
                1,
                "CUDA_ERROR_INVALID_VALUE",
            )
        return name

    # ------------------------------------------------------------------ streams

    def stream_create(self, ordinal: int, non_blocking: bool, priority: int) -> int:
        self._use(ordinal)
        flags = _STREAM_NON_BLOCKING if non_blocking else 0
        return int(
            self._call(
                "cuStreamCreateWithPriority", self._d.stream_create_with_priority, flags, priority
            )
        )

    def stream_destroy(self, stream: int) -> None:
        self._call("cuStreamDestroy", self._d.stream_destroy_v2, stream)

    def stream_device(self, stream: int) -> int:
        d = self._d
        # NULL, legacy and per-thread streams belong to the current context's device.
        if stream in (0, 1, 2) and d.ctx_get_current() == 0:
            self._use(0)
        try:
            dev = int(d.stream_get_device(stream))
            ctx = int(d.stream_get_ctx(stream))
        except self._DriverError as exc:
            self._fail(exc, "cuStreamGetDevice")
        ordinal = self._ordinals.get(dev)
        if ordinal is None:
            ordinal = next(i for i in range(self._count) if int(d.device_get(i)) == dev)
        if ctx != self._use(ordinal):
            raise DeviceMismatchError(
                f"stream {stream:#x} belongs to a context other than device {ordinal}'s primary "
                "context; aiocudasem works in primary contexts (those of the CUDA runtime, "
                "PyTorch, CuPy and cuda.core)"
            )
        return ordinal

    def stream_query(self, stream: int) -> bool:
        try:
            self._d.stream_query(stream)
        except self._NotReady:
            return False
        except self._DriverError as exc:
            self._fail(exc, "cuStreamQuery")
        return True

    def stream_synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", self._d.stream_synchronize, stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        try:
            self._d.stream_wait_event(stream, event, 0)
        except self._DriverError as exc:
            self._fail(exc, "cuStreamWaitEvent")

    def launch_host_func(self, stream: int, fn: int, user_data: int) -> None:
        # _v2.launch_host_func hands the raw C pointer to cuLaunchHostFunc: no Python
        # trampoline, so the driver's callback thread never takes the GIL.
        try:
            self._d.launch_host_func(stream, fn, user_data)
        except self._DriverError as exc:
            self._fail(exc, "cuLaunchHostFunc")

    # ------------------------------------------------------------------ events

    def event_create(self, ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        self._use(ordinal)
        flags = (0 if timing else _EVENT_DISABLE_TIMING) | (_EVENT_BLOCKING_SYNC if blocking else 0)
        return int(self._call("cuEventCreate", self._d.event_create, flags))

    def event_destroy(self, event: int) -> None:
        self._call("cuEventDestroy", self._d.event_destroy_v2, event)

    def event_record(self, event: int, stream: int) -> None:
        try:
            self._d.event_record(event, stream)
        except self._DriverError as exc:
            self._fail(exc, "cuEventRecord")

    def event_query(self, event: int) -> bool:
        try:
            self._d.event_query(event)
        except self._NotReady:
            return False
        except self._DriverError as exc:
            self._fail(exc, "cuEventQuery")
        return True

    def event_synchronize(self, event: int) -> None:
        # The driver returns the sticky error as soon as the context faults, whichever stream
        # trapped (measured on an H200: within 0.2 ms of a query loop seeing it).
        self._call("cuEventSynchronize", self._d.event_synchronize, event)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        return float(self._call("cuEventElapsedTime", self._d.event_elapsed_time_v2, start, end))

    # ------------------------------------------------------------------ external semaphores

    def import_semaphore(self, ordinal: int, desc: SemaphoreDesc) -> int:
        d = self._d
        self._use(ordinal)
        raw = d.ExternalSemaphoreHandleDesc_v1()
        raw.type = desc.handle_type
        passed_as = info(desc.handle_type).passed_as
        if passed_as == "fd":
            raw.handle.fd = desc.fd
        elif passed_as == "nvsci":
            raw.handle.nv_sci_sync_obj = desc.nvsci_obj
        else:
            raw.handle.win32.handle = desc.win32_handle
            raw.handle.win32.name = desc.win32_name
        raw.flags_ = desc.flags
        return int(self._call("cuImportExternalSemaphore", d.import_external_semaphore, raw.ptr))

    def destroy_semaphore(self, sem: int) -> None:
        self._call("cuDestroyExternalSemaphore", self._d.destroy_external_semaphore, sem)

    def wait_semaphores(self, ops: Sequence[SemOp], stream: int) -> None:
        if len(self._preloaded) < self._count:
            self._preload(stream)
        params = np.zeros(len(ops), dtype=self._wait_dtype)
        p = params["params"]
        p["fence"]["value"] = [op.value for op in ops]
        p["nv_sci_sync"]["fence"] = [op.nvsci_fence for op in ops]
        p["keyed_mutex"]["key"] = [op.key for op in ops]
        p["keyed_mutex"]["timeout_ms"] = [op.timeout_ms for op in ops]
        params["flags_"] = [op.flags for op in ops]
        self._call(
            "cuWaitExternalSemaphoresAsync",
            self._d.wait_external_semaphores_async,
            [op.sem for op in ops],
            params.ctypes.data,
            len(ops),
            stream,
        )

    def signal_semaphores(self, ops: Sequence[SemOp], stream: int) -> None:
        params = np.zeros(len(ops), dtype=self._signal_dtype)
        p = params["params"]
        p["fence"]["value"] = [op.value for op in ops]
        p["nv_sci_sync"]["fence"] = [op.nvsci_fence for op in ops]
        p["keyed_mutex"]["key"] = [op.key for op in ops]
        params["flags_"] = [op.flags for op in ops]
        self._call(
            "cuSignalExternalSemaphoresAsync",
            self._d.signal_external_semaphores_async,
            [op.sem for op in ops],
            params.ctypes.data,
            len(ops),
            stream,
        )

    # ------------------------------------------------------------------ workloads

    def alloc_pinned(self, nbytes: int) -> int:
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        self._use(0)
        # Portable: pinned for every context, so kernels of any device can read it.
        return int(self._call("cuMemHostAlloc", self._d.mem_host_alloc, nbytes, _PORTABLE))

    def free_pinned(self, ptr: int) -> None:
        self._call("cuMemFreeHost", self._d.mem_free_host, ptr)

    def _kernel(self, stream: int, name: str) -> int:
        ordinal = self.stream_device(stream)  # also makes the device's primary context current
        kernels = self._kernels.get(ordinal)
        if kernels is None:
            kernels = self._load_kernels(ordinal)
        return kernels[name]

    def _preload(self, stream: int) -> None:
        """Load the workload kernels before this device's first semaphore wait can block a
        stream (see _load_kernels). Once per device, and best effort: a user's wait must not
        fail because the demo's kernels cannot load; their first launch reports that."""
        try:
            ordinal = self.stream_device(stream)
        except CudaError:
            return  # the wait itself reports a bad stream
        if ordinal in self._preloaded:
            return
        self._preloaded.add(ordinal)
        try:
            self._load_kernels(ordinal)
        except CudaError:
            pass

    def _load_kernels(self, ordinal: int) -> dict[str, int]:
        """Load the workload kernels into ``ordinal``'s primary context, which must be current.

        Loading a module into a context waits until no stream of that context is blocked (seen
        on an H200 under lazy loading: a first launch, or cuKernelGetFunction, while any stream
        waited on an external semaphore that the host signals only afterwards, never returned).
        So this runs before the library enqueues its first semaphore wait on the device, and at
        latest at the first workload launch; after it, launching them loads nothing."""
        with self._kernels_lock:  # one load per device, even if two threads get here first
            kernels = self._kernels.get(ordinal)
            if kernels is None:
                lib = self._library(ordinal)
                try:
                    kernels = {n: self._load_kernel(lib, f"aiocudasem_{n}") for n in _KERNEL_NAMES}
                except BaseException:
                    try:
                        self._d.library_unload(lib)
                    except Exception:  # the load's own error is the one worth reporting
                        pass
                    raise
                self._kernels[ordinal] = kernels
            return kernels

    def _library(self, ordinal: int) -> int:
        """The kernels' CUlibrary: the prebuilt fatbin, or, for a device it has no code for,
        the source compiled by NVRTC for the device's own architecture."""
        d = self._d
        fatbin = (_kernel_dir() / "kernels.fatbin").read_bytes()
        try:
            return int(d.library_load_data(fatbin, 0, 0, 0, 0, 0, 0))
        except self._DriverError as exc:
            if int(getattr(exc, "status", 0)) not in _NO_BINARY_FOR_GPU:
                self._fail(exc, "cuLibraryLoadData")
        cubin = self._compile(ordinal)
        return int(self._call("cuLibraryLoadData", d.library_load_data, cubin, 0, 0, 0, 0, 0, 0))

    def _compile(self, ordinal: int) -> bytes:
        """NVRTC: the kernels' source as a cubin for ``ordinal``'s architecture (PTX from a
        newer NVRTC can be rejected by an older driver). Blocks for the compile."""
        from cuda.bindings._v2 import nvrtc

        d = self._d
        dev = self._devices[ordinal]
        major = d.device_get_attribute(_CC_MAJOR, dev)
        minor = d.device_get_attribute(_CC_MINOR, dev)
        source = (_kernel_dir() / "kernels.cu").read_bytes()
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
        d = self._d
        try:
            kernel = int(d.library_get_kernel(lib, name.encode()))
            func = d.kernel_get_function(kernel)  # this context's function of the kernel
            d.func_load(func)
            state = int(d.func_is_loaded(func))
        except self._DriverError as exc:
            self._fail(exc, f"loading kernel {name} (cuKernelGetFunction, cuFuncLoad)")
        if state != _FUNCTION_LOADED:
            raise CudaError(
                f"cuFuncLoad returned but kernel {name} is still not loaded (loading state "
                f"{state}); its first launch would load it lazily, which can deadlock a "
                "hand-off (see docs/lazy-loading.md)",
                _FUNCTION_NOT_LOADED,
                "CUDA_ERROR_FUNCTION_NOT_LOADED",
            )
        return kernel

    def _launch(self, stream: int, name: str, threads: int, *args: Any) -> None:
        kernel = self._kernel(stream, name)
        ptrs = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        self._call(
            "cuLaunchKernel",
            self._d.launch_kernel,
            kernel,
            *(1, 1, 1, threads, 1, 1),  # grid, block
            *(0, stream, ctypes.addressof(ptrs), 0),  # shared memory, stream, arguments, extra
        )

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
