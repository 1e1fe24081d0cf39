"""External semaphore nodes in CUDA graphs on the real GPU, driven by a Vulkan producer."""

from __future__ import annotations

import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice
from tests.gpu.conftest import import_vk

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


async def test_a_vulkan_producer_drives_1000_launches_of_one_graph(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    """One graph (wait for ready, then signal done), instantiated once and launched 1,000
    times; before each launch its nodes get the frame's values. Each launch waits for the
    Vulkan producer's signal, and done carries the frame back."""
    from cuda.bindings._v2 import driver as d

    vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    ready, done = import_vk(vready, cuda), import_vk(vdone, cuda)
    async with ready, done, acs.open_stream(driver=cuda) as stream:
        graph = d.graph_create(0)  # in device 0's primary context, current here
        try:
            wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
            signal = acs.add_signal_node(graph, acs.Signal(done, 1), after=[wait])
            graph_exec = d.graph_instantiate_with_flags(graph, 0)
        finally:
            d.graph_destroy(graph)
        try:
            with anyio.fail_after(60):
                for n in range(1, 1001):
                    acs.set_wait_node(graph_exec, wait, acs.Wait(ready, n))
                    acs.set_signal_node(graph_exec, signal, acs.Signal(done, n))
                    vready.signal(n)
                    await acs.launch_graph(graph_exec, stream)
                    assert vdone.value == n
            # A launch waits for its producer: nothing passes before the signal.
            acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 1001))
            acs.set_signal_node(graph_exec, signal, acs.Signal(done, 1001))
            async with anyio.create_task_group() as tg:
                tg.start_soon(acs.launch_graph, graph_exec, stream)
                await anyio.sleep(0.1)
                assert vdone.value == 1000
                t0 = time.perf_counter()
                vready.signal(1001)
            assert vdone.value == 1001
            assert time.perf_counter() - t0 < 5
        finally:
            d.graph_exec_destroy(graph_exec)
    vready.close()
    vdone.close()
