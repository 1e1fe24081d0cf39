"""Streams and events on the simulated device: creating and querying streams, stream capture,
kernels and host functions, and recording, querying and waiting for events."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Protocol

from .._protocol import stream_handle
from ._graphs import _Graphs
from ._model import _Event, _Node, _Stream
from ._status import (
    _CAPTURE_INVALIDATED,
    _CAPTURE_UNSUPPORTED,
    _CAPTURED_EVENT,
    _ILLEGAL_STATE,
    _INVALID_HANDLE,
    _INVALID_VALUE,
    _error,
)
from ._steps import _IpcWait, _SeqWait, _Stamp

if TYPE_CHECKING:
    from collections.abc import Callable

    class _CudaStream(Protocol):
        """A stream of the CUDA stream protocol (an ``aiocudasem.Stream`` among them)."""

        def __cuda_stream__(self) -> tuple[int, int]: ...


_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Streams(_Graphs):
    def launch(self, stream: _CudaStream | int, fn: Callable[[], None]) -> None:
        """Enqueue a Python callable as a simulated kernel. It runs on the stream's worker
        thread; an exception in it faults the context with CUDA_ERROR_LAUNCH_FAILED.
        ``stream`` is an :class:`aiocudasem.Stream` of this driver, another object with
        ``__cuda_stream__``, or a raw handle (``stream.handle``). Raises ``TypeError`` for
        another ``stream`` or an ``fn`` that is not callable, and ``DeviceMismatchError`` for
        a stream of another driver."""
        stream = self._launch_handle(stream)
        if not callable(fn):
            raise TypeError(f"fn must be a callable, not {type(fn).__name__}")

        with self._lock:
            s = self._stream(stream, "cuLaunchKernel", capturable=True)
            if s.capture is not None:
                self._capture(s, _Node("kernel", fn=fn))
                return
            self._push(s, self._kernel(s, fn))

    def _launch_handle(self, stream: object) -> int:
        """``launch()``'s stream as a handle. The simulator sits below the library's objects
        and knows a ``Stream`` only by the CUDA stream protocol and its ``driver``."""
        return stream_handle(
            "SimDriver.launch()",
            stream,
            self,
            "the stream belongs to {owner!r}, not to {driver!r}: launch on the stream's own "
            "driver, stream.driver",
        )

    def _capture(self, s: _Stream, node: _Node) -> None:
        # Called with the lock held. Captured work on one stream is a chain: each node
        # depends on the one captured before it, which node order already expresses.
        assert s.capture is not None
        self._add_node(s.capture, node)

    # ------------------------------------------------------------------ streams

    def stream_create(self, ordinal: int, non_blocking: bool, priority: int) -> int:
        with self._lock:
            self._check_device(ordinal, "cuStreamCreateWithPriority")
            handle = next(self._ids)
            self._streams[handle] = _Stream(handle, ordinal, self._lock)
            return handle

    def stream_destroy(self, stream: int) -> None:
        with self._lock:
            s = self._streams.get(stream)
            if s is None or s.destroyed or stream == 0:
                raise _error(_INVALID_HANDLE, "cuStreamDestroy")
            # Like the driver: returns at once, pending work still completes. Until then the
            # stream costs a thread only while it has a kernel or host function to run.
            s.destroyed = True
            if self._room_waiters:  # an enqueue blocked on the full stream goes on
                self._room.notify_all()
            if s.thread is not None:
                s.cond.notify()
            elif not s.ops:
                del self._streams[stream]

    def stream_device(self, stream: int) -> int:
        with self._lock:
            return self._any_stream(stream, "cuStreamGetCtx").device

    def stream_capturing(self, stream: int) -> bool:
        with self._lock:
            return self._any_stream(stream, "cuStreamIsCapturing").capture is not None

    def begin_capture(self, stream: int) -> None:
        """Begin capturing the stream into a new graph (``cuStreamBeginCapture``). While it
        captures, the stream runs nothing: semaphore waits and signals and kernels
        (:meth:`launch`) become the graph's nodes, in order. Any other call on it (a query, a
        synchronize, a wait for an event, a host function, a memory operation, a graph launch)
        is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) and invalidates the
        capture, as cuStreamQuery does on a GPU. An event recorded on it is a captured event:
        querying, synchronizing or waiting for it is refused with CUDA_ERROR_CAPTURED_EVENT
        (907), until it is recorded again outside capture. (CUDA also lets other streams join
        a capture through such an event; the simulator does not model that.) The legacy
        default stream (0) cannot capture, and a stream that captures already is refused with
        CUDA_ERROR_ILLEGAL_STATE (401), its capture left as it was (both as on an H200)."""
        with self._lock:
            s = self._any_stream(stream, "cuStreamBeginCapture")
            if s.capture is not None:
                raise _error(_ILLEGAL_STATE, "cuStreamBeginCapture")
            if stream == 0:
                raise _error(_CAPTURE_UNSUPPORTED, "cuStreamBeginCapture")
            s.capture, s.capture_ok = [], True

    def end_capture(self, stream: int) -> int:
        """End the stream's capture and return the graph it captured (``cuStreamEndCapture``),
        which :meth:`graph_instantiate` takes. Raises CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        (901) if the capture was invalidated (and ends it), CUDA_ERROR_INVALID_VALUE if the
        stream is not capturing."""
        with self._lock:
            s = self._any_stream(stream, "cuStreamEndCapture")
            nodes, ok = s.capture, s.capture_ok
            if nodes is None:
                raise _error(_INVALID_VALUE, "cuStreamEndCapture")
            s.capture, s.capture_ok = None, True
            if not ok:
                raise _error(_CAPTURE_INVALIDATED, "cuStreamEndCapture")
            handle = next(self._ids)
            self._graphs[handle] = nodes
            return handle

    def stream_query(self, stream: int) -> bool:
        with self._lock:
            s = self._stream(stream, "cuStreamQuery")
            return s.done == s.submitted

    def stream_synchronize(self, stream: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamSynchronize")
            target = s.submitted
            if not self._sleep(lambda: s.done >= target, s, s.device):
                raise _error(self._faults[s.device], "cuStreamSynchronize")

    def stream_wait_event(self, stream: int, event: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuStreamWaitEvent")
            ev = self._event(event, "cuStreamWaitEvent")
            self._not_captured(ev, "cuStreamWaitEvent")
            if ev.ipc is not None:
                # The latest record, in any process.
                self._push(s, _IpcWait(ev.ipc, ev.ipc.latest()))
                return
            # The state captured now, as the driver does.
            self._push(s, _SeqWait(ev.stream, ev.seq))

    def launch_host_func(self, stream: int, fn: int, user_data: int) -> None:
        with self._lock:
            s = self._stream(stream, "cuLaunchHostFunc")
            call = self._host_fns.get(fn)
            if call is None:
                call = self._host_fns[fn] = _HOST_FN_TYPE(fn)
            self._push(s, lambda: call(user_data))

    # ------------------------------------------------------------------ events

    def _event(self, event: int, what: str) -> _Event:
        ev = self._events.get(event)
        if ev is None:
            raise _error(_INVALID_HANDLE, what)
        self._check_device(ev.device, what)
        return ev

    def event_create(self, ordinal: int, timing: bool = False, blocking: bool = False) -> int:
        # Every simulated synchronize sleeps on a condition: ``blocking`` changes nothing.
        with self._lock:
            self._check_device(ordinal, "cuEventCreate")
            handle = next(self._ids)
            self._events[handle] = _Event(ordinal, timing)
            return handle

    def event_destroy(self, event: int) -> None:
        with self._lock:
            ev = self._events.pop(event, None)
            if ev is None:
                raise _error(_INVALID_HANDLE, "cuEventDestroy")
            # An interprocess event's page goes when its pending records and waits are done.

    def event_record(self, event: int, stream: int) -> None:
        with self._lock:
            ev = self._event(event, "cuEventRecord")
            s = self._stream(stream, "cuEventRecord", capturable=True)
            if ev.device != s.device:
                raise _error(_INVALID_HANDLE, "cuEventRecord")
            if s.capture is not None:
                if ev.ipc is not None:
                    s.capture_ok = False
                    raise _error(_CAPTURE_UNSUPPORTED, "cuEventRecord")
                # A point in the graph being captured, not work that completes: CUDA's
                # "captured event", which a query refuses.
                ev.captured = s
                return
            ev.captured = None
            page = ev.ipc
            if page is not None:
                # Record ``number`` completes after the one before it, in whichever process
                # that was made (seen on an H200: a record made after one whose process died
                # never completed), and blocks the recording stream until then.
                number = page.next_record()
                self._push(s, _IpcWait(page, number - 1, complete=number))
            else:
                self._push(s, _Stamp(ev))
            ev.stream, ev.seq = s, s.submitted

    def _not_captured(self, ev: _Event, what: str) -> None:
        # Called with the lock held. A query or wait of a captured event is refused, and the
        # capture it belongs to (if still going) is invalidated, as on an H200.
        s = ev.captured
        if s is not None:
            if s.capture is not None:
                s.capture_ok = False
            raise _error(_CAPTURED_EVENT, what)

    def event_query(self, event: int) -> bool:
        with self._lock:
            ev = self._event(event, "cuEventQuery")
            self._not_captured(ev, "cuEventQuery")
            if ev.ipc is not None:
                return ev.ipc.reached(ev.ipc.latest())
            return ev.stream is None or ev.stream.done >= ev.seq

    def event_synchronize(self, event: int) -> None:
        with self._lock:
            ev = self._event(event, "cuEventSynchronize")
            self._not_captured(ev, "cuEventSynchronize")
            src, seq, page = ev.stream, ev.seq, ev.ipc
            if page is not None:
                # Another process's stream does not tell this simulator: look at the page
                # again and again, as a stream waiting on it does.
                target = page.latest()
                ok = self._sleep(lambda: page.reached(target), page, ev.device, polled=True)
            else:
                ok = src is None or self._sleep(lambda: src.done >= seq, src, ev.device)
            if not ok:
                raise _error(self._faults[ev.device], "cuEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        with self._lock:
            a = self._event(start, "cuEventElapsedTime")
            b = self._event(end, "cuEventElapsedTime")
            if not (a.timing and b.timing) or a.stream is None or b.stream is None:
                raise _error(_INVALID_HANDLE, "cuEventElapsedTime")
            if a.stream.done < a.seq or b.stream.done < b.seq:
                raise _error(600, "cuEventElapsedTime")  # CUDA_ERROR_NOT_READY
            return (b.stamp - a.stamp) * 1e3
