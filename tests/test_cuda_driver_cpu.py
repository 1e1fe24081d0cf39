"""The CUDA driver's own logic, on a stand-in for the bindings (no GPU needed). What only the
real driver can show is in tests/gpu/."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("cuda.bindings._v2.driver")

from cuda.bindings._v2 import driver as real

from aiocudasem._driver._cuda import CudaDriver
from aiocudasem._workloads._cuda import _KERNEL_NAMES
from aiocudasem.lowlevel import SemOp
from aiocudasem.testing import workloads

#: One load of each of the workloads' kernels, when their library is loaded.
LOADS = ["func_load"] * len(_KERNEL_NAMES)


class _Bindings:
    """Just enough of cuda.bindings._v2.driver for one device's primary context."""

    DriverError = real.DriverError
    NotReadyError = real.NotReadyError
    external_semaphore_wait_params_v1_dtype = real.external_semaphore_wait_params_v1_dtype

    def __init__(self, library_fails: bool) -> None:
        self.library_fails = library_fails
        self.calls: list[str] = []
        self.current = 0
        self.capturing = 0  # CU_STREAM_CAPTURE_STATUS of every stream
        self.old_driver = False

    def _capture_unsafe(self) -> None:
        if self.capturing:  # as on a GPU: refused, and the capture invalidated
            self.capturing = 2
            exc = real.DriverError("capture")
            exc.status = 900  # type: ignore[attr-defined]
            raise exc

    def stream_get_device(self, stream: int) -> int:
        self._capture_unsafe()
        return 0

    def stream_is_capturing(self, stream: int) -> int:
        return self.capturing

    def ctx_get_device_v2(self, ctx: int) -> int:
        if self.old_driver:
            raise RuntimeError("cuCtxGetDevice_v2 not found")  # what a driver before 13.0 gives
        return 0

    def stream_get_ctx(self, stream: int) -> int:
        return 0xC0

    def device_get(self, ordinal: int) -> int:
        return 0

    def device_primary_ctx_retain(self, dev: int) -> int:
        return 0xC0

    def ctx_get_current(self) -> int:
        return self.current

    def ctx_set_current(self, ctx: int) -> None:
        self.current = ctx

    def get_error_name(self, status: int) -> str:
        return f"CUDA_ERROR_{status}"

    def library_load_data(self, *args: Any) -> int:
        self._capture_unsafe()
        self.calls.append("library_load_data")
        if self.library_fails:
            exc = real.DriverError("no")
            exc.status = 999  # type: ignore[attr-defined]
            raise exc
        return 0x11B

    def library_get_kernel(self, lib: int, name: bytes) -> int:
        return hash(name) & 0xFFFF

    def kernel_get_function(self, kernel: int) -> int:
        return kernel

    def func_load(self, func: int) -> None:
        self.calls.append("func_load")

    def func_is_loaded(self, func: int) -> int:
        return 1

    def wait_external_semaphores_async(self, *args: Any) -> None:
        self.calls.append("wait")


def _driver(bindings: _Bindings) -> CudaDriver:
    drv = object.__new__(CudaDriver)
    drv._d = bindings
    drv._DriverError = real.DriverError
    drv._NotReady = real.NotReadyError
    drv._count = 1
    drv._lock = threading.Lock()
    drv._devices, drv._ordinals, drv._ctx, drv._probe = {}, {}, {}, {}
    drv._ctx_ordinals = {}
    drv._waited, drv._first_wait_hooks, drv._hooks_done = {}, [], False
    drv._wait_dtype = real.external_semaphore_wait_params_v1_dtype
    return drv


def test_the_workload_kernels_are_loaded_before_the_first_wait_once() -> None:
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    workloads(drv)
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    drv.enqueue_semaphore_waits([SemOp(1, value=2)], 0x5)
    assert b.calls == ["library_load_data", *LOADS, "wait", "wait"]


