"""Hand frames from a producer thread to the GPU on trio, and stop waiting for a late frame.

As in asyncio_handoff.py, a producer thread sets the timeline semaphore ``ready`` to n once
frame n is ready, and consumer tasks hand their frames to the GPU, each on its own stream. The
consumers run in a nursery under ``trio.fail_after``. Then a consumer waits for one more frame,
which comes late: ``trio.move_on_after`` stops the waiting. Cancelling abandons only the
observation: the GPU wait and the signal back stay enqueued, and the stream goes on once the
frame arrives.

    python examples/trio_handoff.py --driver sim

On the GPU (``--driver cuda``) the producer is a Vulkan semaphore; on ``sim`` it is the
simulator's. Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable

import trio

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
        with trio.fail_after(30):  # a stall fails instead of hanging
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, produce, ready_p, frames)
                for k in range(consumers):
                    share = range(k + 1, frames + 1, consumers)  # frames k+1, k+1+K, ...
                    nursery.start_soon(consume, streams[k], ready, dones[k], share)
        late = frames + 1
        with trio.move_on_after(0.1) as scope:
            await consume(streams[0], ready, dones[0], range(late, late + 1))
        print(f"frame {late} late: stopped waiting for it (cancelled: {scope.cancelled_caught})")
        ready_p.signal(late)  # it arrives after all: the GPU wait completes...
        with trio.fail_after(5):
            await streams[0].wait_complete()  # ...and the stream signalled done behind it
        print(f"frame {late} arrived; the stream went on and signalled done = {done_ps[0].value}")
    print(f"all {late} frames handed back on driver '{driver.name}'")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Producer-to-GPU hand-offs on trio.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--consumers", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.consumers <= args.frames:
        parser.error("need 1 <= --consumers <= --frames")
    try:
        trio.run(main, args.driver, args.frames, args.consumers)
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
    except trio.TooSlowError as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
