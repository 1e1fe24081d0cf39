"""Await another process's GPU work record by record: interprocess records.

The producer (a child process) creates an :class:`aiocudasem.IpcRecorder` and a host timeline
``written``, and sends both over a Unix socket. For each frame it enqueues the frame's kernel,
then a GPU write of ``written = n``, then ``recorder.record(stream)``, which numbers the record
n: the stream writes n to the recorder's shared count after the work, and records the event.
It records up to ``WINDOW`` frames ahead of the consumer, on the GPU (its stream waits for the
consumer's ``taken`` timeline), with no message per frame.

The consumer (this process) awaits each record by its number, ``await records.wait_record(n)``
(no thread blocks, nothing polls), checks that the producer's write before it is visible, and
signals ``taken = n``. No record is missed or counted twice, however far ahead the producer is.
When the consumer releases its records, it acknowledges: the producer's ``aclose()`` waits for
that before it destroys the event.

    python examples/ipc_records.py --driver sim
    python examples/ipc_records.py --driver sim --backend trio
    python examples/ipc_records.py --driver sim --kill-producer-after 300

Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``). A producer that goes
away is abandoned: the consumer watches the process, and ``records.abandon()`` ends the waits
for its records with ``AbandonedError`` (see docs/processes.md).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

import anyio
import anyio.abc

import aiocudasem as acs
from aiocudasem.testing import workloads

WINDOW = 16  # frames the producer may record ahead of the consumer

# ---------------------------------------------------------------------------- the producer


async def produce(fd: int, driver_name: str, frames: int) -> None:
    driver = acs.get_driver(driver_name)
    work = workloads(driver)  # on a GPU, load the kernels before the first wait
    async with await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock:
        taken = await acs.receive_host_timeline(sock, driver=driver)
        async with (
            taken,
            acs.create_ipc_recorder(driver=driver) as recorder,  # last out: waits for the ack
            acs.create_host_timeline(driver=driver) as written,
            acs.open_stream(driver=driver) as stream,
        ):
            await acs.send_host_timeline(sock, written)
            await acs.send_ipc_recorder(sock, recorder)
            for n in range(1, frames + 1):
                if n > WINDOW:
                    stream.enqueue_wait(acs.Wait(taken, n - WINDOW))  # a free buffer
                work.launch_spin(stream.handle, 100_000)  # stands in for the frame's kernels
                stream.enqueue_signal(acs.Signal(written, n))  # the GPU writes n
                recorder.record(stream)  # record n
            await stream.wait_complete()


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
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(mine) as sock,
        acs.create_host_timeline(driver=driver) as taken,
    ):
        await acs.send_host_timeline(sock, taken)
        written = await acs.receive_host_timeline(sock, driver=driver)
        async with (
            written,
            await acs.receive_ipc_records(sock, driver=driver) as records,
            anyio.create_task_group() as tg,
        ):

            async def watch() -> None:
                await child.wait()
                records.abandon()  # the producer is gone: its records' waits end

            tg.start_soon(watch)
            try:
                for n in range(1, frames + 1):
                    await records.wait_record(n)  # frame n's work, in the producer
                    if written.value < n:
                        raise RuntimeError(f"frame {n}: the producer's write is not visible")
                    handed = n
                    if n == kill_after:
                        child.kill()  # the records it completed already are still taken
                    else:
                        taken.signal(n)
            except acs.AbandonedError:
                pass  # the producer died: nothing of ours waits for its records any more
            tg.cancel_scope.cancel()
    with anyio.fail_after(30):
        code = await child.wait()
    if handed < frames:
        print(
            f"the producer exited ({code}) after record {handed}; its records were abandoned "
            "and everything released",
            file=sys.stderr,
        )
        return 1
    took = time.perf_counter() - start
    print(
        f"all {frames} records awaited by number in {took:.2f} s on driver '{driver.name}' "
        f"({backend}), every write visible"
    )
    return code


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Interprocess records between two processes.")
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
