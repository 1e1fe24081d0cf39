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
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar

import numpy as np

from .. import _cucalls, _log
from .._errors import (
    STICKY_STATUSES,
    CudaError,
    DeviceFaultError,
    DeviceMismatchError,
    UnsupportedFeatureError,
)
from .._handles import lookup
from . import forked_error, track, unavailable

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from . import SemaphoreDesc, SemOp

__all__ = ("CudaDriver",)

_T = TypeVar("_T")

_STREAM_NON_BLOCKING: Final = 0x1
_EVENT_BLOCKING_SYNC: Final = 0x1
_EVENT_DISABLE_TIMING: Final = 0x2
_EVENT_INTERPROCESS: Final = 0x4
_IPC_HANDLE_SIZE: Final = 64  # CU_IPC_HANDLE_SIZE
_LOADING_MODES: Final = {1: "eager", 2: "lazy"}  # CUmoduleLoadingMode
_HOST_REGISTER_PORTABLE: Final = 0x1
_HOST_REGISTER_DEVICEMAP: Final = 0x2
_NOT_SUPPORTED: Final = 801
_HOST_ALLOC_PORTABLE: Final = 0x1  # CU_MEMHOSTALLOC_PORTABLE
_FUNCTION_LOADED: Final = 1  # CU_FUNCTION_LOADING_STATE_LOADED
_FUNCTION_NOT_LOADED: Final = 913  # CUDA_ERROR_FUNCTION_NOT_LOADED
# What a host timeline needs of a device (CUdevice_attribute names), and how a refusal says it.
_HOST_WORD_ATTRIBUTES: Final = (
    ("CAN_USE_64_BIT_STREAM_MEM_OPS", "64-bit stream memory operations (cuStreamWaitValue64)"),
    ("CAN_MAP_HOST_MEMORY", "mapped host memory"),
    ("HOST_REGISTER_SUPPORTED", "registering host memory (cuMemHostRegister)"),
)
# cuMemHostRegister and cuMemHostUnregister take a host pointer, which the bindings take as an
# untyped object; they are called through ctypes at the address the driver gives instead.
_HOST_REGISTER_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint)
_HOST_UNREGISTER_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _IpcEventHandle(ctypes.Structure):
    """``CUipcEventHandle``: 64 opaque bytes, passed by value to cuIpcOpenEventHandle."""

    _fields_ = (("reserved", ctypes.c_char * _IPC_HANDLE_SIZE),)


class _ExtSemNodeParams(ctypes.Structure):
    """``CUDA_EXT_SEM_WAIT_NODE_PARAMS`` / ``CUDA_EXT_SEM_SIGNAL_NODE_PARAMS`` (the same
    layout): the semaphores, their parameters, and how many."""

    _fields_ = (
        ("ext_sem_array", ctypes.c_void_p),
        ("params_array", ctypes.c_void_p),
        ("num_ext_sems", ctypes.c_uint),
    )


# The graph calls take the node parameters by pointer; they are called through ctypes, at the
# driver's addresses, as the interprocess-event calls are.
_GRAPH_ADD_T = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_size_t,
    ctypes.POINTER(_ExtSemNodeParams),
)
_GRAPH_EXEC_SET_T = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(_ExtSemNodeParams)
)

# The interprocess event calls take and return the handle struct, by pointer and by value;
# they are called through ctypes at the driver's addresses, as the host-memory calls are.
_IPC_GET_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_IpcEventHandle), ctypes.c_void_p)
_IPC_OPEN_T = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), _IpcEventHandle)
# The wait path's calls, made from C (see _cucalls.c), in the order bind() takes them. Each is
# asked for at the CUDA 12.0 ABI, whose signatures _cucalls.c declares, and in its legacy
# default-stream form, as the bindings call them.
_FAST_CALLS: Final = (
    "cuEventRecord",
    "cuEventQuery",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
)
_FAST_ABI: Final = 12000
#: The driver methods that are those C functions (the same names in ``_cucalls``).
_FAST_METHODS: Final = (
    "event_record",
    "event_query",
    "stream_query",
    "stream_wait_event",
    "launch_host_func",
)


