"""External semaphores in graphs, on the simulated device: wait and signal nodes, their values
advanced per launch, and awaited launches."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, import_sim_semaphore

pytestmark = pytest.mark.anyio


class _Frames:
    """A producer thread that writes frame n into a buffer and signals ``ready`` = n once the
    frame before it is done, a kernel that checks the frame, and the loop that launches one
    executable graph per frame with its two semaphore nodes set to n."""

    def __init__(self, sim: SimDriver, frames: int = 1000, words: int = 32) -> None:
        self.frames, self.words = frames, words
        self.ready, self.producer = import_sim_semaphore(sim)
        self.done, self.watcher = import_sim_semaphore(sim)
        self.buffer = np.zeros(words, dtype=np.uint64)
        self.seen: list[int] = []
        self.bad: list[int] = []

    def _frame(self, n: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
        return np.arange(self.words, dtype=np.uint64) + n

    def check(self) -> None:
        n = int(self.buffer[0])
        self.seen.append(n)
        if not (self.buffer == self._frame(n)).all():
            self.bad.append(n)

    def _produce(self) -> None:
        for n in range(1, self.frames + 1):
            if not self.watcher.block_until(n - 1, timeout=30):  # frame n-1 was checked
                return
            self.buffer[:] = self._frame(n)
            self.producer.signal(n)

    async def launch_all(self, graph_exec: int, wait: int, signal: int, stream: acs.Stream) -> None:
        thread = threading.Thread(target=self._produce, daemon=True)
        thread.start()
        with anyio.fail_after(60):
            for n in range(1, self.frames + 1):
                acs.set_wait_node(graph_exec, wait, acs.Wait(self.ready, n))
                acs.set_signal_node(graph_exec, signal, acs.Signal(self.done, n))
                await acs.launch_graph(graph_exec, stream)
                assert self.watcher.value == n
        thread.join(10)
        assert self.seen == list(range(1, self.frames + 1))
        assert self.bad == []


async def test_one_graph_launched_1000_times_advances_its_values(sim: SimDriver) -> None:
    """A producer thread writes frame n and signals ready = n; one graph (wait for ready,
    a kernel that checks the frame, signal done) is launched once per frame, with the values
    of its two semaphore nodes set to n before each launch."""
    f = _Frames(sim)
    graph = sim.graph_create()
    wait = acs.add_wait_node(graph, acs.Wait(f.ready, 1))
    kernel = sim.graph_add_kernel(graph, f.check, after=[wait])
    signal = acs.add_signal_node(graph, [acs.Signal(f.done, 1)], after=[kernel])
    graph_exec = sim.graph_instantiate(graph)  # the graph stays: its nodes are set below
    async with f.ready, f.done, acs.open_stream(driver=sim) as stream:
        await f.launch_all(graph_exec, wait, signal, stream)
    sim.graph_exec_destroy(graph_exec)
    sim.graph_destroy(graph)


async def test_the_nodes_of_a_destroyed_graph_cannot_be_set(sim: SimDriver) -> None:
    """An executable graph outlives its graph and still launches, but its nodes are named by
    their handles in the graph: once the graph is gone they cannot be set (as on a GPU)."""
    ready, producer = import_sim_semaphore(sim)
    graph = sim.graph_create()
    wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
    graph_exec = sim.graph_instantiate(graph)
    acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 2))  # while the graph exists
    acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 1))
    sim.graph_destroy(graph)
    async with ready, acs.open_stream(driver=sim) as stream:
        with pytest.raises(acs.CudaError, match="keep the graph") as info:
            acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 2))
        assert info.value.status == 1  # CUDA_ERROR_INVALID_VALUE
        producer.signal(1)
        with anyio.fail_after(10):
            await acs.launch_graph(graph_exec, stream)  # with the values it had
    sim.graph_exec_destroy(graph_exec)


async def test_a_launch_keeps_the_values_it_was_launched_with(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, watcher = import_sim_semaphore(sim)
    graph = sim.graph_create()
    wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
    signal = acs.add_signal_node(graph, acs.Signal(done, 1), after=[wait])
    graph_exec = sim.graph_instantiate(graph)
    async with ready, done, acs.open_stream(driver=sim) as stream:
        sim.graph_launch(graph_exec, stream.handle)  # waits for ready >= 1, signals done = 1
        acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 5))
        acs.set_signal_node(graph_exec, signal, acs.Signal(done, 5))
        async with anyio.create_task_group() as tg:
            tg.start_soon(acs.launch_graph, graph_exec, stream)  # waits for ready >= 5
            await anyio.sleep(0.05)
            producer.signal(1)  # the first launch goes on; the second does not
            deadline = time.monotonic() + 10
            while watcher.value != 1 and time.monotonic() < deadline:
                await anyio.sleep(0.005)
            assert watcher.value == 1
            await anyio.sleep(0.05)
            assert not stream.query()
            producer.signal(5)
        assert watcher.value == 5


async def test_nodes_are_checked_as_stream_entries_are(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    other_sem, _ = import_sim_semaphore(SimDriver())
    graph = sim.graph_create()
    async with ready, other_sem, acs.create_host_timeline(driver=sim) as timeline:
        with pytest.raises(TypeError, match="host timeline cannot be a graph node"):
            acs.add_wait_node(graph, acs.Wait(timeline, 1))
        with pytest.raises(acs.DeviceMismatchError):
            acs.add_wait_node(graph, [acs.Wait(ready, 1), acs.Wait(other_sem, 1)])
        with pytest.raises(TypeError, match=r"takes aiocudasem\.Wait entries"):
            acs.add_wait_node(graph, acs.Signal(ready, 1))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at least one"):
            acs.add_signal_node(graph, [])
        with pytest.raises(TypeError, match="handle"):
            acs.add_wait_node("graph", acs.Wait(ready, 1))
        with pytest.raises(ValueError, match="non-null"):
            acs.add_wait_node(0, acs.Wait(ready, 1))
        with pytest.raises(TypeError, match="sequence"):
            acs.add_wait_node(graph, acs.Wait(ready, 1), after=5)  # type: ignore[arg-type]
        with pytest.raises(acs.CudaError):  # a node the graph does not have
            acs.add_wait_node(graph, acs.Wait(ready, 1), after=[12345])
        with pytest.raises(acs.CudaError):  # a graph that does not exist
            acs.add_wait_node(987654, acs.Wait(ready, 1))
        wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
        signal = acs.add_signal_node(graph, acs.Signal(ready, 1), after=[wait])
        graph_exec = sim.graph_instantiate(graph)
        with pytest.raises(acs.CudaError):  # a signal node is not a wait node
            acs.set_wait_node(graph_exec, signal, acs.Wait(ready, 2))
        with pytest.raises(acs.CudaError):  # the node keeps its number of semaphores
            acs.set_wait_node(graph_exec, wait, [acs.Wait(ready, 2), acs.Wait(ready, 3)])
        async with acs.open_stream(driver=sim) as stream:
            with pytest.raises(TypeError, match=r"aiocudasem\.Stream"):
                await acs.launch_graph(graph_exec, stream.handle)  # type: ignore[arg-type]
            with pytest.raises(acs.CudaError):
                await acs.launch_graph(987654, stream)
    with pytest.raises(anyio.ClosedResourceError):  # the semaphore was closed
        acs.add_wait_node(graph, _closed_wait(sim))


def _closed_wait(sim: SimDriver) -> acs.Wait:
    sem, _ = import_sim_semaphore(sim)
    entry = acs.Wait(sem, 1)
    sem.close()
    return entry


async def test_a_launch_on_a_stream_of_another_device_is_refused(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)  # device 0
    graph = sim.graph_create()
    acs.add_wait_node(graph, acs.Wait(ready, 1))
    graph_exec = sim.graph_instantiate(graph)
    async with ready, acs.open_stream(1, driver=sim) as stream:
        with pytest.raises(acs.CudaError):
            await acs.launch_graph(graph_exec, stream)


async def test_launches_of_one_executable_graph_are_ordered_across_streams(sim: SimDriver) -> None:
    """CUDA orders each launch of an executable graph behind its previous launches."""
    ready, producer = import_sim_semaphore(sim)
    ran: list[str] = []
    graph = sim.graph_create()
    wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
    sim.graph_add_kernel(graph, lambda: ran.append("k"), after=[wait])
    graph_exec = sim.graph_instantiate(graph)
    async with ready, acs.open_stream(driver=sim) as s1, acs.open_stream(driver=sim) as s2:
        sim.graph_launch(graph_exec, s1.handle)  # blocked on ready >= 1
        acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 0))
        sim.graph_launch(graph_exec, s2.handle)
        await anyio.sleep(0.05)
        assert ran == [] and not s2.query()
        producer.signal(1)
        with anyio.fail_after(10):
            await s2.wait_complete()
        assert ran == ["k", "k"]


@pytest.mark.parametrize("bad", [3.0, "4096", b"1", np.float64(4096.0)])
async def test_a_handle_is_not_parsed_from_a_str_or_truncated_from_a_float(
    sim: SimDriver, bad: object
) -> None:
    ready, _ = import_sim_semaphore(sim)
    graph = sim.graph_create()
    node = acs.add_wait_node(graph, acs.Wait(ready, 1))
    async with ready:
        with pytest.raises(TypeError, match="handle"):
            acs.add_wait_node(bad, acs.Wait(ready, 1))
        with pytest.raises(TypeError, match="handle"):
            acs.add_wait_node(graph, acs.Wait(ready, 1), after=[bad])
        with pytest.raises(acs.CudaError):  # CUDA: no duplicate dependencies
            acs.add_wait_node(graph, acs.Wait(ready, 1), after=[node, node])


# ---------------------------------------------------------------------- stream capture


async def test_a_captured_handoff_drives_1000_launches_of_one_graph(sim: SimDriver) -> None:
    """A hand-off section on a capturing stream becomes the graph's wait and signal nodes,
    around the kernel captured inside it; wait_nodes()/signal_nodes() find them, and each of
    1,000 launches gets its frame's values and checks its frame."""
    f = _Frames(sim)
    async with f.ready, f.done, acs.open_stream(driver=sim) as stream:
        sim.begin_capture(stream.handle)
        with anyio.fail_after(5):  # the exit does not wait: nothing runs during capture
            async with stream.handoff(acs.Wait(f.ready, 1), acs.Signal(f.done, 1)):
                sim.launch(stream.handle, f.check)
        graph = sim.end_capture(stream.handle)
        assert f.seen == [] and f.watcher.value == 0  # captured, not run
        [wait] = acs.wait_nodes(graph, driver=sim)
        [signal] = acs.signal_nodes(graph, driver=sim)
        graph_exec = sim.graph_instantiate(graph)
        await f.launch_all(graph_exec, wait, signal, stream)
    sim.graph_exec_destroy(graph_exec)
    sim.graph_destroy(graph)


