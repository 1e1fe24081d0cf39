"""Streams and events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import (
    DeviceMismatchError,
)
from ._abi import _EVENT_BLOCKING_SYNC, _EVENT_DISABLE_TIMING, _STREAM_NON_BLOCKING
from ._core import _Core

if TYPE_CHECKING:
    pass


__all__ = ("_Streams",)


class _Streams(_Core):
    """Streams and events."""

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

    def check_health(self, ordinal: int) -> None:
        probe = self._probe.get(ordinal)
        if probe is None:
            probe = self._probe[ordinal] = self.event_create(ordinal)
        self.event_query(probe)
