"""External semaphores: imports, waits and signals on streams, and their graph nodes."""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import _log
from ..._errors import CudaError
from ..._handles import lookup
from ._abi import _GRAPH_ADD_T, _GRAPH_EXEC_SET_T, _ExtSemNodeParams
from ._streams import _Streams

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._protocol import SemaphoreDesc, SemOp


__all__ = ("_Semaphores",)


class _Semaphores(_Streams):
    """External semaphores, on streams and in graphs."""

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

    # ------------------------------------------------------------------ the first wait of a device

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
