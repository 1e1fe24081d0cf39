"""External semaphore nodes in CUDA graphs on the real GPU, driven by a Vulkan producer."""

from __future__ import annotations

import ctypes
import threading
import time

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem._workloads import frame_words, workloads
from aiocudasem.vulkan import VulkanDevice
from tests.gpu.conftest import import_vk, run_script

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
        except BaseException:
            d.graph_destroy(graph)
            raise
        # The graph stays until the end: its node handles name the nodes to set.
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
            # Once the graph is gone, its nodes cannot be set (the driver says
            # CUDA_ERROR_INVALID_VALUE), and the message says why.
            d.graph_destroy(graph)
            graph = 0
            with pytest.raises(acs.CudaError, match="keep the graph"):
                acs.set_wait_node(graph_exec, wait, acs.Wait(ready, 1002))
        finally:
            d.graph_exec_destroy(graph_exec)
            if graph:
                d.graph_destroy(graph)
    vready.close()
    vdone.close()


async def test_a_vulkan_producer_drives_1000_launches_of_one_captured_graph(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    """A hand-off section captured on a stream (global capture mode, the strictest), around
    two copies: the Vulkan producer's frame from pinned memory to the device and back into
    another pinned buffer. wait_nodes()/signal_nodes() find the captured nodes; each of 1,000
    launches gets its frame's values, and the copy it made is checked against the frame, so
    a launch that ran its copies before the producer's signal shows up as the previous
    frame's data."""
    from cuda.bindings._v2 import driver as d

    frames, words = 1000, 4096
    nbytes = words * 4
    work = workloads(cuda)
    vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    ready, done = import_vk(vready, cuda), import_vk(vdone, cuda)
    src, out = work.alloc_pinned(nbytes), work.alloc_pinned(nbytes)
    source = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(src))
    result = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(out))
    graph = graph_exec = 0
    try:
        async with ready, done, acs.open_stream(driver=cuda) as stream:
            h = stream.handle
            dev = d.mem_alloc_v2(nbytes)
            try:
                d.stream_begin_capture_v2(h, int(d.StreamCaptureMode.GLOBAL))
                try:
                    with anyio.fail_after(10):
                        async with stream.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                            d.memcpy_htod_async_v2(dev, src, nbytes, h)
                            d.memcpy_dtoh_async_v2(out, dev, nbytes, h)
                finally:
                    graph = d.stream_end_capture(h)
                assert graph
                assert not cuda.stream_capturing(h)
                [wait] = acs.wait_nodes(graph, driver=cuda)
                [signal] = acs.signal_nodes(graph, driver=cuda)
                graph_exec = d.graph_instantiate_with_flags(graph, 0)
                assert vdone.value == 0  # captured, not run

                def produce() -> None:
                    for n in range(1, frames + 1):
                        if not vdone.block_until(n - 1, timeout=30):
                            return
                        source[:] = frame_words(n, words)
                        vready.signal(n)

                thread = threading.Thread(target=produce, daemon=True)
                thread.start()
                try:
                    with anyio.fail_after(120):
                        for n in range(1, frames + 1):
                            acs.set_wait_node(graph_exec, wait, acs.Wait(ready, n))
                            acs.set_signal_node(graph_exec, signal, acs.Signal(done, n))
                            await acs.launch_graph(graph_exec, stream)
                            assert vdone.value == n
                            assert (result == frame_words(n, words)).all(), f"frame {n}"
                finally:
                    thread.join(30)
            finally:
                await stream.wait_complete()
                d.mem_free_v2(dev)
    finally:
        if graph_exec:
            d.graph_exec_destroy(graph_exec)
        if graph:
            d.graph_destroy(graph)
        work.free_pinned(src)
        work.free_pinned(out)
        vready.close()
        vdone.close()


async def test_awaiting_a_capturing_stream_is_a_typed_error(cuda: acs.Driver) -> None:
    from cuda.bindings._v2 import driver as d

    async with acs.open_stream(driver=cuda) as stream:
        d.stream_begin_capture_v2(stream.handle, int(d.StreamCaptureMode.RELAXED))
        with pytest.raises(acs.CudaError, match="capturing a CUDA graph") as info:
            await stream.wait_complete()
        assert info.value.status == 900
        with pytest.raises(d.DriverError):
            d.stream_end_capture(stream.handle)  # invalidated by the query
        await stream.wait_complete()


async def test_adopting_a_capturing_stream_leaves_the_capture_intact(cuda: acs.Driver) -> None:
    """What a PyTorch or CuPy capture does: the library meets the capturing stream first as
    a foreign one. Finding its device must not invalidate the capture (cuStreamGetDevice
    would)."""
    from cuda.bindings._v2 import driver as d

    async with acs.open_stream(driver=cuda) as owner:
        d.stream_begin_capture_v2(owner.handle, int(d.StreamCaptureMode.GLOBAL))
        try:
            adopted = acs.Stream.adopt(owner.handle, driver=cuda)
            assert adopted.device == 0
            assert cuda.stream_capturing(owner.handle)
            assert int(d.stream_is_capturing(owner.handle)) == 1  # active, not invalidated
        finally:
            graph = d.stream_end_capture(owner.handle)
        assert graph
        d.graph_destroy(graph)
        adopted.close()