async def test_captured_enqueues_become_nodes_in_order(sim: SimDriver) -> None:
    a, _ = import_sim_semaphore(sim)
    b, _ = import_sim_semaphore(sim)
    async with a, b, acs.open_stream(driver=sim) as stream:
        assert not sim.stream_capturing(stream.handle)
        sim.begin_capture(stream.handle)
        assert sim.stream_capturing(stream.handle)
        stream.enqueue_wait(acs.Wait(a, 1))
        stream.enqueue_wait(acs.Wait(a, 2), acs.Wait(b, 3))  # one node, two semaphores
        stream.enqueue_signal(acs.Signal(b, 4))
        graph = sim.end_capture(stream.handle)
        assert not sim.stream_capturing(stream.handle)
        waits = acs.wait_nodes(graph, driver=sim)
        assert len(waits) == 2 and waits[0] < waits[1]  # the order of capture
        assert len(acs.signal_nodes(graph, driver=sim)) == 1
        graph_exec = sim.graph_instantiate(graph)
        with pytest.raises(acs.CudaError, match="another number of semaphores"):
            acs.set_wait_node(graph_exec, waits[1], acs.Wait(a, 5))
        acs.set_wait_node(graph_exec, waits[1], [acs.Wait(a, 5), acs.Wait(b, 6)])
        sim.graph_exec_destroy(graph_exec)
        sim.graph_destroy(graph)
        await stream.wait_complete()  # the stream ran nothing of it


