"""The C structures, function types and constants of the CUDA driver that the other modules
use: what ``cuda.bindings`` does not give, called through ctypes at the driver's addresses."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Final, TypeVar

if TYPE_CHECKING:
    pass


__all__ = ()

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