def test_a_captured_first_wait_leaves_the_hooks_for_a_wait_outside_capture() -> None:
    """A first wait on a capturing stream runs no hook (a module load, or finding the device
    with cuStreamGetDevice, would invalidate the capture); the next wait outside runs them."""
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    workloads(drv)
    b.capturing = 1
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    assert b.calls == ["wait"] and b.capturing == 1  # the capture is intact
    b.capturing = 0
    drv.enqueue_semaphore_waits([SemOp(1, value=2)], 0x5)
    assert b.calls == ["wait", "library_load_data", *LOADS, "wait"]


def test_a_capturing_streams_device_is_found_without_invalidating_the_capture() -> None:
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    b.capturing = 1
    assert drv.stream_device(0x5) == 0  # a context it did not know yet: cuCtxGetDevice_v2
    assert drv.stream_device(0x5) == 0  # known now
    assert b.capturing == 1
    assert drv.stream_capturing(0x5)


def test_a_driver_without_cuctxgetdevice_v2_finds_the_device_by_its_primary_context() -> None:
    b = _Bindings(library_fails=False)
    b.old_driver = True
    drv = _driver(b)
    b.capturing = 1
    assert drv.stream_device(0x5) == 0
    assert b.capturing == 1  # cuStreamGetDevice was not called


def test_a_kernel_that_cannot_load_does_not_fail_the_users_wait() -> None:
    b = _Bindings(library_fails=True)
    drv = _driver(b)
    workloads(drv)
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    drv.enqueue_semaphore_waits([SemOp(1, value=2)], 0x5)
    # Tried once, then the waits went ahead; the kernels' own launch reports the failure.
    assert b.calls == ["library_load_data", "wait", "wait"]


def test_workloads_made_after_a_wait_load_their_kernels_at_once() -> None:
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    assert b.calls == ["wait"]  # no workloads yet: nothing to load
    workloads(drv)
    assert b.calls == ["wait", "library_load_data", *LOADS]
    drv.enqueue_semaphore_waits([SemOp(1, value=2)], 0x5)
    assert b.calls[-1] == "wait"
    assert b.calls.count("library_load_data") == 1


def test_workloads_that_cannot_load_after_a_wait_are_still_made_once() -> None:
    b = _Bindings(library_fails=True)
    drv = _driver(b)
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    first = workloads(drv)  # the catch-up load fails: best effort, no exception
    assert workloads(drv) is first
    assert len(drv._first_wait_hooks) == 1  # one hook, however often they are asked for
    assert b.calls.count("library_load_data") == 1


def test_a_hook_that_fails_with_any_error_does_not_fail_the_wait() -> None:
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    ran: list[str] = []

    def broken(ordinal: int) -> None:
        raise RuntimeError("libnvrtc.so not found")

    drv.before_first_wait(broken)
    drv.before_first_wait(lambda ordinal: ran.append("second"))
    drv.enqueue_semaphore_waits([SemOp(1, value=1)], 0x5)
    assert b.calls == ["wait"]  # the user's wait went ahead
    assert ran == ["second"]  # and the other hooks ran


def test_a_concurrent_first_wait_goes_after_the_hooks() -> None:
    b = _Bindings(library_fails=False)
    drv = _driver(b)
    gate = threading.Event()

    def slow_hook(ordinal: int) -> None:
        b.calls.append("hook-start")
        assert gate.wait(5)
        b.calls.append("hook-end")

    drv.before_first_wait(slow_hook)
    first = threading.Thread(target=drv.enqueue_semaphore_waits, args=([SemOp(1, value=1)], 0x5))
    first.start()
    while "hook-start" not in b.calls:
        time.sleep(0.001)
    second = threading.Thread(target=drv.enqueue_semaphore_waits, args=([SemOp(1, value=2)], 0x5))
    second.start()
    time.sleep(0.05)
    assert "wait" not in b.calls  # the second wait is held back while the hook runs
    gate.set()
    first.join(5)
    second.join(5)
    assert b.calls == ["hook-start", "hook-end", "wait", "wait"]