async def test_awaiting_a_capturing_stream_says_why_it_cannot(sim: SimDriver) -> None:
    """An await of a capturing stream cannot complete (nothing on it runs until a launch):
    a typed error that says so, not a hang. The query invalidates the capture, as on a GPU."""
    async with acs.open_stream(driver=sim) as stream:
        sim.begin_capture(stream.handle)
        with pytest.raises(acs.CudaError, match="capturing a CUDA graph") as info:
            await stream.wait_complete()
        assert info.value.status == 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        with pytest.raises(acs.CudaError) as ended:
            sim.end_capture(stream.handle)
        assert ended.value.status == 901  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        await stream.wait_complete()  # usable again


async def test_a_host_timeline_is_refused_in_capture_before_anything_is_enqueued(
    sim: SimDriver,
) -> None:
    ready, _ = import_sim_semaphore(sim)
    timeline = acs.create_host_timeline(driver=sim)
    async with ready, timeline, acs.open_stream(driver=sim) as stream:
        sim.begin_capture(stream.handle)
        with pytest.raises(acs.UnsupportedFeatureError, match="captured"):
            stream.enqueue_wait(acs.Wait(ready, 1), acs.Wait(timeline, 1))
        with pytest.raises(acs.UnsupportedFeatureError, match="captured"):
            async with stream.handoff(acs.Wait(timeline, 1), acs.Signal(ready, 2)):
                pass
        graph = sim.end_capture(stream.handle)  # still valid, and empty
        assert acs.wait_nodes(graph, driver=sim) == []
        assert acs.signal_nodes(graph, driver=sim) == []
        sim.graph_destroy(graph)


