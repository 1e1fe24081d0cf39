"""External semaphores in CUDA graphs: wait and signal nodes, their values per launch, and an
awaitable launch.

A graph is CUDA's (``CUgraph``) and so is its executable form (``CUgraphExec``): make them with
the bindings or by stream capture (cuda.core's ``GraphBuilder`` included), and pass them here as
raw handles or as objects that carry one (``.handle``). The node helpers add semaphore nodes to
a graph built node by node; each takes the same :class:`Wait` and :class:`Signal` entries as a
stream, checked the same way. A stream capture turns the waits and signals enqueued on the
capturing stream (hand-off sections included) into the same nodes; :func:`wait_nodes` and
:func:`signal_nodes` find them.

A node is named by its handle in the graph, so the graph must outlive every
:func:`set_wait_node`/:func:`set_signal_node` on its executable graph: CUDA refuses the node of
a destroyed graph.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from ._checks import resolve_driver
from ._driver import Driver
from ._entries import Signal, Wait, driver_label, entry_list
from ._errors import CudaError, DeviceMismatchError
from ._semaphore import ExternalSemaphore
from ._stream import Stream, expect_stream

__all__ = (
    "add_signal_node",
    "add_wait_node",
    "launch_graph",
    "set_signal_node",
    "set_wait_node",
    "signal_nodes",
    "wait_nodes",
)

_U64 = 1 << 64
_INVALID_VALUE = 1  # CUDA_ERROR_INVALID_VALUE


def _handle(obj: object, what: str) -> int:
    """A raw ``CUgraph``/``CUgraphExec``/``CUgraphNode`` handle from an int, or from an object
    with ``.handle`` (cuda.core) or ``__int__`` (cuda-bindings' handle types)."""
    raw = getattr(obj, "handle", obj)
    if isinstance(raw, bool):
        raise TypeError(f"{what} must be a handle (an int), not bool")
    if not isinstance(raw, int):
        refused = TypeError(
            f"{what} must be a handle (an int) or an object with .handle, not {type(obj).__name__}"
        )
        # Only a handle type's __int__ (cuda-bindings' CUgraph...): str and bytes have none
        # (int() would parse them), and a float's would truncate it into some address.
        if not hasattr(type(raw), "__int__") or (
            isinstance(raw, numbers.Number) and not isinstance(raw, numbers.Integral)
        ):
            raise refused
        try:
            raw = int(raw)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise refused from None
    if not 0 < raw < _U64:
        raise ValueError(f"{what} is {raw}: a handle is a non-null pointer in (0, 2**64)")
    return raw


def _driver(entries: tuple[Wait, ...] | tuple[Signal, ...]) -> Driver:
    """The one driver of the entries' semaphores: external semaphores only."""
    first = entries[0].semaphore
    for e in entries:
        sem = e.semaphore
        if not isinstance(sem, ExternalSemaphore):
            raise TypeError(
                "graph nodes take external semaphores; a host timeline cannot be a graph node "
                "yet: enqueue it on a stream instead"
            )
        sem.handle  # noqa: B018 - a semaphore closed since its entry was made raises here
        if sem.driver is not first.driver:
            raise DeviceMismatchError(
                f"{sem!r} belongs to {driver_label(sem.driver, first.driver)}, another entry to "
                f"{driver_label(first.driver, sem.driver)}: one node takes one driver's "
                "semaphores"
            )
    return first.driver


def _dependencies(after: Sequence[object]) -> list[int]:
    if isinstance(after, (str, bytes)) or not isinstance(after, Sequence):
        raise TypeError("after must be a sequence of graph nodes")
    return [_handle(node, "a node in after") for node in after]


def add_wait_node(
    graph: object, waits: Wait | Sequence[Wait], *, after: Sequence[object] = ()
) -> int:
    """Add a node to ``graph`` that waits on external semaphores, like
    :meth:`Stream.enqueue_wait` (``cuGraphAddExternalSemaphoresWaitNode``), after the nodes in
    ``after``. Returns the node's handle, for ``after`` of later nodes and for
    :func:`set_wait_node`.

    ``waits`` is one :class:`Wait` or a list or tuple of them, checked as for a stream.
    Raises ``TypeError`` for a host timeline's entry (not a graph node yet), a bad handle or
    entry, :class:`DeviceMismatchError` for semaphores of two drivers, and
    :class:`CudaError` if the driver refuses (a destroyed graph, an unknown node in
    ``after``)."""
    entries = entry_list("add_wait_node() waits", (waits,), Wait)
    return _add_node(graph, entries, after, signal=False)


def add_signal_node(
    graph: object, signals: Signal | Sequence[Signal], *, after: Sequence[object] = ()
) -> int:
    """Add a node to ``graph`` that signals external semaphores, like
    :meth:`Stream.enqueue_signal` (``cuGraphAddExternalSemaphoresSignalNode``), after the
    nodes in ``after``; returns the node's handle. Raises as :func:`add_wait_node` does."""
    entries = entry_list("add_signal_node() signals", (signals,), Signal)
    return _add_node(graph, entries, after, signal=True)


def _add_node(
    graph: object,
    entries: tuple[Wait, ...] | tuple[Signal, ...],
    after: Sequence[object],
    *,
    signal: bool,
) -> int:
    drv = _driver(entries)
    return drv.graph_add_semaphore_node(
        _handle(graph, "graph"), _dependencies(after), [e._op() for e in entries], signal
    )


def set_wait_node(graph_exec: object, node: object, waits: Wait | Sequence[Wait]) -> None:
    """Give a wait node of an executable graph new entries (new timeline values, typically)
    for its later launches (``cuGraphExecExternalSemaphoresWaitNodeSetParams``). A launch
    already enqueued keeps the values it was launched with. The node keeps its number of
    semaphores, and its graph must still exist. Raises as :func:`add_wait_node` does, and
    :class:`CudaError` for a node that is not a wait node of that graph, a different number
    of entries, or a graph destroyed already."""
    entries = entry_list("set_wait_node() waits", (waits,), Wait)
    _set_node(graph_exec, node, entries, signal=False)


def _set_node(
    graph_exec: object,
    node: object,
    entries: tuple[Wait, ...] | tuple[Signal, ...],
    *,
    signal: bool,
) -> None:
    drv = _driver(entries)
    try:
        drv.graph_exec_set_semaphore_node(
            _handle(graph_exec, "graph_exec"),
            _handle(node, "node"),
            [e._op() for e in entries],
            signal,
        )
    except CudaError as exc:
        if exc.status != _INVALID_VALUE:
            raise
        kind = "signal" if signal else "wait"
        raise exc._explained(
            f"the node is not a {kind} node of the graph that graph_exec was instantiated "
            f"from, it has another number of semaphores than {len(entries)}, or that graph "
            "was destroyed (keep the graph while you set its executable graph's nodes)"
        ) from None


def set_signal_node(graph_exec: object, node: object, signals: Signal | Sequence[Signal]) -> None:
    """Give a signal node of an executable graph new entries for its later launches
    (``cuGraphExecExternalSemaphoresSignalNodeSetParams``). Raises as :func:`set_wait_node`
    does."""
    entries = entry_list("set_signal_node() signals", (signals,), Signal)
    _set_node(graph_exec, node, entries, signal=True)


def wait_nodes(graph: object, *, driver: Driver | str | None = None) -> list[int]:
    """The graph's external semaphore wait nodes, in the order ``cuGraphGetNodes`` lists them:
    the order they were added or captured (so on an H200 and in the simulator; CUDA does not
    document it). For a captured graph these are the captured waits, hand-off sections'
    included, whose values :func:`set_wait_node` advances per launch. Nodes inside a child
    graph node are not included. ``driver`` is the graph's driver (None: the default one).
    Raises ``TypeError`` for a handle of the wrong type, ``ValueError`` for a null or
    out-of-range one, and :class:`CudaError` for a graph the driver does not know."""
    return resolve_driver(driver).graph_semaphore_nodes(_handle(graph, "graph"), False)


def signal_nodes(graph: object, *, driver: Driver | str | None = None) -> list[int]:
    """The graph's external semaphore signal nodes, in the graph's order; see
    :func:`wait_nodes`."""
    return resolve_driver(driver).graph_semaphore_nodes(_handle(graph, "graph"), True)


async def launch_graph(graph_exec: object, stream: Stream) -> None:
    """Launch the executable graph on ``stream`` (``cuGraphLaunch``) and wait until the launch,
    and everything enqueued on the stream before it, has completed, as
    :meth:`Stream.wait_complete` does. A checkpoint; cancelling abandons the wait only: the
    launch runs. Raises ``TypeError`` for a bad handle or a stream that is not a
    :class:`Stream`, ``anyio.ClosedResourceError`` for a closed stream, and
    :class:`CudaError` if the driver refuses the launch."""
    stream = expect_stream(stream, "launch_graph()")
    stream.driver.graph_launch(_handle(graph_exec, "graph_exec"), stream.handle)
    await stream.wait_complete()