class _Forked:
    """Stands in for the bindings (and the C calls) in a forked child: every driver call
    raises."""

    def __getattr__(self, name: str) -> Any:
        raise forked_error("cuda")


def _refuse_forked() -> NoReturn:
    raise forked_error("cuda")


def _bind_fast_calls(d: Any, fail: Callable[[int, str], NoReturn]) -> None:
    """Hand the driver's addresses of the wait path's functions, and the error factory, to
    ``_cucalls``."""
    flags = int(d.DriverProcAddressFlags.LEGACY_STREAM)
    addresses = []
    for name in _FAST_CALLS:
        pfn, found = d.get_proc_address_v2(name.encode(), _FAST_ABI, flags)
        if not pfn or int(found) != 0:
            raise unavailable(f"the CUDA driver does not provide {name} (cuGetProcAddress)")
        addresses.append(int(pfn))
    record, query, stream_query, stream_wait_event, launch_host_func = addresses
    _cucalls.bind(record, query, stream_query, stream_wait_event, launch_host_func, fail)


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
        try:
            d.init(0)
            count = d.device_get_count()
        except Exception as exc:  # a missing libcuda surfaces as pathfinder's RuntimeError
            raise unavailable(f"cuInit failed ({exc})") from None
        if count == 0:
            raise unavailable("no CUDA device is present")
        try:
            _bind_fast_calls(d, self._fail_status)
        except d.DriverError as exc:
            raise unavailable(f"cuGetProcAddress failed ({exc})") from None
        self._c: Any = _cucalls
        # The wait path's calls are the C functions themselves, bound over the methods of the
        # same names: an await makes no Python-level call for them.
        vars(self).update({name: getattr(_cucalls, name) for name in _FAST_METHODS})
        self._count: int = count
        self._lock = threading.Lock()
        self._devices: dict[int, int] = {}  # ordinal -> CUdevice
        self._ordinals: dict[int, int] = {}  # CUdevice -> ordinal
        self._ctx: dict[int, int] = {}  # ordinal -> primary context
        self._ctx_ordinals: dict[int, int] = {}  # primary context -> ordinal
        self._probe: dict[int, int] = {}  # ordinal -> never-recorded event, for check_health
        # Devices that have had a semaphore wait -> set once their first-wait hooks have run.
        self._waited: dict[int, threading.Event] = {}
        self._hooks_done = False  # every device has had its first wait, and its hooks ran
        self._first_wait_hooks: list[Callable[[int], object]] = []
        # The driver functions called through ctypes, by name, found on first use.
        self._ctypes_fns: dict[str, Any] = {}
        self._attributes: dict[tuple[int, str], int] = {}  # (ordinal, attribute) -> its value
        self._registered: dict[int, int] = {}  # registered host address -> ordinal
        self._wait_dtype = d.external_semaphore_wait_params_v1_dtype
        self._signal_dtype = d.external_semaphore_signal_params_v1_dtype
        track(self)

    def _after_fork(self) -> None:
        # A forked child cannot use the parent's CUDA state: refuse every call clearly, the C
        # functions too (a coroutine may hold one from before the fork).
        self._d = self._c = _Forked()
        self._ctypes_fns = {}  # found again through self._d, which refuses
        for name in _FAST_METHODS:
            vars(self).pop(name, None)  # back to the methods, which call self._c
        _cucalls.unbind(_refuse_forked)

    # ------------------------------------------------------------------ helpers

    def _fail(self, exc: BaseException, what: str) -> NoReturn:
        self._fail_status(int(getattr(exc, "status", 999)), what)

    def _fail_status(self, status: int, what: str) -> NoReturn:
        try:
            name = str(self._d.get_error_name(status))
        except Exception:
            name = f"CUDA_ERROR_{status}"
        cls = DeviceFaultError if status in STICKY_STATUSES else CudaError
        raise cls(f"{what} failed: {name} ({status})", status, name) from None

    def _call(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, a binding of ``what``, with its error translated by :meth:`_fail`.
        The calls of the wait path do not come here: they are ``_cucalls``' C functions."""
        try:
            return fn(*args)
        except self._DriverError as exc:
            self._fail(exc, what)

    def _first_wait(self, stream: int) -> None:
        """Run the first-wait hooks for ``stream``'s device, once per device. A wait in
        another thread meanwhile goes ahead only once they have run, so that no wait is
        enqueued before the kernels they load."""
        try:
            ordinal = self.stream_device(stream)  # also makes the context current
            if self.stream_capturing(stream):
                # Captured, the wait blocks nothing yet, and a module load could invalidate
                # the capture: the hooks run before the graph's launch instead.
                return
        except CudaError:
            return  # the wait itself reports a bad stream
        with self._lock:
            done = self._waited.get(ordinal)
            first = done is None
            if first:
                done = self._waited[ordinal] = threading.Event()
                hooks = list(self._first_wait_hooks)
        assert done is not None
        if not first:
            done.wait()  # at once, unless another thread is running this device's hooks
            return
        try:
            try:
                lazy = self.module_loading_mode() == "lazy"
            except Exception:  # advice only: never the reason a wait fails
                lazy = False
            if lazy:
                _log.lazy_loading()
            for hook in hooks:
                self.run_hook(hook, ordinal)
        finally:
            done.set()
            with self._lock:
                waited = self._waited
                self._hooks_done = len(waited) == self._count and all(
                    e.is_set() for e in waited.values()
                )

    def _use(self, ordinal: int) -> int:
        """Make ``ordinal``'s primary context current on this thread; return it."""
        ctx = self._ctx.get(ordinal)
        if ctx is None:
            ctx = self._primary(ordinal)
        d = self._d
        try:
            if d.ctx_get_current() != ctx:
                d.ctx_set_current(ctx)
        except self._DriverError as exc:
            self._fail(exc, "cuCtxSetCurrent")
        return ctx

    def _primary(self, ordinal: int) -> int:
        """``ordinal``'s primary context, retained once (it stays retained)."""
        ctx = self._ctx.get(ordinal)
        if ctx is not None:
            return ctx
        if not isinstance(ordinal, int) or not 0 <= ordinal < self._count:
            raise CudaError(
                f"device ordinal {ordinal!r} out of range [0, {self._count})",
                101,
                "CUDA_ERROR_INVALID_DEVICE",
            )
        d = self._d
        with self._lock:
            ctx = self._ctx.get(ordinal)
            if ctx is None:
                try:
                    dev = d.device_get(ordinal)
                    ctx = d.device_primary_ctx_retain(dev)
                except self._DriverError as exc:
                    self._fail(exc, "cuDevicePrimaryCtxRetain")
                self._devices[ordinal] = dev
                self._ordinals[dev] = ordinal
                self._ctx[ordinal] = ctx
                self._ctx_ordinals[int(ctx)] = ordinal
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
        # The stream's context, and from it the device: cuStreamGetDevice (like GetFlags and
        # GetId) is refused on a capturing stream and invalidates the capture; cuStreamGetCtx
        # and cuCtxGetDevice_v2 are not (seen on an H200, driver 580).
        try:
            ctx = int(d.stream_get_ctx(stream))
        except self._DriverError as exc:
            self._fail(exc, "cuStreamGetCtx")
        ordinal = self._ctx_ordinals.get(ctx)
        if ordinal is None:
            ordinal = self._context_device(ctx, stream)
        if ctx != self._use(ordinal):
            raise DeviceMismatchError(
                f"stream {stream:#x} belongs to a context other than device {ordinal}'s primary "
                "context; aiocudasem works in primary contexts (those of the CUDA runtime, "
                "PyTorch, CuPy and cuda.core)"
            )
        return ordinal

    def _context_device(self, ctx: int, stream: int) -> int:
        """The ordinal of the device of ``ctx``, ``stream``'s context, which is not a primary
        context that this driver has used yet. Never cuStreamGetDevice, which a capture
        refuses."""
        d = self._d
        try:
            dev = int(d.ctx_get_device_v2(ctx))
        except Exception:  # a driver before CUDA 13.0 has no cuCtxGetDevice_v2
            # The primary context that is ``ctx``, if one is; else any device: the caller
            # finds that ``ctx`` is not its primary context and says so.
            for i in range(self._count):
                if self._primary(i) == ctx:
                    return i
            return 0
        known = self._ordinals.get(dev)
        if known is not None:
            return known
        return next(i for i in range(self._count) if int(d.device_get(i)) == dev)

    def stream_capturing(self, stream: int) -> bool:
        return bool(self._call("cuStreamIsCapturing", self._d.stream_is_capturing, stream))

    # The wait path's calls (stream_query, stream_wait_event, launch_host_func, event_record,
    # event_query) are _cucalls' C functions, bound over these methods in __init__: no
    # exception is raised and caught for "not ready", and the arguments are converted in C.
    # The methods say the same for the type checker, and serve after a fork (they raise).

    def stream_query(self, stream: int) -> bool:
        return bool(self._c.stream_query(stream))

    def stream_synchronize(self, stream: int) -> None:
        self._call("cuStreamSynchronize", self._d.stream_synchronize, stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._c.stream_wait_event(stream, event)

    def launch_host_func(self, stream: int, fn: int, user_data: int) -> None:
        # The raw C pointer goes to cuLaunchHostFunc: no Python trampoline, so the driver's
        # callback thread never takes the GIL.
        self._c.launch_host_func(stream, fn, user_data)

    # ------------------------------------------------------------------ events

    def event_create(self, ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        self._use(ordinal)
        flags = (0 if timing else _EVENT_DISABLE_TIMING) | (_EVENT_BLOCKING_SYNC if blocking else 0)
        return int(self._call("cuEventCreate", self._d.event_create, flags))

    def event_destroy(self, event: int) -> None:
        self._call("cuEventDestroy", self._d.event_destroy_v2, event)

    def event_record(self, event: int, stream: int) -> None:
        self._c.event_record(event, stream)

    def event_query(self, event: int) -> bool:
        return bool(self._c.event_query(event))

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
        row = lookup(desc.handle_type)
        passed_as = row.passed_as if row is not None else "win32"  # the driver refuses it
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

    def _semaphore_params(self, ops: Sequence[SemOp], signal: bool) -> Any:
        """The ops as an array of ``CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS`` (or ``_SIGNAL_``)."""
        params = np.zeros(len(ops), dtype=self._signal_dtype if signal else self._wait_dtype)
        p = params["params"]
        p["fence"]["value"] = [op.value for op in ops]
        p["nv_sci_sync"]["fence"] = [op.nvsci_fence for op in ops]
        p["keyed_mutex"]["key"] = [op.key for op in ops]
        if not signal:
            p["keyed_mutex"]["timeout_ms"] = [op.timeout_ms for op in ops]
        params["flags_"] = [op.flags for op in ops]
        return params

    def enqueue_semaphore_waits(self, ops: Sequence[SemOp], stream: int) -> None:
        if not self._hooks_done:
            self._first_wait(stream)
        params = self._semaphore_params(ops, signal=False)
        self._call(
            "cuWaitExternalSemaphoresAsync",
            self._d.wait_external_semaphores_async,
            [op.sem for op in ops],
            params.ctypes.data,
            len(ops),
            stream,
        )

    def enqueue_semaphore_signals(self, ops: Sequence[SemOp], stream: int) -> None:
        params = self._semaphore_params(ops, signal=True)
        self._call(
            "cuSignalExternalSemaphoresAsync",
            self._d.signal_external_semaphores_async,
            [op.sem for op in ops],
            params.ctypes.data,
            len(ops),
            stream,
        )

    # ------------------------------------------------------------------ graphs

    def _node_params(
        self, ops: Sequence[SemOp], signal: bool
    ) -> tuple[_ExtSemNodeParams, tuple[object, object]]:
        """A semaphore node's parameters, and the arrays they point into: keep those alive
        until the driver has copied them (during the call)."""
        params = self._semaphore_params(ops, signal)
        sems = (ctypes.c_void_p * len(ops))(*[op.sem for op in ops])
        node = _ExtSemNodeParams(ctypes.addressof(sems), params.ctypes.data, len(ops))
        return node, (params, sems)

    def graph_add_semaphore_node(
        self, graph: int, dependencies: Sequence[int], ops: Sequence[SemOp], signal: bool
    ) -> int:
        name = f"cuGraphAddExternalSemaphores{'Signal' if signal else 'Wait'}Node"
        add = self._ctypes_call(name, _GRAPH_ADD_T)
        node_params, _arrays = self._node_params(ops, signal)
        deps = (ctypes.c_void_p * max(1, len(dependencies)))(*dependencies)
        node = ctypes.c_void_p()
        status = int(
            add(ctypes.byref(node), graph, deps, len(dependencies), ctypes.byref(node_params))
        )
        if status:
            self._fail_status(status, name)
        return int(node.value or 0)

    def graph_exec_set_semaphore_node(
        self, graph_exec: int, node: int, ops: Sequence[SemOp], signal: bool
    ) -> None:
        name = f"cuGraphExecExternalSemaphores{'Signal' if signal else 'Wait'}NodeSetParams"
        set_params = self._ctypes_call(name, _GRAPH_EXEC_SET_T)
        node_params, _arrays = self._node_params(ops, signal)
        status = int(set_params(graph_exec, node, ctypes.byref(node_params)))
        if status:
            self._fail_status(status, name)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        # A graph's semaphore waits block the stream as enqueued ones do: the same hooks.
        if not self._hooks_done:
            self._first_wait(stream)
        self._call("cuGraphLaunch", self._d.graph_launch, graph_exec, stream)

    def graph_semaphore_nodes(self, graph: int, signal: bool) -> list[int]:
        d = self._d
        wanted = int(d.GraphNodeType.EXT_SEMAS_SIGNAL if signal else d.GraphNodeType.EXT_SEMAS_WAIT)
        nodes = self._call("cuGraphGetNodes", d.graph_get_nodes, graph)
        return [
            int(n)
            for n in nodes
            if int(self._call("cuGraphNodeGetType", d.graph_node_get_type, int(n))) == wanted
        ]

    # ------------------------------------------------------------------ interprocess events

    def _check_ipc_events(self, ordinal: int) -> None:
        if not self._attribute(ordinal, "IPC_EVENT_SUPPORTED"):
            raise UnsupportedFeatureError(
                f"device {ordinal} ({self.device_name(ordinal)}) has no interprocess events "
                "(CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED is 0)"
            )

    def ipc_event_create(self, ordinal: int) -> int:
        self._use(ordinal)
        self._check_ipc_events(ordinal)
        flags = _EVENT_INTERPROCESS | _EVENT_DISABLE_TIMING
        return int(self._call("cuEventCreate", self._d.event_create, flags))

    def ipc_event_export(self, event: int) -> bytes:
        get = self._ctypes_call("cuIpcGetEventHandle", _IPC_GET_T)
        raw = _IpcEventHandle()
        status = int(get(ctypes.byref(raw), event))
        if status:
            self._fail_status(status, "cuIpcGetEventHandle")
        return bytes(raw)  # all 64 bytes: the field itself would stop at the first NUL

    def ipc_event_open(self, ordinal: int, handle: bytes) -> int:
        self._use(ordinal)
        self._check_ipc_events(ordinal)
        open_ = self._ctypes_call("cuIpcOpenEventHandle", _IPC_OPEN_T)
        if len(handle) != _IPC_HANDLE_SIZE:
            raise CudaError(
                f"an interprocess event handle has {_IPC_HANDLE_SIZE} bytes, not {len(handle)}",
                1,
                "CUDA_ERROR_INVALID_VALUE",
            )
        raw = _IpcEventHandle()
        ctypes.memmove(ctypes.byref(raw), handle, _IPC_HANDLE_SIZE)
        event = ctypes.c_void_p()
        status = int(open_(ctypes.byref(event), raw))
        if status:
            self._fail_status(status, "cuIpcOpenEventHandle")
        return int(event.value or 0)

    # ------------------------------------------------------------------ host memory words

    def _ctypes_call(self, name: str, proto: Any) -> Any:
        """The driver's ``name`` (at the CUDA 12.0 ABI), as a ctypes function of ``proto``,
        found once."""
        fn = self._ctypes_fns.get(name)
        if fn is None:
            pfn, status = self._call(
                "cuGetProcAddress", self._d.get_proc_address_v2, name.encode(), _FAST_ABI, 0
            )
            if not pfn or int(status) != 0:
                raise UnsupportedFeatureError(
                    f"the CUDA driver does not provide {name} (cuGetProcAddress)"
                )
            fn = self._ctypes_fns[name] = proto(int(pfn))
        return fn

    def _attribute(self, ordinal: int, name: str) -> int:
        """The device's ``CU_DEVICE_ATTRIBUTE_<name>``, asked once (it does not change). The
        device's context must be current (``_use``)."""
        key = (ordinal, name)
        value = self._attributes.get(key)
        if value is None:
            d = self._d
            number = int(getattr(d.DeviceAttribute, name))
            value = self._attributes[key] = int(
                self._call(
                    "cuDeviceGetAttribute", d.device_get_attribute, number, self._devices[ordinal]
                )
            )
        return value

    def _check_host_words(self, ordinal: int) -> None:
        """Refuse a device that cannot wait on and write mapped host memory from a stream."""
        for attr, what in _HOST_WORD_ATTRIBUTES:
            if not self._attribute(ordinal, attr):
                raise UnsupportedFeatureError(
                    f"device {ordinal} ({self.device_name(ordinal)}) has no {what} "
                    f"(CU_DEVICE_ATTRIBUTE_{attr} is 0), which a host timeline needs"
                )

    def host_register(self, ordinal: int, address: int, size: int) -> int:
        self._use(ordinal)
        self._check_host_words(ordinal)
        register = self._ctypes_call("cuMemHostRegister", _HOST_REGISTER_T)
        status = int(register(address, size, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_DEVICEMAP))
        if status == _NOT_SUPPORTED:
            raise UnsupportedFeatureError(
                f"cuMemHostRegister refused the memory on device {ordinal}: "
                "CUDA_ERROR_NOT_SUPPORTED (801)",
                status,
            )
        if status:
            self._fail_status(status, "cuMemHostRegister")
        self._registered[address] = ordinal
        try:
            return int(
                self._call(
                    "cuMemHostGetDevicePointer",
                    self._d.mem_host_get_device_pointer_v2,
                    address,
                    0,
                )
            )
        except BaseException:
            self.host_unregister(address)
            raise

    def notify_word(self, address: int) -> None:
        pass  # the GPU sees a host store to mapped memory by itself

    def host_unregister(self, address: int) -> None:
        # Called from release threads, which may have no context current: use the one the
        # memory was registered in.
        self._use(self._registered.get(address, 0))
        unregister = self._ctypes_call("cuMemHostUnregister", _HOST_UNREGISTER_T)
        status = int(unregister(address))
        if status:
            self._fail_status(status, "cuMemHostUnregister")
        self._registered.pop(address, None)

    def enqueue_wait_value64(self, stream: int, address: int, value: int) -> None:
        # A stream blocked here blocks module loading as a semaphore wait does: the first
        # wait of a device runs the same hooks (see before_first_wait).
        if not self._hooks_done:
            self._first_wait(stream)
        self._call("cuStreamWaitValue64", self._d.stream_wait_value64_v2, stream, address, value, 0)

    def enqueue_write_value64(self, stream: int, address: int, value: int) -> None:
        self._call(
            "cuStreamWriteValue64", self._d.stream_write_value64_v2, stream, address, value, 0
        )

    # ------------------------------------------------------------------ kernels, pinned memory
    # Not part of the Driver protocol: the library never launches a kernel. The workloads
    # (``aiocudasem._workloads._cuda``) use these, and ``CudaWorkloadDriver`` there declares
    # them.

    def before_first_wait(self, hook: Callable[[int], object]) -> list[int]:
        """Call ``hook(ordinal)`` before each device's first semaphore wait, with that
        device's context current. Module loads go here: loading a module waits until no stream
        of the context is blocked, so one that runs behind a wait on a semaphore signalled
        afterwards never returns (seen on an H200 under lazy loading; docs/lazy-loading.md).
        The workloads load their kernels this way (they use only this section's methods and
        :meth:`stream_device`).

        Returns the devices that have had their first wait already: the caller runs its hook
        for them itself (:meth:`run_hook`)."""
        with self._lock:
            self._first_wait_hooks.append(hook)
            return sorted(self._waited)

    def run_hook(self, hook: Callable[[int], object], ordinal: int) -> None:
        """``hook(ordinal)`` with the device's context current. Best effort: a user's wait
        must not fail because a hook could not load its kernels; the kernels' own first launch
        reports that, and the failure is logged."""
        try:
            self._use(ordinal)
            hook(ordinal)
        except Exception as exc:
            _log.logger.warning(
                "loading kernels ahead of device %d's first semaphore wait failed: %s; their "
                "first launch will load them, which can deadlock behind a pending wait under "
                "lazy loading (see docs/lazy-loading.md)",
                ordinal,
                exc,
            )

    def mem_host_alloc(self, nbytes: int) -> int:
        """``nbytes`` of page-locked host memory, portable: kernels of every device's context
        can use it (``cuMemHostAlloc`` with ``CU_MEMHOSTALLOC_PORTABLE``, in device 0's primary
        context)."""
        self._use(0)
        return int(
            self._call("cuMemHostAlloc", self._d.mem_host_alloc, nbytes, _HOST_ALLOC_PORTABLE)
        )

    def mem_free_host(self, ptr: int) -> None:
        """Free memory from :meth:`mem_host_alloc` (``cuMemFreeHost``)."""
        self._call("cuMemFreeHost", self._d.mem_free_host, ptr)

    def compute_capability(self, ordinal: int) -> tuple[int, int]:
        """The device's compute capability, major and minor. The device's context must be
        current."""
        major = self._attribute(ordinal, "COMPUTE_CAPABILITY_MAJOR")
        return major, self._attribute(ordinal, "COMPUTE_CAPABILITY_MINOR")

    def library_load_data(self, image: bytes) -> int:
        """Load a fatbin, cubin or PTX image into a ``CUlibrary`` (``cuLibraryLoadData``); its
        kernels load into a context by :meth:`library_load_kernel`. A device the image has no
        code for raises :class:`CudaError` with status 209, 218 or 222."""
        return int(
            self._call("cuLibraryLoadData", self._d.library_load_data, image, 0, 0, 0, 0, 0, 0)
        )

    def library_unload(self, library: int) -> None:
        """Unload a library from :meth:`library_load_data` (``cuLibraryUnload``)."""
        self._call("cuLibraryUnload", self._d.library_unload, library)

    def library_load_kernel(self, library: int, name: str) -> int:
        """Return kernel ``name`` of ``library``, loaded into the current context: under lazy
        loading it would otherwise load at its first launch (docs/lazy-loading.md)."""
        d = self._d
        try:
            kernel = int(d.library_get_kernel(library, name.encode()))
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

    def launch_kernel(self, kernel: int, grid: int, block: int, stream: int, params: int) -> None:
        """Enqueue ``kernel`` (from :meth:`library_load_kernel`) on the stream, as a
        one-dimensional grid of ``grid`` blocks of ``block`` threads, without dynamic shared
        memory (``cuLaunchKernel``). ``params`` is the address of the array of pointers to its
        arguments."""
        self._call(
            "cuLaunchKernel",
            self._d.launch_kernel,
            kernel,
            *(grid, 1, 1, block, 1, 1),
            *(0, stream, params, 0),  # shared memory, stream, arguments, extra
        )
