"""Await CuPy's GPU work from asyncio or trio without blocking the event loop.

``await acs.wait_stream(stream)`` waits for everything enqueued so far on a CuPy stream;
``await acs.wait_event(event)`` waits for a recorded ``cupy.cuda.Event``. Neither blocks a
thread or polls: while they wait, the event loop runs other tasks.

    python examples/cupy_streams.py [--backend trio]

Needs a CUDA GPU and CuPy>=14, whose streams speak the CUDA stream protocol
(``__cuda_stream__``); with an older CuPy pass the raw handle, ``stream.ptr``.
"""

from __future__ import annotations

import argparse

import anyio
import cupy as cp  # type: ignore[import-not-found]

import aiocudasem as acs


async def doubled_sum_on_a_side_stream(x: cp.ndarray, results: list[int]) -> None:
    stream = cp.cuda.Stream(non_blocking=True)
    # `x` was made on the current stream: this one must wait for it, on the GPU.
    stream.wait_event(cp.cuda.get_current_stream().record())
    with stream:
        total = (x * 2).sum()
        finished = stream.record()  # a cupy.cuda.Event
    await acs.wait_event(finished)  # awaited as it is
    assert finished.done  # CuPy agrees that the work is done
    results.append(int(total))  # computed already: this only copies 8 bytes back


async def main() -> None:
    n = 1 << 24
    x = cp.arange(n, dtype=cp.int64)
    # 1. Everything enqueued so far on CuPy's current stream, in one await.
    await acs.wait_stream(cp.cuda.get_current_stream())
    print(f"current stream done: {cp.cuda.get_current_stream().done}")

    # 2. Four side streams at once, each awaited through its event.
    results: list[int] = []
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(doubled_sum_on_a_side_stream, x, results)
    if results != [n * (n - 1)] * 4:
        raise RuntimeError(f"wrong sums: {results}")
    print(f"4 side streams done: each summed 2 * arange({n}) = {results[0]}")
    print("done")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Await CuPy's GPU work.")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    anyio.run(main, backend=parser.parse_args().backend)
