"""Hand frames from a producer thread to the GPU, on asyncio.

A producer thread (a camera, a renderer) sets the timeline semaphore ``ready`` to n once frame
n is ready. Each consumer coroutine owns a CUDA stream. For each of its frames the stream
waits, on the GPU, for ``ready >= n``, runs the frame's kernel and sets the consumer's ``done``
semaphore to n (telling the producer that the frame's buffer may be reused). The coroutine
resumes once the stream is past that signal; no thread blocks while it waits.

    python examples/asyncio_handoff.py --driver sim

On the GPU (``--driver cuda``) the producer is a Vulkan semaphore; on ``sim`` it is the
simulator's. Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable

import aiocudasem as acs
from aiocudasem.testing import SimDriver, SimProducer, workloads
from aiocudasem.vulkan import VulkanDevice, VulkanSemaphore

Producer = SimProducer | VulkanSemaphore  # the producer's side of a timeline semaphore
Sem = acs.ExternalSemaphore


def import_timeline(producer: Producer, driver: acs.Driver) -> Sem:
    fd = producer.export_fd()
    try:
        return acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=driver)
    except BaseException:
        os.close(fd)  # the driver takes the fd only if the import succeeds
        raise


def produce(ready: Producer, frames: int) -> None:
    for n in range(1, frames + 1):
        time.sleep(0.002)  # "render" frame n
        ready.signal(n)


async def consume(stream: acs.Stream, ready: Sem, done: Sem, frames: range) -> None:
    for n in frames:
        async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
            workloads(stream.driver).launch_spin(stream.handle, 500_000)  # stands in for yours
        print(f"frame {n} done")


async def main(driver_name: str | None, frames: int, consumers: int) -> None:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    workloads(driver)  # on a GPU, load the kernels before the first semaphore wait
    start = time.perf_counter()
    # The stack closes in reverse: streams (after their work) before the semaphores they use.
    async with contextlib.AsyncExitStack() as stack:
        new_producer: Callable[[], Producer]
        if isinstance(driver, SimDriver):
            new_producer = driver.create_semaphore
        else:
            vk = stack.enter_context(VulkanDevice.open(uuid=driver.device_uuid(0)))
            new_producer = vk.create_timeline_semaphore
        ready_p, done_ps = new_producer(), [new_producer() for _ in range(consumers)]
        ready = await stack.enter_async_context(import_timeline(ready_p, driver))
        dones = [await stack.enter_async_context(import_timeline(p, driver)) for p in done_ps]
        streams = [
            await stack.enter_async_context(acs.open_stream(driver=driver))
            for _ in range(consumers)
        ]
        shares = [range(k + 1, frames + 1, consumers) for k in range(consumers)]  # round-robin
        async with asyncio.timeout(30), asyncio.TaskGroup() as tg:  # a stall fails, not hangs
            tg.create_task(asyncio.to_thread(produce, ready_p, frames))
            for k in range(consumers):
                tg.create_task(consume(streams[k], ready, dones[k], shares[k]))
        # Each consumer resumed only after its stream had signalled `done`: the producer sees it.
        if [p.value for p in done_ps] != [share[-1] for share in shares]:
            raise RuntimeError("a done semaphore is behind its consumer")
    took = time.perf_counter() - start
    print(f"all {frames} frames handed back in {took:.2f} s on driver '{driver.name}'")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Producer-to-GPU hand-offs on asyncio.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--consumers", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.consumers <= args.frames:
        parser.error("need 1 <= --consumers <= --frames")
    try:
        asyncio.run(main(args.driver, args.frames, args.consumers))
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
    except TimeoutError as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
