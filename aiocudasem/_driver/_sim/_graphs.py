"""Graphs on the simulated device: built by hand or by stream capture, instantiated, their
semaphore nodes set, launched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._devices import _Devices
from ._model import _Node
from ._status import _INVALID_HANDLE, _INVALID_VALUE, _error
from ._steps import _SeqWait, _signals, _waits

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .._protocol import SemOp
    from ._steps import _Step


class _Graphs(_Devices):
    def graph_create(self) -> int:
        """Create an empty graph (``cuGraphCreate``) and return its handle: where a program
        on the GPU gets one from CUDA (cuda.core, the bindings, stream capture), a test on the
        simulated device gets one here."""
        with self._lock:
            handle = next(self._ids)
            self._graphs[handle] = []
            return handle

    def graph_add_kernel(
        self, graph: int, fn: Callable[[], None], after: Sequence[int] = ()
    ) -> int:
        """Add a simulated kernel node that runs ``fn`` (as :meth:`launch` does) after the
        nodes ``after``; return the node's handle."""
        if not callable(fn):
            raise TypeError(f"fn must be a callable, not {type(fn).__name__}")
        with self._lock:
            nodes = self._graph(graph, "cuGraphAddKernelNode")
            self._check_dependencies(nodes, after, "cuGraphAddKernelNode")
            return self._add_node(nodes, _Node("kernel", fn=fn))

    def graph_instantiate(self, graph: int) -> int:
        """Instantiate the graph (``cuGraphInstantiate``): an executable copy of its nodes,
        whose semaphore nodes :meth:`graph_exec_set_semaphore_node` may change."""
        with self._lock:
            nodes = self._graph(graph, "cuGraphInstantiate")
            handle = next(self._ids)
            self._execs[handle] = {n.handle: n.copy() for n in nodes}
            self._exec_graphs[handle] = graph
            return handle

    def _graph(self, graph: int, what: str) -> list[_Node]:
        nodes = self._graphs.get(graph) if isinstance(graph, int) else None
        if nodes is None:
            raise _error(_INVALID_HANDLE, what)
        return nodes

    def _check_dependencies(self, nodes: list[_Node], after: Sequence[int], what: str) -> None:
        known = {n.handle for n in nodes}
        if any(d not in known for d in after) or len(set(after)) != len(after):
            raise _error(_INVALID_VALUE, what)

    def _add_node(self, nodes: list[_Node], node: _Node) -> int:
        # Called with the lock held. Nodes run in the order they were added, which is an order
        # that honours every dependency (a node depends only on nodes added before it).
        node.handle = next(self._ids)
        nodes.append(node)
        return node.handle

    def _check_sems(self, ops: Sequence[SemOp], what: str) -> None:
        if not ops or any(op.sem not in self._sems for op in ops):
            raise _error(_INVALID_VALUE, what)

    def graph_add_semaphore_node(
        self, graph: int, dependencies: Sequence[int], ops: Sequence[SemOp], signal: bool
    ) -> int:
        what = f"cuGraphAddExternalSemaphores{'Signal' if signal else 'Wait'}Node"
        with self._lock:
            nodes = self._graph(graph, what)
            self._check_dependencies(nodes, dependencies, what)
            self._check_sems(ops, what)
            return self._add_node(nodes, _Node("signal" if signal else "wait", ops=list(ops)))

    def graph_exec_set_semaphore_node(
        self, graph_exec: int, node: int, ops: Sequence[SemOp], signal: bool
    ) -> None:
        kind = "signal" if signal else "wait"
        what = f"cuGraphExecExternalSemaphores{kind.title()}NodeSetParams"
        with self._lock:
            nodes = self._execs.get(graph_exec) if isinstance(graph_exec, int) else None
            if nodes is None:
                raise _error(_INVALID_HANDLE, what)
            target = nodes.get(node)
            if target is None or target.kind != kind or len(target.ops) != len(ops):
                raise _error(_INVALID_VALUE, what)  # another node, or another count
            if self._exec_graphs[graph_exec] not in self._graphs:
                # The node is named by its handle in the graph, which went with the graph (a
                # GPU refuses it too: seen on an H200).
                raise _error(_INVALID_VALUE, what)
            self._check_sems(ops, what)
            target.ops = list(ops)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        with self._lock:
            nodes = self._execs.get(graph_exec) if isinstance(graph_exec, int) else None
            if nodes is None:
                raise _error(_INVALID_HANDLE, "cuGraphLaunch")
            s = self._stream(stream, "cuGraphLaunch")
            # The parameters of this launch are those set before it.
            steps: list[Callable[[], None] | _Step] = []
            for node in nodes.values():
                if node.kind == "kernel":
                    assert node.fn is not None
                    steps.append(self._kernel(s, node.fn))
                    continue
                for op in node.ops:
                    if self._sem_devices.get(op.sem) != s.device:
                        raise _error(_INVALID_HANDLE, "cuGraphLaunch")
                resolved = [(self._sems[op.sem], op) for op in node.ops]
                steps.append(_signals(resolved) if node.kind == "signal" else _waits(resolved))
            last = self._exec_last.get(graph_exec)
            if last is not None and last[0] is not s:
                steps.insert(0, _SeqWait(*last))
            for step in steps:
                self._push(s, step)
            self._exec_last[graph_exec] = (s, s.submitted)

    def graph_semaphore_nodes(self, graph: int, signal: bool) -> list[int]:
        kind = "signal" if signal else "wait"
        with self._lock:
            return [n.handle for n in self._graph(graph, "cuGraphGetNodes") if n.kind == kind]

    def graph_destroy(self, graph: int) -> None:
        """Destroy a graph (``cuGraphDestroy``); its executable copies go on, but their nodes
        can no longer be set: the graph's node handles went with it."""
        with self._lock:
            if self._graphs.pop(graph, None) is None:
                raise _error(_INVALID_HANDLE, "cuGraphDestroy")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        """Destroy an executable graph (``cuGraphExecDestroy``); launches already enqueued
        still run."""
        with self._lock:
            if self._execs.pop(graph_exec, None) is None:
                raise _error(_INVALID_HANDLE, "cuGraphExecDestroy")
            del self._exec_graphs[graph_exec]
            self._exec_last.pop(graph_exec, None)
