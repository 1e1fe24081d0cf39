"""Interprocess events, host memory words (host timelines), and the kernels and pinned memory
that the workloads use."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from ..._errors import (
    CudaError,
    UnsupportedFeatureError,
)
from ._abi import (
    _EVENT_DISABLE_TIMING,
    _EVENT_INTERPROCESS,
    _FUNCTION_LOADED,
    _FUNCTION_NOT_LOADED,
    _HOST_ALLOC_PORTABLE,
    _HOST_REGISTER_DEVICEMAP,
    _HOST_REGISTER_PORTABLE,
    _HOST_REGISTER_T,
    _HOST_UNREGISTER_T,
    _HOST_WORD_ATTRIBUTES,
    _IPC_GET_T,
    _IPC_HANDLE_SIZE,
    _IPC_OPEN_T,
    _NOT_SUPPORTED,
    _IpcEventHandle,
)
from ._semaphores import _Semaphores

if TYPE_CHECKING:
    pass


__all__ = ("_Memory",)


class _Memory(_Semaphores):
    """Interprocess events, host words, kernels and pinned memory."""

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
