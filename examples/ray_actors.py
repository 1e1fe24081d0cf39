"""Ray async actors that await their GPU work with aiocudasem, each serving other calls meanwhile.

Each actor owns a CUDA stream, pinned buffers and a host timeline ``go``. ``check(frame,
data)`` takes a frame as a numpy array (Ray moves it, from whichever host the caller is on),
copies it into pinned memory and, in a wait-only hand-off section, makes its stream wait on the
GPU for ``go >= frame`` before a kernel checks the frame's words. The method then awaits the
stream: the actor's event loop is free, and the actor serves ``release(frame)``, the call that
sets ``go`` (once ``check`` has enqueued its work) and lets the GPU go on. Were the loop
blocked, ``check`` would never return. The caller also sees ``check`` still running while its
GPU work waits, and gets back how many other calls the actor served during it and how many
words were wrong (frame 2 is sent with one word damaged).

    python examples/ray_actors.py --driver sim      # no GPU needed
    python examples/ray_actors.py --driver cuda     # each actor on a share of a GPU

Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``). It starts a local Ray
instance; ``--address`` joins an existing cluster instead, whose nodes all need aiocudasem.

What crosses hosts is only what Ray moves: plain values and arrays, here the frame's words in
and the counts out. aiocudasem's objects do not: a stream, an event, an external semaphore or a
host timeline belongs to one process on one host, and each actor makes its own in its own
process. Of them, only interprocess events and host timelines reach another process, and only
on the same host (docs/processes.md). So an actor's GPU work is awaited where it runs, and
what other actors, or the caller, learn of it is the value its method returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import sys
import time
from typing import Any

import numpy as np
import ray

import aiocudasem as acs
from aiocudasem.testing import SEEN, frame_words, workloads

WORDS = 1024  # words per frame
SLOTS = 64  # frames an actor can check: frame numbers are in [1, SLOTS)


class GpuWorker:
    """One actor: its own stream, pinned buffers and host timeline, made on its first call."""

    def __init__(self, name: str, driver: str) -> None:
        self.name, self.driver_name = name, driver
        self.served = 0  # calls served other than check()
        self.lock = asyncio.Lock()  # one frame at a time through the pinned buffers
        self.stack = contextlib.AsyncExitStack()
        self.stream: acs.Stream | None = None
        self.enqueued: dict[int, asyncio.Event] = {}  # frame -> its GPU work is enqueued

    async def _open(self) -> acs.Stream:
        if self.stream is None:
            driver = acs.get_driver(self.driver_name)
            self.work = workloads(driver)  # on a GPU, load the kernels before the first wait
            self.go = await self.stack.enter_async_context(acs.create_host_timeline(driver=driver))
            self.src = self.work.alloc_pinned(4 * WORDS)
            self.out = self.work.alloc_pinned(4 * SLOTS)
            ctypes.memset(self.out, 0, 4 * SLOTS)
            self.stream = await self.stack.enter_async_context(acs.open_stream(driver=driver))
        return self.stream

    @ray.method  # typed: the handle's check.remote() takes check's arguments
    async def check(self, frame: int, data: np.ndarray[Any, np.dtype[np.uint32]]) -> dict[str, Any]:
        """Check ``data`` as frame ``frame`` on the GPU, once ``release(frame)`` lets it go."""
        if not 0 < frame < SLOTS or data.shape != (WORDS,) or data.dtype != np.uint32:
            raise ValueError(f"frame must be in [1, {SLOTS}) and data {WORDS} uint32 words")
        async with self.lock:
            stream = await self._open()
            ctypes.memmove(self.src, data.ctypes.data, data.nbytes)
            served = self.served
            # A wait-only section: the GPU waits for go >= frame, then runs the kernels; the
            # exit awaits them without blocking the loop, and signals nothing back.
            async with stream.handoff(acs.Wait(self.go, frame), []):
                self.work.launch_spin(stream, 2_000_000)  # 2 ms of other GPU work
                self.work.launch_check_frame(stream, self.src, WORDS, frame, self.out)
                self._enqueued(frame).set()
            seen = ctypes.c_uint32.from_address(self.out + 4 * frame).value
        return {
            "actor": self.name,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id()[:8],
            "frame": frame,
            "wrong": seen - SEEN,
            "served": self.served - served,
        }

    @ray.method
    async def release(self, frame: int) -> None:
        """Let the GPU go on to frame ``frame``: served while ``check()`` awaits."""
        await self._enqueued(frame).wait()  # check(frame) got as far as its GPU wait
        del self.enqueued[frame]
        self.served += 1
        self.go.signal(frame)

    def _enqueued(self, frame: int) -> asyncio.Event:
        return self.enqueued.setdefault(frame, asyncio.Event())

    @ray.method
    async def close(self) -> None:
        """Close the stream (after its work) and the timeline, then free the buffers."""
        async with self.lock:
            if self.stream is not None:
                await self.stack.aclose()
                self.work.free_pinned(self.src)
                self.work.free_pinned(self.out)
                self.stream = None


def main(driver: str, actors: int, frames: int, address: str | None) -> None:
    if address is None:
        ray.init(num_cpus=2, include_dashboard=False)
    else:
        ray.init(address=address)
    try:
        # The actors are placed by Ray; on a GPU, each asks for a share of one.
        gpus = 1 / actors if driver == "cuda" else 0
        if gpus and ray.cluster_resources().get("GPU", 0) == 0:  # type: ignore[no-untyped-call]
            raise RuntimeError("Ray sees no GPU in this cluster (--driver sim needs none)")
        actor = ray.remote(GpuWorker).options(num_gpus=gpus)
        workers = [actor.remote(f"actor {k}", driver) for k in range(actors)]
        try:
            for frame in range(1, frames + 1):
                words = frame_words(frame, WORDS)
                if frame == 2:
                    words[7] ^= 1  # one damaged word, for the GPU to find
                checks = [w.check.remote(frame, words) for w in workers]
                # The GPU work waits for go: no check can have returned yet.
                done, _ = ray.wait(checks, num_returns=len(checks), timeout=0.2)
                if done:
                    raise RuntimeError("a check returned before its frame was released")
                # Each actor serves release() while its check() awaits the GPU.
                ray.get([w.release.remote(frame) for w in workers], timeout=60)
                for r in ray.get(checks, timeout=60):
                    print(
                        f"{r['actor']} (pid {r['pid']}, node {r['node']}): frame {r['frame']} "
                        f"checked, {r['wrong']} wrong words; served {r['served']} other call "
                        "while its GPU work ran"
                    )
        finally:
            ray.get([w.close.remote() for w in workers], timeout=60)
    finally:
        ray.shutdown()
    print(f"{actors} actors checked {frames} frames each on driver '{driver}'")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Ray async actors awaiting GPU work.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--address", default=None, help="a Ray cluster to join")
    args = parser.parse_args()
    if not 1 <= args.frames < SLOTS or args.actors < 1:
        parser.error(f"need 1 <= --frames < {SLOTS} and --actors >= 1")
    driver = args.driver or os.environ.get("AIOCUDASEM_DRIVER") or "cuda"
    start = time.perf_counter()
    try:
        main(driver, args.actors, args.frames, args.address)
    except (RuntimeError, ray.exceptions.RayError) as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
    print(f"took {time.perf_counter() - start:.1f} s")
