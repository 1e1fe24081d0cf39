"""Host stages: coroutines in a stream's order, between GPU work.

Each request goes through one stream in three steps, all enqueued at once:

1. a host stage receives the request's input (here: a short sleep that stands in for a network
   read) and writes it into a pinned buffer;
2. a kernel checks the input in that buffer and writes its verdict to pinned memory;
3. a host stage reads the verdict and replies (here: it prints it).

The stream runs the kernel only once the first stage has returned, and the second stage only
once the kernel has completed: ``stream.enqueue_host(receive, n)`` holds the stream with a GPU
wait on a host timeline, which the event loop releases when the coroutine returns. Nothing is
awaited between the steps; each request awaits its reply stage alone.

``--fail N`` makes request N's receive fail: its reply stage then raises ``AbandonedError``
instead of replying from a buffer that was never filled, and the other requests go on.

    python examples/host_stage.py --driver sim
    python examples/host_stage.py --driver sim --backend trio --requests 12 --fail 5

Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import sys
import time

import anyio
import numpy as np

import aiocudasem as acs
from aiocudasem.testing import SEEN, Workloads, frame_words, workloads

WORDS = 256  # uint32 words of input per request


class Buffers:
    """One pinned input buffer per worker, and one verdict slot per request."""

    def __init__(self, work: Workloads, workers: int, requests: int) -> None:
        self.work = work
        self.inputs = work.alloc_pinned(workers * WORDS * 4)
        self.verdicts = work.alloc_pinned((requests + 1) * 4)
        self.words = np.ctypeslib.as_array(
            (ctypes.c_uint32 * (workers * WORDS)).from_address(self.inputs)
        ).reshape(workers, WORDS)
        self.out = np.ctypeslib.as_array(
            (ctypes.c_uint32 * (requests + 1)).from_address(self.verdicts)
        )
        self.out[:] = 0

    def free(self) -> None:
        self.work.free_pinned(self.inputs)
        self.work.free_pinned(self.verdicts)


async def receive(buffers: Buffers, worker: int, n: int, fail: int) -> None:
    await anyio.sleep(0.002)  # stands in for reading request n from a socket
    if n == fail:
        raise ConnectionResetError(f"request {n}: the client went away")
    buffers.words[worker] = frame_words(n, WORDS)  # the kernel behind this stage reads it


async def reply(buffers: Buffers, n: int) -> str:
    verdict = int(buffers.out[n])  # written by the kernel before this stage
    return "input intact" if verdict == SEEN else f"{verdict - SEEN} words wrong"


async def serve(
    stream: acs.Stream, buffers: Buffers, worker: int, requests: range, fail: int
) -> None:
    for n in requests:
        slot = buffers.inputs + worker * WORDS * 4
        stream.enqueue_host(receive, buffers, worker, n, fail)
        buffers.work.launch_check_frame(stream.handle, slot, WORDS, n, buffers.verdicts)
        answer = stream.enqueue_host(reply, buffers, n)
        try:
            print(f"request {n}: {await answer}")
        except acs.AbandonedError as exc:
            print(f"request {n}: not answered ({exc.__cause__})")


async def main(driver_name: str | None, requests: int, workers: int, fail: int) -> None:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    work = workloads(driver)  # on a GPU, load the kernels before the first stream wait
    buffers = Buffers(work, workers, requests)
    start = time.perf_counter()
    try:
        # The streams are opened before any stage holds one: see docs/stages.md, "Rules".
        async with contextlib.AsyncExitStack() as stack:
            streams = [
                await stack.enter_async_context(acs.open_stream(driver=driver))
                for _ in range(workers)
            ]
            with anyio.fail_after(60):  # a stall fails, not hangs
                async with anyio.create_task_group() as tg:
                    for k, stream in enumerate(streams):
                        share = range(k + 1, requests + 1, workers)  # round-robin
                        tg.start_soon(serve, stream, buffers, k, share, fail)
        # The streams closed after their stages and kernels: the buffers are free to go.
    finally:
        buffers.free()
    took = time.perf_counter() - start
    print(f"{requests} requests in {took:.2f} s on driver '{driver.name}'")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Coroutines in a stream's order.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fail", type=int, default=0, help="make this request's receive fail")
    args = parser.parse_args()
    if not 1 <= args.workers <= args.requests:
        parser.error("need 1 <= --workers <= --requests")
    try:
        anyio.run(main, args.driver, args.requests, args.workers, args.fail, backend=args.backend)
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
