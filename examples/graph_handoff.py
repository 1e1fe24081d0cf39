"""One CUDA graph, launched once per frame, waits for a producer and signals back.

A producer thread signals the timeline semaphore ``ready`` once frame n is ready. The graph is
made once: a wait node (``ready >= n``), the frame's work, and a signal node (``done = n``).
Before each launch the two semaphore nodes get frame n's values; then the launch is awaited,
without blocking the event loop.

    python examples/graph_handoff.py --driver sim
    python examples/graph_handoff.py --driver sim --backend trio --capture

By default the graph is built node by node (add_wait_node, the work, add_signal_node). With
``--capture`` it is captured from a stream instead: a hand-off section enqueued on a capturing
stream becomes the same two nodes around the work, and wait_nodes()/signal_nodes() find them.

The frame's work: on the simulated device, a kernel that checks the frame; on the GPU
(``--driver cuda``, with a Vulkan producer), a copy of the frame from pinned memory to the
device and back into a second pinned buffer, which is checked after each launch. Without
``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
import threading
import time
from typing import Any

import anyio
import numpy as np

import aiocudasem as acs
from aiocudasem.testing import SimDriver
from aiocudasem.vulkan import VulkanDevice

WORDS = 1024  # the frame's 32-bit words


def import_timeline(producer: Any, driver: acs.Driver) -> acs.ExternalSemaphore:
    fd = producer.export_fd()
    try:
        return acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=driver)
    except BaseException:
        os.close(fd)  # the driver takes the fd only if the import succeeds
        raise


async def main(driver_name: str | None, frames: int, capture: bool) -> None:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    sim = driver if isinstance(driver, SimDriver) else None
    async with contextlib.AsyncExitStack() as stack:
        ready_p: Any  # the producer's side: a simulated or a Vulkan timeline semaphore
        done_p: Any
        if sim is not None:
            ready_p, done_p = sim.create_semaphore(), sim.create_semaphore()
        else:
            vk = stack.enter_context(VulkanDevice.open(uuid=driver.device_uuid(0)))
            ready_p, done_p = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        ready = await stack.enter_async_context(import_timeline(ready_p, driver))
        done = await stack.enter_async_context(import_timeline(done_p, driver))
        frame = Frames(driver, stack)  # freed after the stream has closed
        stream = await stack.enter_async_context(acs.open_stream(driver=driver))

        # Make the graph once. It stays until the end: its nodes are set before each launch,
        # and CUDA names them by their handles in the graph.
        graph_api: Any = sim if sim is not None else CudaGraphs()
        if capture:
            graph_api.begin_capture(stream.handle)
            try:
                async with stream.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                    frame.enqueue_work(stream.handle)
            finally:
                graph = graph_api.end_capture(stream.handle)
            stack.callback(graph_api.graph_destroy, graph)
            [wait] = acs.wait_nodes(graph, driver=driver)
            [signal] = acs.signal_nodes(graph, driver=driver)
        else:
            graph = graph_api.graph_create()
            stack.callback(graph_api.graph_destroy, graph)
            wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
            work = frame.add_work(graph, after=[wait])
            signal = acs.add_signal_node(graph, acs.Signal(done, 1), after=[work])
        graph_exec = graph_api.graph_instantiate(graph)
        stack.callback(graph_api.graph_exec_destroy, graph_exec)

        stop = threading.Event()

        def produce() -> None:
            for n in range(1, frames + 1):
                while not done_p.block_until(n - 1, timeout=0.1):  # frame n-1 was taken
                    if stop.is_set():
                        return
                frame.write(n)  # "render" frame n
                ready_p.signal(n)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            start = time.perf_counter()
            with anyio.fail_after(60):  # a stall fails, not hangs
                for n in range(1, frames + 1):
                    acs.set_wait_node(graph_exec, wait, acs.Wait(ready, n))
                    acs.set_signal_node(graph_exec, signal, acs.Signal(done, n))
                    await acs.launch_graph(graph_exec, stream)
                    if done_p.value != n:
                        raise RuntimeError(f"frame {n}: done is {done_p.value}")
                    frame.check(n)
            took = time.perf_counter() - start
        finally:
            stop.set()  # before the semaphores and the Vulkan device go
            producer.join()
            if ready_p.value < frames:
                # Stopped early: release a launch that still waits, so that nothing is left
                # blocked on the GPU while the buffers and semaphores are freed.
                ready_p.signal(frames)
    how = "captured" if capture else "built"
    print(f"{frames} launches of one {how} graph in {took:.2f} s on driver '{driver.name}'")


class Frames:
    """The frame buffer the producer writes, and the graph's work on it: a kernel node that
    checks the frame (simulated device), or copies of it through device memory (GPU)."""

    def __init__(self, driver: acs.Driver, stack: contextlib.AsyncExitStack) -> None:
        self.sim = driver if isinstance(driver, SimDriver) else None
        self.checked: list[int] = []
        self.current = 0
        if self.sim is None:
            from cuda.bindings._v2 import driver as d

            self.d = d
            self.src = d.mem_host_alloc(WORDS * 4, 0)
            stack.callback(d.mem_free_host, self.src)
            self.out = d.mem_host_alloc(WORDS * 4, 0)
            stack.callback(d.mem_free_host, self.out)
            self.dev = d.mem_alloc_v2(WORDS * 4)
            stack.callback(d.mem_free_v2, self.dev)
            self.source = np.ctypeslib.as_array((ctypes.c_uint32 * WORDS).from_address(self.src))
            self.result = np.ctypeslib.as_array((ctypes.c_uint32 * WORDS).from_address(self.out))

    def write(self, n: int) -> None:
        if self.sim is not None:
            self.current = n
        else:
            self.source[:] = np.arange(WORDS, dtype=np.uint32) + n

    def _kernel(self) -> None:
        self.checked.append(self.current)

    def enqueue_work(self, stream: int) -> None:
        if self.sim is not None:
            self.sim.launch(stream, self._kernel)
        else:
            self.d.memcpy_htod_async_v2(self.dev, self.src, WORDS * 4, stream)
            self.d.memcpy_dtoh_async_v2(self.out, self.dev, WORDS * 4, stream)

    def add_work(self, graph: int, after: list[int]) -> int:
        if self.sim is not None:
            return self.sim.graph_add_kernel(graph, self._kernel, after=after)
        # On the GPU, the copies go into a graph of their own, captured, as a child node.
        capturing = self.d.stream_create(1)
        try:
            self.d.stream_begin_capture_v2(capturing, int(self.d.StreamCaptureMode.RELAXED))
            try:
                self.enqueue_work(capturing)
            finally:
                child = self.d.stream_end_capture(capturing)
            try:
                return int(self.d.graph_add_child_graph_node(graph, after, len(after), child))
            finally:
                self.d.graph_destroy(child)
        finally:
            self.d.stream_destroy_v2(capturing)

    def check(self, n: int) -> None:
        if self.sim is not None:
            if self.checked[-1:] != [n]:
                raise RuntimeError(f"frame {n}: the launch's kernel saw frame {self.checked}")
        elif not (self.result == np.arange(WORDS, dtype=np.uint32) + n).all():
            raise RuntimeError(f"frame {n}: the launch copied another frame")


class CudaGraphs:
    """The few graph calls of cuda-bindings this example makes, under the simulated
    device's names."""

    def __init__(self) -> None:
        from cuda.bindings._v2 import driver as d

        self.d = d

    def graph_create(self) -> int:
        return int(self.d.graph_create(0))

    def graph_instantiate(self, graph: int) -> int:
        return int(self.d.graph_instantiate_with_flags(graph, 0))

    def graph_destroy(self, graph: int) -> None:
        self.d.graph_destroy(graph)

    def graph_exec_destroy(self, graph_exec: int) -> None:
        self.d.graph_exec_destroy(graph_exec)

    def begin_capture(self, stream: int) -> None:
        self.d.stream_begin_capture_v2(stream, int(self.d.StreamCaptureMode.GLOBAL))

    def end_capture(self, stream: int) -> int:
        return int(self.d.stream_end_capture(stream))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="One graph, launched per frame.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--capture", action="store_true", help="capture the graph from a hand-off section"
    )
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("need --frames >= 1")
    try:
        anyio.run(main, args.driver, args.frames, args.capture, backend=args.backend)
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
    except TimeoutError as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
