"""Await another process's GPU work through an interprocess CUDA event.

The producer (a child process) creates an interprocess event and a host timeline ``written``
and sends both to the consumer (this process): the event as its picklable handle, the timeline
over the Unix socket. For each frame the producer enqueues the frame's kernel, then a GPU write
of ``written = n``, then records the event, and tells the consumer "frame n is recorded". The
consumer awaits the event (no thread blocks, nothing polls), checks that the producer's GPU
write before the record is visible, and acknowledges the frame; the producer records the next
frame only after that acknowledgement, so each wait covers exactly one record.

    python examples/ipc_event_processes.py --driver sim
    python examples/ipc_event_processes.py --driver sim --backend trio
    python examples/ipc_event_processes.py --driver sim --kill-producer-after 300

Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``). A producer that goes
away ends the consumer's wait: the consumer watches the process, and a record that the producer
did not live to complete is never waited for again (see docs/processes.md).
"""

from __future__ import annotations

import argparse
import pickle
import socket
import sys
import time

import anyio
import anyio.abc

import aiocudasem as acs
from aiocudasem.testing import workloads


async def receive_exactly(sock: anyio.abc.SocketStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await sock.receive(size - len(data))
    return data


# ---------------------------------------------------------------------------- the producer


async def produce(fd: int, driver_name: str, frames: int) -> None:
    driver = acs.get_driver(driver_name)
    work = workloads(driver)  # on a GPU, load the kernels before the first wait
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock,
        acs.create_ipc_event(driver=driver) as event,
        acs.create_host_timeline(driver=driver) as written,
        acs.open_stream(driver=driver) as stream,
    ):
        await acs.send_host_timeline(sock, written)
        blob = pickle.dumps(event.export())  # plain data: any channel carries it
        await sock.send(len(blob).to_bytes(4, "little") + blob)
        for n in range(1, frames + 1):
            work.launch_spin(stream.handle, 100_000)  # stands in for the frame's kernels
            stream.enqueue_signal(acs.Signal(written, n))  # the GPU writes n
            event.record(stream)
            await sock.send(n.to_bytes(8, "little"))  # "frame n is recorded"
            await receive_exactly(sock, 8)  # the consumer is done with it


# ---------------------------------------------------------------------------- the consumer


async def consume(
    driver_name: str | None, frames: int, backend: str, kill_after: int | None
) -> int:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
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
        ],
        stdin=None,
        stdout=None,
        stderr=None,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    start, handed = time.perf_counter(), 0
    async with await anyio.abc.UNIXSocketStream.from_socket(mine) as sock:
        written = await acs.receive_host_timeline(sock, driver=driver)
        size = int.from_bytes(await receive_exactly(sock, 4), "little")
        event = acs.open_ipc_event(pickle.loads(await receive_exactly(sock, size)), driver=driver)
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    await child.wait()
                    tg.cancel_scope.cancel()  # the producer is gone: stop waiting for it

                tg.start_soon(watch)
                for n in range(1, frames + 1):
                    try:
                        await receive_exactly(sock, 8)  # "frame n is recorded"
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break  # the producer went away
                    await event.wait()  # frame n's work, done in the producer's process
                    if written.value != n:
                        raise RuntimeError(f"frame {n}: the producer's write is not visible")
                    handed = n
                    if n == kill_after:
                        child.kill()
                        continue  # the next receive finds the producer gone
                    try:
                        await sock.send(n.to_bytes(8, "little"))
                    except anyio.BrokenResourceError:
                        break
                tg.cancel_scope.cancel()
        finally:
            if handed < frames:
                # A record the producer did not live to complete stays pending in this
                # process's context for good, and a release that waits for the whole context
                # would wait with it: release without waiting, and end the process.
                event.close()
                written.close()
            else:
                await event.aclose()
                await written.aclose()
    with anyio.fail_after(30):
        code = await child.wait()
    if handed < frames:
        print(
            f"the producer exited ({code}) after frame {handed}; stopped waiting for it",
            file=sys.stderr,
        )
        return 1
    took = time.perf_counter() - start
    print(
        f"all {frames} frames awaited through an interprocess event in {took:.2f} s on driver "
        f"'{driver.name}' ({backend}), every write visible"
    )
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An interprocess event between two processes.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--kill-producer-after", type=int, default=None, metavar="N")
    parser.add_argument("--producer", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.frames < 1:
        parser.error("need --frames >= 1")
    try:
        if args.producer is not None:
            anyio.run(produce, args.producer, args.driver, args.frames, backend=args.backend)
            sys.exit(0)
        sys.exit(
            anyio.run(
                consume,
                args.driver,
                args.frames,
                args.backend,
                args.kill_producer_after,
                backend=args.backend,
            )
        )
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
