"""A Vulkan producer hands frames to CUDA through timeline semaphores, checked on the GPU.

The producer thread writes frame n into one of a few pinned buffers, then submits an empty
batch to Vulkan's queue that sets the timeline semaphore ``ready`` to n, as a renderer's frame
submission would. A coroutine hands each frame to CUDA: the stream waits for ``ready >= n``, a
kernel checks every word of the frame, and the stream sets ``done`` to n. Before it reuses a
buffer the producer waits for ``done`` to reach the frame that used it last. Every frame must
be seen by the GPU exactly once and intact: a hand-off out of order would show.

    python examples/vulkan_producer.py --frames 240

Needs an NVIDIA GPU with its Vulkan driver and libvulkan.so.1 (see docs/vulkan.md).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import anyio
import numpy as np

import aiocudasem as acs
from aiocudasem.testing import SEEN, frame_words, workloads
from aiocudasem.vulkan import VulkanDevice, VulkanSemaphore

BUFFERS, WORDS = 3, 4096  # frames in flight, uint32 words per frame


def import_timeline(vk_sem: VulkanSemaphore, driver: acs.Driver) -> acs.ExternalSemaphore:
    fd = vk_sem.export_fd()
    try:
        return acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=driver)
    except BaseException:
        os.close(fd)  # the driver takes the fd only if the import succeeds
        raise


def produce(
    ready: VulkanSemaphore, done: VulkanSemaphore, buffers: np.ndarray, frames: int
) -> None:
    for n in range(1, frames + 1):
        if n > BUFFERS and not done.block_until(n - BUFFERS, timeout=10):
            raise RuntimeError(f"CUDA never handed frame {n - BUFFERS} back")
        buffers[n % BUFFERS] = frame_words(n, WORDS)  # "render" frame n
        ready.submit_signal(n)  # a queue submission that signals ready = n


async def main(frames: int) -> None:
    driver = acs.get_driver("cuda")
    work = workloads(driver)  # before the first semaphore wait, so its kernels load first
    buf_ptr = work.alloc_pinned(BUFFERS * WORDS * 4)
    out_ptr = work.alloc_pinned((frames + 1) * 4)  # per frame: SEEN + its wrong words
    buffers = np.ctypeslib.as_array((ctypes.c_uint32 * (BUFFERS * WORDS)).from_address(buf_ptr))
    out = np.ctypeslib.as_array((ctypes.c_uint32 * (frames + 1)).from_address(out_ptr))
    out[:] = 0
    with VulkanDevice.open(uuid=driver.device_uuid(0)) as vk:  # the same GPU as CUDA's
        print(f"producer: Vulkan on {vk.name}")
        vk_ready, vk_done = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        ready, done = import_timeline(vk_ready, driver), import_timeline(vk_done, driver)
        async with ready, done, acs.open_stream(driver=driver) as stream:
            with anyio.fail_after(60):  # a lost signal fails instead of hanging
                async with anyio.create_task_group() as tg:
                    job = vk_ready, vk_done, buffers.reshape(BUFFERS, WORDS), frames
                    tg.start_soon(anyio.to_thread.run_sync, produce, *job)
                    for n in range(1, frames + 1):
                        src = buf_ptr + (n % BUFFERS) * WORDS * 4
                        async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                            work.launch_check_frame(stream.handle, src, WORDS, n, out_ptr)
        vk.block_until_idle()
    bad = [n for n in range(1, frames + 1) if int(out[n]) != SEEN]
    if bad:
        raise RuntimeError(f"{len(bad)} frames failed the check, the first is frame {bad[0]}")
    # Freed only after success: on a failure, freeing could wait for GPU work that never ends.
    work.free_pinned(buf_ptr)
    work.free_pinned(out_ptr)
    print(f"all {frames} frames verified on the GPU")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A Vulkan producer handing frames to CUDA.")
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    try:
        anyio.run(main, args.frames, backend=args.backend)
    except (acs.AiocudasemError, RuntimeError, TimeoutError) as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