def test_the_device_attributes_asked_for_exist_in_the_bindings() -> None:
    """The real driver asks for device attributes by name; each name must be a member of the
    bindings' enum (a wrong one would fail only on a GPU)."""
    from cuda.bindings._v2 import driver as d

    from aiocudasem._driver._cuda._abi import _HOST_WORD_ATTRIBUTES

    for name in [attr for attr, _ in _HOST_WORD_ATTRIBUTES] + ["IPC_EVENT_SUPPORTED"]:
        assert isinstance(int(getattr(d.DeviceAttribute, name)), int), name


def test_an_interprocess_handle_travels_whole_with_its_nul_bytes() -> None:
    """CUDA's 64-byte event handle holds NUL bytes: export returns all 64, and open passes
    them on unchanged (the handle struct's field, read as bytes, would stop at the first)."""
    import ctypes

    from aiocudasem._driver._cuda._abi import _IpcEventHandle

    raw = bytes(range(64))  # a NUL first, others later
    seen: list[bytes] = []

    def get(out: Any, event: int) -> int:
        ctypes.memmove(out, raw, 64)
        return 0

    def open_(out: Any, handle: _IpcEventHandle) -> int:
        seen.append(bytes(handle))
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0xE7
        return 0

    drv = _driver(_Bindings(library_fails=False))
    drv._ctypes_fns = {"cuIpcGetEventHandle": get, "cuIpcOpenEventHandle": open_}
    drv._check_ipc_events = lambda ordinal: None  # type: ignore[method-assign]
    assert drv.ipc_event_export(0x10) == raw
    assert drv.ipc_event_open(0, raw) == 0xE7
    assert seen == [raw]


def test_a_graph_semaphore_node_passes_its_semaphores_values_and_dependencies() -> None:
    """The node parameters reach the driver as CUDA lays them out: the semaphore array, the
    parameter array (a fence value first in each entry), the count, and the dependencies."""
    import ctypes

    import numpy as np

    from aiocudasem._driver._cuda._abi import _ExtSemNodeParams

    seen: dict[str, Any] = {}

    def add(out: Any, graph: int, deps: Any, count: int, params: Any) -> int:
        p = ctypes.cast(params, ctypes.POINTER(_ExtSemNodeParams)).contents
        n = p.num_ext_sems
        sems = ctypes.cast(p.ext_sem_array, ctypes.POINTER(ctypes.c_void_p * n)).contents
        dtype = real.external_semaphore_wait_params_v1_dtype
        raw = ctypes.string_at(p.params_array, n * dtype.itemsize)
        values = np.frombuffer(raw, dtype=dtype)["params"]["fence"]["value"]
        dep_list = ctypes.cast(deps, ctypes.POINTER(ctypes.c_void_p * count)).contents
        seen.update(
            graph=graph,
            sems=list(sems),
            values=[int(v) for v in values],
            deps=list(dep_list),
        )
        out[0] = 0x90DE
        return 0

    drv = _driver(_Bindings(library_fails=False))
    drv._signal_dtype = real.external_semaphore_signal_params_v1_dtype
    # Through the real prototype, as the driver's address would be called.
    from aiocudasem._driver._cuda._abi import _GRAPH_ADD_T

    drv._ctypes_fns = {"cuGraphAddExternalSemaphoresWaitNode": _GRAPH_ADD_T(add)}
    # The struct is CUDA's, not only the one this test reads back with.
    layout = real.ext_sem_wait_node_params_v1_dtype
    assert ctypes.sizeof(_ExtSemNodeParams) == layout.itemsize
    assert [getattr(_ExtSemNodeParams, f).offset for f, _ in _ExtSemNodeParams._fields_] == [
        layout.fields[f][1] for f in ("ext_sem_array", "params_array", "num_ext_sems")
    ]
    ops = [SemOp(0x51, value=7), SemOp(0x52, value=9)]
    node = drv.graph_add_semaphore_node(0x6A, [0x70, 0x71], ops, signal=False)
    assert node == 0x90DE
    assert seen == {"graph": 0x6A, "sems": [0x51, 0x52], "values": [7, 9], "deps": [0x70, 0x71]}
