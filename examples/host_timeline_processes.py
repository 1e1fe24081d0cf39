"""Hand frames from a producer process to a CUDA consumer process through host timelines.

The consumer (this process) creates two host timelines, ``ready`` and ``done``, and a ring of
frame slots in shared memory. It starts the producer as a child process and sends it all three
over a Unix socket pair. The producer, a process whose frames come from the CPU (a camera or a
decoder), writes frame n into slot ``n % RING`` and signals ``ready = n``; before it reuses a
slot it awaits ``done >= n - RING`` (its own CUDA device watches the word for that). For
each frame the consumer enters ``stream.handoff(Wait(ready, n), Signal(done, n))``: its stream
waits on the GPU for the frame, the consumer checks the slot's words once its stream is past
that wait, and its GPU work follows.

    python examples/host_timeline_processes.py --driver sim
    python examples/host_timeline_processes.py --driver sim --backend trio
    python examples/host_timeline_processes.py --driver sim --gpu-producer
    python examples/host_timeline_processes.py --driver sim --kill-producer-after 300

With ``--gpu-producer`` the producer is a CUDA producer: its own GPU signals ``ready = n``
after the frame's kernel, a write to the shared page that the consumer's GPU sees.

With ``--kill-producer-after N`` the consumer kills the producer after frame N. It notices
that the producer's end of the socket closed, stops waiting, signals ``ready`` to its highest
value so that nothing stays blocked on the GPU, releases everything and exits with status 1
and a message, instead of hanging. Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides
(default: ``cuda``).
"""

from __future__ import annotations

import argparse
import mmap
import os
import socket
import sys
import time

import anyio
import anyio.abc
import numpy as np

import aiocudasem as acs
from aiocudasem.testing import frame_words, workloads

RING = 4  # frame slots in the shared ring
WORDS = 1024  # uint32 words per frame
_TAG = b"aiocudasem-example frames".ljust(64)


def frame_ring(fd: int) -> tuple[mmap.mmap, np.ndarray]:
    ring = mmap.mmap(fd, RING * WORDS * 4)
    return ring, np.frombuffer(ring, dtype=np.uint32).reshape(RING, WORDS)


async def watch(sock: anyio.abc.UNIXSocketStream, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the other process's end of the socket closes (it exited)."""
    try:
        await sock.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        pass
    scope.cancel()


# ---------------------------------------------------------------------------- the producer


async def produce(fd: int, driver_name: str, frames: int, gpu: bool) -> None:
    """With ``gpu``, each frame also passes through the producer's own GPU, which signals
    ``ready`` after its kernel (a CUDA producer); without, the CPU signals it."""
    driver = acs.get_driver(driver_name)
    work = workloads(driver)
    async with await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock:
        ready = await acs.receive_host_timeline(sock, driver=driver)
        done = await acs.receive_host_timeline(sock, driver=driver)
        _, fds = await sock.receive_fds(64, 1)
        ring, slots = frame_ring(fds[0])
        os.close(fds[0])
        async with (
            ready,
            done,
            acs.open_stream(driver=driver) as stream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(watch, sock, tg.cancel_scope)
            try:
                for n in range(1, frames + 1):
                    if n > RING:
                        await done.wait_value(n - RING)  # the slot's last frame is consumed
                    slots[n % RING] = frame_words(n, WORDS)
                    if gpu:
                        work.launch_spin(stream.handle, 20_000)  # stands in for its kernels
                        stream.enqueue_signal(acs.Signal(ready, n))  # its GPU signals
                    else:
                        ready.signal(n)
                await done.wait_value(frames)
            finally:
                if tg.cancel_scope.cancel_called:  # the consumer is gone: free our waits
                    done.abandon()
            tg.cancel_scope.cancel()
        del slots
        ring.close()


# ---------------------------------------------------------------------------- the consumer


async def consume(
    driver_name: str | None, frames: int, kill_after: int | None, backend: str, gpu: bool
) -> int:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    work = workloads(driver)  # on a GPU, load the kernels before the first wait
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = await anyio.open_process(
        [
            sys.executable,
            __file__,
            "--producer",
            str(theirs.fileno()),
            "--driver",
            driver.name,
            "--frames",
            str(frames),
            "--backend",
            backend,
            *(["--gpu-producer"] if gpu else []),
        ],
        stdin=None,
        stdout=None,
        stderr=None,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    buffer_fd = os.memfd_create("frames", os.MFD_CLOEXEC)
    os.ftruncate(buffer_fd, RING * WORDS * 4)
    ring, slots = frame_ring(buffer_fd)
    start, handed, gone = time.perf_counter(), 0, False
    try:
        async with (
            await anyio.abc.UNIXSocketStream.from_socket(mine) as sock,
            acs.create_host_timeline(driver=driver) as ready,
            acs.create_host_timeline(driver=driver) as done,
            acs.open_stream(driver=driver) as stream,
        ):
            await acs.send_host_timeline(sock, ready)
            await acs.send_host_timeline(sock, done)
            await sock.send_fds(_TAG, [buffer_fd])
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, sock, tg.cancel_scope)
                for n in range(1, frames + 1):
                    async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                        await stream.wait_complete()  # past Wait(ready, n): frame n is here
                        if not (slots[n % RING] == frame_words(n, WORDS)).all():
                            raise RuntimeError(f"frame {n} arrived damaged")
                        work.launch_spin(stream.handle, 20_000)  # stands in for your kernels
                    handed = n
                    if n == kill_after:
                        child.kill()
                tg.cancel_scope.cancel()
            gone = handed < frames
            if gone:  # nothing will signal `ready` again: release the stream's pending wait
                ready.abandon()
    finally:
        del slots
        ring.close()
        os.close(buffer_fd)
        with anyio.fail_after(30), anyio.CancelScope(shield=True):
            code = await child.wait()
    took = time.perf_counter() - start
    if gone:
        print(
            f"the producer exited ({code}): frames 1-{handed} were handed over; stopped "
            f"waiting for frame {handed + 1} and released everything",
            file=sys.stderr,
        )
        return 1
    who = "GPU" if gpu else "CPU"
    print(
        f"all {frames} frames handed over between two processes in {took:.2f} s on "
        f"driver '{driver.name}' ({backend}, the producer's {who} signalling), every frame intact"
    )
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Host timelines between two processes.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--kill-producer-after", type=int, default=None, metavar="N")
    parser.add_argument(
        "--gpu-producer",
        action="store_true",
        help="the producer's GPU signals each frame after its kernel, instead of its CPU",
    )
    parser.add_argument("--producer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("need --frames >= 1")
    try:
        if args.producer is not None:
            anyio.run(
                produce,
                args.producer,
                args.driver,
                args.frames,
                args.gpu_producer,
                backend=args.backend,
            )
            sys.exit(0)
        sys.exit(
            anyio.run(
                consume,
                args.driver,
                args.frames,
                args.kill_producer_after,
                args.backend,
                args.gpu_producer,
                backend=args.backend,
            )
        )
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
