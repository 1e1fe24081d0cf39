"""The "user code" under test in this folder: a frame consumer that uses aiocudasem.

It takes its streams and semaphores as arguments, so that tests can give it objects of the
simulated device.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

import aiocudasem as acs


async def process_frame(
    stream: acs.Stream,
    ready: acs.ExternalSemaphore,
    done: acs.ExternalSemaphore,
    n: int,
    kernel: Callable[[acs.Stream], None],
) -> None:
    """Wait on the GPU for the producer's frame ``n``, run ``kernel`` on it and signal ``done``
    = ``n`` back. Returns once the GPU is past that signal."""
    async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
        kernel(stream)


async def finished_within(stream: acs.Stream, seconds: float) -> bool:
    """Whether the work enqueued on ``stream`` completes within ``seconds``. On ``False`` the
    work goes on running; only the waiting stopped."""
    with anyio.move_on_after(seconds):
        await stream.wait_complete()
        return True
    return False
