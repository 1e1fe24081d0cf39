"""The simulated devices: what they are called, their health, and the faults injected into
them (a kernel that raises faults its device too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import STICKY_STATUSES
from ._core import _Core
from ._status import _LAUNCH_FAILED

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._model import _Stream


class _Devices(_Core):
    def device_count(self) -> int:
        return self._devices

    def device_uuid(self, ordinal: int) -> bytes:
        self._check_device(ordinal, "cuDeviceGetUuid")
        return bytes([0x51, 0x4D] + [ordinal] * 14)

    def device_name(self, ordinal: int) -> str:
        self._check_device(ordinal, "cuDeviceGetName")
        return f"Simulated CUDA device {ordinal}"

    def check_health(self, ordinal: int) -> None:
        with self._lock:
            self._check_device(ordinal, "cuEventQuery")

    # ------------------------------------------------------------------ faults

    def inject_fault(self, ordinal: int = 0, status: int = 700) -> None:
        """Put device ``ordinal``'s context into a sticky error: pending work is dropped, host
        functions are never called, and every later call on it raises DeviceFaultError.
        Raises ``TypeError`` for a value of the wrong type, ``ValueError`` for a device that
        does not exist or a status that is not sticky."""
        if isinstance(ordinal, bool) or not isinstance(ordinal, int):
            raise TypeError(f"ordinal must be an int, not {type(ordinal).__name__}")
        if not 0 <= ordinal < self._devices:
            raise ValueError(f"device {ordinal} does not exist: {self._devices} device(s)")
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError(f"status must be an int CUresult, not {type(status).__name__}")
        if status not in STICKY_STATUSES:
            sticky = ", ".join(map(str, sorted(STICKY_STATUSES)))
            raise ValueError(f"{status} is not a sticky CUresult: use one of {sticky}")
        with self._lock:
            self._fault(ordinal, status)

    def _kernel(self, s: _Stream, fn: Callable[[], None]) -> Callable[[], None]:
        def kernel() -> None:
            try:
                fn()
            except BaseException:
                self.inject_fault(s.device, _LAUNCH_FAILED)

        return kernel
