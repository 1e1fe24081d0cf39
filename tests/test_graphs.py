"""External semaphores in graphs, on the simulated device: wait and signal nodes, their values
advanced per launch, and awaited launches."""

from __future__ import annotations

import threading
import time

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, import_sim_semaphore

pytestmark = pytest.mark.anyio


async def test_one_graph_launched_1000_times_advances_its_values(sim: SimDriver) -> None:
    """A producer thread writes frame n and signals ready = n; one graph (wait for ready,
    a kernel that checks the frame, signal done) is launched once per frame, with the values
    of its two semaphore nodes set to n before each launch."""
    frames, words = 1000, 32
    ready, producer = import_sim_semaphore(sim)
    done, watcher = import_sim_semaphore(sim)
    buffer = np.zeros(words, dtype=np.uint64)
    seen: list[int] = []
    bad: list[int] = []

    def check() -> None:
        n = int(buffer[0])
        seen.append(n)
        if not (buffer == np.arange(words, dtype=np.uint64) + n).all():
            bad.append(n)

    graph = sim.graph_create()
    wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
    kernel = sim.graph_add_kernel(graph, check, after=[wait])
    signal = acs.add_signal_node(graph, [acs.Signal(done, 1)], after=[kernel])
    graph_exec = sim.graph_instantiate(graph)
    sim.graph_destroy(graph)  # the executable copy goes on

    def produce() -> None:
        for n in range(1, frames + 1):
            if not watcher.block_until(n - 1, timeout=30):  # frame n-1 was checked
                return
            buffer[:] = np.arange(words, dtype=np.uint64) + n
            producer.signal(n)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    async with ready, done, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(60):
            for n in range(1, frames + 1):
                acs.set_wait_node(graph_exec, wait, acs.Wait(ready, n))
                acs.set_signal_node(graph_exec, signal, acs.Signal(done, n))
                await acs.launch_graph(graph_exec, stream)
                assert watcher.value == n
    thread.join(10)
    sim.graph_exec_destroy(graph_exec)
    assert seen == list(range(1, frames + 1))
    assert bad == []


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