_FIRST_WAIT_CAPTURED = """
import anyio, aiocudasem as acs
from cuda.bindings._v2 import driver as d
from aiocudasem._workloads import workloads
from aiocudasem.vulkan import VulkanDevice

d.init(0)
ctx = d.device_primary_ctx_retain(d.device_get(0))
d.ctx_set_current(ctx)
raw = d.stream_create(1)  # a stream the library has not seen, as PyTorch's would be

async def main():
    cuda = acs.get_driver("cuda")
    work = workloads(cuda)  # its kernels load before the device's first wait: a hook
    with VulkanDevice.open(uuid=cuda.device_uuid(0)) as vk:
        vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        kind = acs.HandleType.TIMELINE_SEMAPHORE_FD
        ready = acs.import_semaphore(kind, vready.export_fd(), driver=cuda)
        done = acs.import_semaphore(kind, vdone.export_fd(), driver=cuda)
        async with ready, done:
            # The process's first semaphore wait is captured, on a stream adopted during the
            # capture: finding its device and the first-wait hooks must leave the capture
            # intact (a module load or cuStreamGetDevice would invalidate it).
            d.stream_begin_capture_v2(raw, int(d.StreamCaptureMode.GLOBAL))
            stream = acs.Stream.adopt(raw, driver=cuda)
            async with stream.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                pass
            assert int(d.stream_is_capturing(raw)) == 1, "the capture was invalidated"
            graph = d.stream_end_capture(raw)
            assert 0 not in work._kernels, "a hook ran during the capture"
            graph_exec = d.graph_instantiate_with_flags(graph, 0)
            vready.signal(1)
            with anyio.fail_after(30):
                await acs.launch_graph(graph_exec, stream)  # runs the hooks first
            assert 0 in work._kernels, "the launch did not run the hooks"
            assert vdone.value == 1
            d.graph_exec_destroy(graph_exec)
            d.graph_destroy(graph)
            stream.close()
        vready.close()
        vdone.close()
    print("ok")

anyio.run(main)
d.stream_destroy_v2(raw)
"""


def test_a_process_whose_first_wait_is_captured_on_an_adopted_stream() -> None:
    proc = run_script(_FIRST_WAIT_CAPTURED)
    assert proc.stdout.strip().endswith("ok")


async def test_awaiting_the_capturing_per_thread_stream_leaves_the_capture_intact(
    cuda: acs.Driver,
) -> None:
    """The per-thread default stream can capture, and its await records an event first
    (querying it would be CUDA_ERROR_CAPTURED_EVENT): the library asks before it records."""
    from cuda.bindings._v2 import driver as d

    per_thread = acs.Stream.adopt(2, driver=cuda)
    d.stream_begin_capture_v2(2, int(d.StreamCaptureMode.RELAXED))
    try:
        with pytest.raises(acs.CudaError, match="capture is intact") as info:
            await per_thread.wait_complete()
        assert info.value.status == 900
    finally:
        graph = d.stream_end_capture(2)  # not invalidated
    d.graph_destroy(graph)
    await per_thread.wait_complete()


async def test_awaiting_an_event_recorded_in_capture_is_a_typed_error(cuda: acs.Driver) -> None:
    from cuda.bindings._v2 import driver as d

    async with acs.open_stream(driver=cuda) as stream:
        d.stream_begin_capture_v2(stream.handle, int(d.StreamCaptureMode.RELAXED))
        event = stream.record()  # a captured event
        with pytest.raises(acs.CudaError, match="recorded on a stream that was capturing") as ex:
            await event.wait()
        assert ex.value.status == 907
        with pytest.raises(d.DriverError):
            d.stream_end_capture(stream.handle)
        event.close()


async def test_a_cuda_core_graph_builder_captures_a_handoff(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    """cuda.core builds graphs by stream capture: a hand-off on the adopted builder becomes
    its semaphore nodes, launch_graph() takes the cuda.core Graph, and each launch's values
    come from Graph.update() with a builder captured the same way (cuda.core does not expose
    the builder's CUgraph, which set_wait_node() would need)."""
    core = pytest.importorskip("cuda.core")
    dev = core.Device(0)
    dev.set_current()
    vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    ready, done = import_vk(vready, cuda), import_vk(vdone, cuda)

    async def build(n: int) -> object:
        builder = dev.create_graph_builder().begin_building()
        captured = acs.Stream.adopt(builder, driver=cuda)
        async with captured.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
            pass
        builder.end_building()
        return builder

    async with ready, done, acs.open_stream(driver=cuda) as stream:
        first = await build(1)
        graph = first.complete()  # type: ignore[attr-defined]
        try:
            for n in range(1, 51):
                if n > 1:
                    builder = await build(n)
                    graph.update(builder)
                    builder.close()  # type: ignore[attr-defined]
                vready.signal(n)
                with anyio.fail_after(10):
                    await acs.launch_graph(graph, stream)
                assert vdone.value == n
        finally:
            graph.close()
            first.close()  # type: ignore[attr-defined]
    vready.close()
    vdone.close()
