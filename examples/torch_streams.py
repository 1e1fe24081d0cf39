"""Await PyTorch's GPU work from asyncio without blocking the event loop.

``await acs.wait_stream(stream)`` waits for everything enqueued so far on a PyTorch stream;
``await acs.wait_event(event)`` waits for a recorded ``torch.cuda.Event``. Neither blocks a
thread or polls: while they wait, the event loop runs other tasks (here a ticker counts how
often it ran).

    python examples/torch_streams.py

Needs a CUDA GPU and torch>=2.10, whose streams speak the CUDA stream protocol
(``__cuda_stream__``); with an older torch pass the raw handle, ``stream.cuda_stream``.
"""

from __future__ import annotations

import asyncio
import time

import torch  # type: ignore[import-not-found]

import aiocudasem as acs


async def matmuls_on_a_side_stream(a: torch.Tensor, count: int) -> torch.Tensor:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # `a` was made on the current stream
    with torch.cuda.stream(stream):
        b = a
        for _ in range(count):
            b = b @ a
        finished = torch.cuda.Event()
        finished.record(stream)
    await acs.wait_event(finished)  # a torch.cuda.Event, awaited as it is
    assert finished.query()  # PyTorch agrees that the work is done
    return b


async def main() -> None:
    n = 4096
    a = torch.full((n, n), 1.0 / n, device="cuda")  # a @ a == a: easy to check
    # 1. Everything enqueued so far on PyTorch's current stream, in one await.
    b = a @ a
    await acs.wait_stream(torch.cuda.current_stream())
    print(f"current stream done: {torch.cuda.current_stream().query()}")

    # 2. Four side streams at once, each awaited through its event; the loop stays free.
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    start = time.perf_counter()
    async with asyncio.timeout(60):
        results = await asyncio.gather(*(matmuls_on_a_side_stream(b, 50) for _ in range(4)))
    took = time.perf_counter() - start
    tick_task.cancel()
    if not all(torch.allclose(r, a) for r in results):
        raise RuntimeError("a side stream computed a wrong result")
    print(f"4 side streams done in {took * 1e3:.0f} ms; the loop ticked {ticks} times meanwhile")
    print("done")


if __name__ == "__main__":
    asyncio.run(main())
