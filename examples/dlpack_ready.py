"""Await the pending GPU work behind an array that exposes no stream: ``await acs.ready(x)``.

``ready()`` hands a private stream to the array's ``__dlpack__(stream=...)``; the producing
library makes that stream wait for the array's pending work, and the await ends once the
stream has passed that point. No thread blocks and nothing polls: while it waits, the event
loop runs other tasks (here a ticker counts them). Afterwards the producer's own event, recorded
after the work, must read complete.

    python examples/dlpack_ready.py --producer sim
    python examples/dlpack_ready.py --producer torch --backend trio

``--producer torch`` and ``cupy`` need a CUDA GPU (and torch or CuPy); ``sim`` runs anywhere,
with an array of the simulated device whose ``__dlpack__`` does what a GPU library's does.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio

import aiocudasem as acs
from aiocudasem.testing import SimDriver

WORK_S = 0.2  # the simulated producer's pending work


class SimArray:
    """An array of the simulated device that a kernel on ``stream`` is still writing. Its
    ``__dlpack__(stream=s)`` makes ``s`` wait for that kernel, as PyTorch's and CuPy's do."""

    def __init__(self, sim: SimDriver, stream: int) -> None:
        self.sim, self.stream = sim, stream
        self.written = False
        sim.launch(stream, self._write)

    def _write(self) -> None:
        time.sleep(WORK_S)
        self.written = True

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        if stream is not None and stream != -1:
            event = self.sim.event_create(0)
            self.sim.event_record(event, self.stream)
            self.sim.stream_wait_event(stream, event)
            self.sim.event_destroy(event)
        return object()  # stands for the DLPack capsule, which ready() does not use


def torch_work() -> tuple[Any, Callable[[], bool], Any]:
    import torch  # type: ignore[import-not-found]

    a = torch.rand(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        b = a
        for _ in range(60):
            b = b @ a
        after = torch.cuda.Event()
        after.record(side)
    # PyTorch orders the work of its *current* stream: call ready() with `side` current.
    return b, after.query, lambda: torch.cuda.stream(side)


def cupy_work() -> tuple[Any, Callable[[], bool], Any]:
    import cupy as cp  # type: ignore[import-not-found]

    side = cp.cuda.Stream(non_blocking=True)
    with side:
        a = cp.arange(1 << 26, dtype=cp.float64)
        total = cp.sqrt(a).sum()
        for _ in range(20):
            total = total + cp.sqrt(a).sum()
        after = cp.cuda.Event()
        after.record(side)
    return total, lambda: bool(after.done), lambda: side  # CuPy: its current stream, too


async def main(producer: str) -> None:
    async with contextlib.AsyncExitStack() as stack:
        # The producer's array, with its work still pending; `current` makes its stream the
        # library's current one (PyTorch and CuPy order the work of their current stream).
        current: Callable[[], Any] = contextlib.nullcontext
        if producer == "sim":
            sim = SimDriver()
            driver: acs.Driver = sim
            theirs = await stack.enter_async_context(acs.open_stream(driver=sim))
            sim_array = SimArray(sim, theirs.handle)
            array: Any = sim_array

            def is_done() -> bool:
                return sim_array.written
        else:
            driver = acs.get_driver("cuda")
            array, is_done, current = torch_work() if producer == "torch" else cupy_work()

        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await anyio.sleep(0.001)
                ticks += 1

        with anyio.fail_after(60):  # outside the task group: a timeout is a TimeoutError
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker)
                start = time.perf_counter()
                with current():
                    await acs.ready(array, driver=driver)
                took = time.perf_counter() - start
                complete = is_done()
                tg.cancel_scope.cancel()
    print(
        f"ready() returned after {took * 1e3:.0f} ms; the event loop ran {ticks} other steps "
        "meanwhile"
    )
    print(f"the producer's work was complete: {complete}")
    if not complete:
        sys.exit("failed: ready() returned before the producer's work had completed")
    print("done")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Await an array's pending work by DLPack.")
    parser.add_argument("--producer", choices=["sim", "torch", "cupy"], default="sim")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    try:
        anyio.run(main, args.producer, backend=args.backend)
    except acs.DriverUnavailableError as exc:
        sys.exit(f"failed: the CUDA driver cannot be used: {exc.reason} (--producer sim runs it)")
    except ModuleNotFoundError as exc:
        sys.exit(f"failed: --producer {args.producer} needs {exc.name} (--producer sim runs it)")
    except TimeoutError as exc:
        sys.exit(f"failed: {type(exc).__name__}: {exc}")
