"""The driver's state, its failure paths, the primary contexts and the devices."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ... import _cucalls
from ..._errors import (
    STICKY_STATUSES,
    CudaError,
    DeviceFaultError,
    UnsupportedFeatureError,
)
from .._protocol import forked_error, unavailable
from ._abi import _FAST_ABI, _FAST_CALLS, _FAST_METHODS, _LOADING_MODES, _T

if TYPE_CHECKING:
    from collections.abc import Callable


__all__ = ("_Core",)


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


class _Core:
    """The bindings, the contexts and devices, and how a failure becomes an error."""

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