async def test_a_handoff_whose_body_raises_in_capture_still_captures_its_signals(
    sim: SimDriver,
) -> None:
    ready, _ = import_sim_semaphore(sim)
    done, _ = import_sim_semaphore(sim)
    async with ready, done, acs.open_stream(driver=sim) as stream:
        sim.begin_capture(stream.handle)
        with pytest.raises(RuntimeError, match="body"):
            async with stream.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                raise RuntimeError("body")
        graph = sim.end_capture(stream.handle)
        assert len(acs.wait_nodes(graph, driver=sim)) == 1
        assert len(acs.signal_nodes(graph, driver=sim)) == 1
        sim.graph_destroy(graph)


async def test_node_lookup_checks_its_graph(sim: SimDriver) -> None:
    with pytest.raises(TypeError, match="handle"):
        acs.wait_nodes("graph", driver=sim)
    with pytest.raises(acs.CudaError):
        acs.signal_nodes(987654, driver=sim)
    with pytest.raises(TypeError, match="driver"):
        acs.wait_nodes(4096, driver=42)  # type: ignore[arg-type]


def test_the_simulator_refuses_what_it_cannot_capture(sim: SimDriver) -> None:
    with pytest.raises(acs.CudaError) as info:
        sim.begin_capture(0)  # the legacy default stream
    assert info.value.status == 900
    stream = sim.stream_create(0, True, 0)
    with pytest.raises(acs.CudaError):
        sim.end_capture(stream)  # not capturing
    sim.begin_capture(stream)
    with pytest.raises(acs.CudaError) as info:
        sim.begin_capture(stream)  # capturing already: refused, the capture left as it was
    assert info.value.status == 401
    sim.launch(stream, lambda: None)
    with pytest.raises(acs.CudaError) as info:
        sim.launch_host_func(stream, 0, 0)  # not capturable here: refused, and invalidates
    assert info.value.status == 900
    with pytest.raises(acs.CudaError) as info:
        sim.launch(stream, lambda: None)  # capturable, but the capture is invalidated
    assert info.value.status == 901
    assert sim.stream_device(stream) == 0  # still answered
    with pytest.raises(acs.CudaError):
        sim.end_capture(stream)
    assert sim.stream_query(stream)  # capture over: an ordinary stream again
    sim.stream_destroy(stream)


def test_a_captured_event_cannot_be_queried(sim: SimDriver) -> None:
    stream = sim.stream_create(0, True, 0)
    event = sim.event_create(0)
    sim.begin_capture(stream)
    sim.event_record(event, stream)  # a point in the graph
    with pytest.raises(acs.CudaError) as info:
        sim.event_query(event)
    assert info.value.status == 907
    with pytest.raises(acs.CudaError):
        sim.end_capture(stream)  # the query invalidated the capture
    with pytest.raises(acs.CudaError) as info:
        sim.event_synchronize(event)  # still captured: last recorded in capture
    assert info.value.status == 907
    sim.event_record(event, stream)  # recorded again, outside capture
    sim.event_synchronize(event)
    assert sim.event_query(event)
    sim.event_destroy(event)
    sim.stream_destroy(stream)


async def test_awaiting_an_event_recorded_in_capture_says_why_it_cannot(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        sim.begin_capture(stream.handle)
        event = stream.record()
        with pytest.raises(acs.CudaError, match="recorded on a stream that was capturing") as info:
            await event.wait()
        assert info.value.status == 907
        with pytest.raises(acs.CudaError):
            sim.end_capture(stream.handle)
        event.close()


def test_a_fault_during_capture_ends_it_with_the_fault(sim: SimDriver) -> None:
    stream = sim.stream_create(0, True, 0)
    sim.begin_capture(stream)
    sim.inject_fault(0)
    with pytest.raises(acs.DeviceFaultError):
        sim.end_capture(stream)
    with pytest.raises(acs.DeviceFaultError):
        sim.stream_capturing(stream)


async def test_a_stream_adopted_during_its_capture_keeps_it(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    async with ready, acs.open_stream(driver=sim) as owner:
        sim.begin_capture(owner.handle)
        adopted = acs.Stream.adopt(owner.handle, driver=sim)
        assert adopted.device == 0
        adopted.enqueue_wait(acs.Wait(ready, 1))
        graph = sim.end_capture(owner.handle)  # not invalidated
        assert len(acs.wait_nodes(graph, driver=sim)) == 1
        sim.graph_destroy(graph)
        adopted.close()
