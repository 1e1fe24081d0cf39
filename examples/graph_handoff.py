"""One CUDA graph, launched once per frame, waits for a producer and signals back.

A producer thread signals the timeline semaphore ``ready`` once frame n is ready. The graph is
built once: a wait node (``ready >= n``), the frame's work, and a signal node (``done = n``).
Before each launch the two semaphore nodes get frame n's values; then the launch is awaited,
without blocking the event loop.

    python examples/graph_handoff.py --driver sim
    python examples/graph_handoff.py --driver sim --backend trio

On the simulated device the frame's work is a kernel node that checks the frame; on the GPU
(``--driver cuda``, with a Vulkan producer) the graph holds the two semaphore nodes only, made
with cuda-bindings (cuda.core's graph builders or a stream capture would add the kernels).
Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from typing import Any

import anyio

import aiocudasem as acs
from aiocudasem.testing import SimDriver
from aiocudasem.vulkan import VulkanDevice


def import_timeline(producer: Any, driver: acs.Driver) -> acs.ExternalSemaphore:
    fd = producer.export_fd()
    try:
        return acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=driver)
    except BaseException:
        os.close(fd)  # the driver takes the fd only if the import succeeds
        raise


async def main(driver_name: str | None, frames: int) -> None:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    frame = [0]  # the producer's "buffer": the number of the frame in it
    checked: list[int] = []
    async with contextlib.AsyncExitStack() as stack:
        ready_p: Any  # the producer's side: a simulated or a Vulkan timeline semaphore
        done_p: Any
        if isinstance(driver, SimDriver):
            ready_p, done_p = driver.create_semaphore(), driver.create_semaphore()
        else:
            vk = stack.enter_context(VulkanDevice.open(uuid=driver.device_uuid(0)))
            ready_p, done_p = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        ready = await stack.enter_async_context(import_timeline(ready_p, driver))
        done = await stack.enter_async_context(import_timeline(done_p, driver))
        stream = await stack.enter_async_context(acs.open_stream(driver=driver))

        # Build the graph once.
        if isinstance(driver, SimDriver):
            graph = driver.graph_create()
            wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
            work = driver.graph_add_kernel(graph, lambda: checked.append(frame[0]), after=[wait])
            signal = acs.add_signal_node(graph, acs.Signal(done, 1), after=[work])
            graph_exec = driver.graph_instantiate(graph)
            driver.graph_destroy(graph)
            stack.callback(driver.graph_exec_destroy, graph_exec)
        else:
            from cuda.bindings._v2 import driver as d

            graph = d.graph_create(0)
            wait = acs.add_wait_node(graph, acs.Wait(ready, 1))
            signal = acs.add_signal_node(graph, acs.Signal(done, 1), after=[wait])
            graph_exec = d.graph_instantiate_with_flags(graph, 0)
            d.graph_destroy(graph)
            stack.callback(d.graph_exec_destroy, graph_exec)

        def produce() -> None:
            for n in range(1, frames + 1):
                if not done_p.block_until(n - 1, timeout=30):  # frame n-1 was taken
                    return
                frame[0] = n  # "render" frame n
                ready_p.signal(n)

        threading.Thread(target=produce, daemon=True).start()
        start = time.perf_counter()
        with anyio.fail_after(60):  # a stall fails, not hangs
            for n in range(1, frames + 1):
                acs.set_wait_node(graph_exec, wait, acs.Wait(ready, n))
                acs.set_signal_node(graph_exec, signal, acs.Signal(done, n))
                await acs.launch_graph(graph_exec, stream)
                if done_p.value != n:
                    raise RuntimeError(f"frame {n}: done is {done_p.value}")
        took = time.perf_counter() - start
        if isinstance(driver, SimDriver) and checked != list(range(1, frames + 1)):
            raise RuntimeError("a launch ran its kernel on the wrong frame")
    print(f"{frames} launches of one graph in {took:.2f} s on driver '{driver.name}'")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="One graph, launched per frame.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("need --frames >= 1")
    try:
        anyio.run(main, args.driver, args.frames, backend=args.backend)
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
    except TimeoutError as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
