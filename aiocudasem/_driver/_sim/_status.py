"""The simulated device's statuses: CUDA's codes, their symbolic names, and the errors it
raises with them."""

from __future__ import annotations

from typing import Final

from ..._errors import STICKY_STATUSES, CudaError, DeviceFaultError

_INVALID_VALUE: Final = 1
_INVALID_HANDLE: Final = 400
_NOT_SUPPORTED: Final = 801
_LAUNCH_FAILED: Final = 719
_ILLEGAL_ADDRESS: Final = 700
_INVALID_CONTEXT: Final = 201
_ALREADY_REGISTERED: Final = 712
_NOT_REGISTERED: Final = 713
_ILLEGAL_STATE: Final = 401
_CAPTURE_UNSUPPORTED: Final = 900
_CAPTURE_INVALIDATED: Final = 901
_CAPTURED_EVENT: Final = 907
_U64: Final = 1 << 64


# The symbolic names of every status the simulated device raises (any sticky one can be
# injected), as cuGetErrorName gives them.
_CUDA_NAMES: Final = {
    _INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    _INVALID_CONTEXT: "CUDA_ERROR_INVALID_CONTEXT",
    _INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE",
    _ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    _ALREADY_REGISTERED: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    _NOT_REGISTERED: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    600: "CUDA_ERROR_NOT_READY",
    _NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE",
    220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    710: "CUDA_ERROR_ASSERT",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    _LAUNCH_FAILED: "CUDA_ERROR_LAUNCH_FAILED",
    _CAPTURE_UNSUPPORTED: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    _CAPTURE_INVALIDATED: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    _CAPTURED_EVENT: "CUDA_ERROR_CAPTURED_EVENT",
}


def _uint(name: str, value: object, what: str = "an int") -> int:
    """``value`` as an int in [0, 2**64): ``TypeError`` for another type (a bool included),
    ``ValueError`` out of range. ``what`` names the value in the messages."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what} in [0, 2**64), not {type(value).__name__}")
    if not 0 <= value < _U64:
        raise ValueError(f"{name} must be {what} in [0, 2**64), not {value}")
    return value


def _error(status: int, what: str) -> CudaError:
    name = _CUDA_NAMES.get(status, f"CUDA_ERROR_{status}")
    cls = DeviceFaultError if status in STICKY_STATUSES else CudaError
    return cls(f"{what} failed: {name} ({status}) [simulated]", status, name)
