"""When the producer dies: notice it, give up on it, and exit cleanly.

A producer process sends this process two host timelines over a Unix socket, ``ready`` and
``done``, and hands frames over: it signals ``ready = n`` once frame n is written, and waits
for ``done >= n``. After a few frames it dies without a word (it kills itself with SIGKILL,
as a crash or the OOM killer would) while this process's stream waits on the GPU for the next
frame. That wait cannot be taken back, so the consumer gets out on its own:

1. a task watches the socket the timelines came on: end-of-file means the producer exited;
2. it calls ``ready.abandon()``, which releases the stream's wait and makes the hand-off
   that waited raise ``AbandonedError``;
3. the ``async with`` blocks close the stream and the timelines, and the program exits with 0.

    python examples/producer_dies.py
    python examples/producer_dies.py --backend trio --frames 10
    python examples/producer_dies.py --driver cuda

It runs on the simulated device unless ``--driver cuda`` is given: host timelines are pages of
shared memory, so they cross processes on the simulator too.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import sys
import time

import anyio
import anyio.abc

import aiocudasem as acs
from aiocudasem.testing import workloads


async def watch(sock: anyio.abc.SocketStream, ready: acs.HostTimeline) -> None:
    """Give up on ``ready`` once the producer's end of ``sock`` closes."""
    try:
        await sock.receive()  # the producer sends nothing more: only end-of-file comes
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        pass
    print("the producer's socket closed: abandoning its timeline")
    ready.abandon()


async def consume(driver_name: str, frames: int) -> None:
    driver = acs.get_driver(driver_name)
    work = workloads(driver)  # on a GPU, load the kernels before the first semaphore wait
    mine, theirs = socket.socketpair()
    argv = [sys.executable, __file__, "--producer", str(theirs.fileno())]
    argv += ["--driver", driver.name, "--frames", str(frames)]
    async with await anyio.open_process(
        argv, stdin=None, stdout=None, stderr=None, pass_fds=[theirs.fileno()]
    ) as producer:
        theirs.close()  # only the producer holds its end now: its exit closes the socket
        async with await anyio.abc.UNIXSocketStream.from_socket(mine) as sock:
            ready = await acs.receive_host_timeline(sock, driver=driver)
            done = await acs.receive_host_timeline(sock, driver=driver)
            async with (
                ready,
                done,
                acs.open_stream(driver=driver) as stream,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(watch, sock, ready)
                try:
                    for n in itertools.count(1):
                        async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                            work.launch_spin(stream.handle, 100_000)  # stands in for yours
                        print(f"frame {n} done")
                except acs.AbandonedError:
                    gave_up = time.monotonic()
                    print(f"frame {n} never came: its hand-off raised AbandonedError")
        status = await producer.wait()
    took = time.monotonic() - gave_up
    print(
        f"the producer exited ({status}); stream and timelines released {took * 1e3:.0f} ms "
        f"after giving up, on driver '{driver.name}'"
    )


async def produce(fd: int, driver_name: str, frames: int) -> None:
    driver = acs.get_driver(driver_name)
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock,
        acs.create_host_timeline(driver=driver) as ready,
        acs.create_host_timeline(driver=driver) as done,
    ):
        await acs.send_host_timeline(sock, ready)
        await acs.send_host_timeline(sock, done)
        for n in range(1, frames + 1):
            ready.signal(n)  # frame n is written
            await done.wait_value(n)  # and the consumer is done with it
        os.kill(os.getpid(), signal.SIGKILL)  # dies mid-stream: no clean-up, no goodbye


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A consumer whose producer process dies.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default="sim")
    parser.add_argument("--frames", type=int, default=3, help="frames before the producer dies")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--producer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("need --frames >= 1")
    try:
        if args.producer is not None:
            anyio.run(produce, args.producer, args.driver, args.frames, backend=args.backend)
        else:
            anyio.run(consume, args.driver, args.frames, backend=args.backend)
    except acs.DriverUnavailableError as exc:
        sys.exit(f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it)")
