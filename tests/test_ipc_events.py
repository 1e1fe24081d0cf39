"""Interprocess events: one process creates and records, another opens and awaits.

The simulated device keeps an interprocess event's state in a page of shared memory, so these
tests run a real second process, on the simulated device here and on the GPU with ``-m gpu``.
Run directly, this file is that second process, the producer
(``python tests/test_ipc_events.py FD DRIVER FRAMES SLOW_FRAME``), or a consumer of its own
(``python tests/test_ipc_events.py consume DRIVER FRAMES KILL_DURING BACKEND``).
"""

from __future__ import annotations

import gc
import os
import pickle
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import anyio
import anyio.abc
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, workloads

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ["sim", pytest.param("cuda", marks=pytest.mark.gpu)]

# ---------------------------------------------------------------------------------------------
# The producer: this file, run as a script in a second process.


async def _receive_exactly(sock: anyio.abc.SocketStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await sock.receive(size - len(data))
    return data


def _driver(name: str) -> acs.Driver:
    return acs.get_driver("cuda") if name == "cuda" else SimDriver()


async def _produce(fd: int, driver_name: str, frames: int, slow: int) -> None:
    """For each frame: the frame's kernel, then the GPU writes n to the shared host timeline
    `written`, then the event is recorded and n is sent; the next frame waits for the
    consumer's acknowledgement of this one. Frame ``slow``'s kernel runs for 10 s."""
    drv = _driver(driver_name)
    work = workloads(drv)
    sock = await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd))
    async with (
        sock,
        acs.create_ipc_event(driver=drv) as event,
        acs.create_host_timeline(driver=drv) as written,
        acs.open_stream(driver=drv) as stream,
    ):
        await acs.send_host_timeline(sock, written)
        blob = pickle.dumps(event.export())
        await sock.send(len(blob).to_bytes(4, "little") + blob)
        for n in range(1, frames + 1):
            # The frame's work: 0.2 ms, or 10 s for the slow frame.
            work.launch_spin(stream.handle, 10_000_000_000 if n == slow else 200_000)
            stream.enqueue_signal(acs.Signal(written, n))  # the GPU writes n
            event.record(stream)
            await sock.send(n.to_bytes(8, "little"))
            ack = int.from_bytes(await _receive_exactly(sock, 8), "little")
            assert ack == n, (ack, n)


# ---------------------------------------------------------------------------------------------
# The consumer side, in the test process.


async def _consume(
    driver_name: str, frames: int, kill_after: int | None = None, kill_during: int = 0
) -> tuple[int, int | None]:
    """Run the producer and take its frames; returns the frames handed over and the
    producer's exit status. ``kill_after``: kill the producer once that frame is handed over;
    ``kill_during``: make that frame's work long, and kill the producer while the consumer
    waits for it."""
    drv = _driver(driver_name)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = await anyio.open_process(
        [
            sys.executable,
            __file__,
            str(theirs.fileno()),
            driver_name,
            str(frames),
            str(kill_during),
        ],
        stdin=None,
        stdout=None,
        stderr=None,
        pass_fds=[theirs.fileno()],
        env=env,
        cwd=ROOT,
    )
    theirs.close()
    handed = 0
    try:
        async with await anyio.abc.UNIXSocketStream.from_socket(mine) as sock:
            written = await acs.receive_host_timeline(sock, driver=drv)
            size = int.from_bytes(await _receive_exactly(sock, 4), "little")
            handle = pickle.loads(await _receive_exactly(sock, size))
            event = acs.open_ipc_event(handle, driver=drv)
            assert event.opened
            try:
                async with anyio.create_task_group() as tg:

                    async def watch() -> None:
                        await proc.wait()
                        tg.cancel_scope.cancel()  # the producer is gone: stop waiting for it

                    tg.start_soon(watch)
                    for n in range(1, frames + 1):
                        try:
                            got = int.from_bytes(await _receive_exactly(sock, 8), "little")
                        except (anyio.EndOfStream, anyio.BrokenResourceError):
                            break  # the producer went away between two frames
                        assert got == n
                        if n == kill_during:
                            tg.start_soon(_kill_soon, proc)
                        await event.wait()  # the producer's record of frame n, in its process
                        assert written.value == n  # its GPU's write before the record is here
                        handed = n
                        if n == kill_after:
                            proc.kill()
                        else:
                            try:
                                await sock.send(n.to_bytes(8, "little"))
                            except anyio.BrokenResourceError:
                                break  # the producer went away
                    if handed == frames:
                        # A stream of this process waits for the other process's record too.
                        async with acs.open_stream(driver=drv) as stream:
                            stream.enqueue_event_wait(event)
                            await stream.wait_complete()
                    await proc.wait()
                    tg.cancel_scope.cancel()
            finally:
                if kill_during:
                    # The producer died with a record pending: it never completes, and a side
                    # stream of this process waits for it forever. Releasing the timeline's
                    # page waits for the whole context (cuMemHostUnregister, seen on an H200),
                    # so this process releases without waiting, and ends.
                    event.close()
                    written.close()
                else:
                    await event.aclose()
                    await written.aclose()
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            code = await proc.wait()
    return handed, code


async def _kill_soon(proc: anyio.abc.Process) -> None:
    await anyio.sleep(0.2)
    proc.kill()


pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_consumer_awaits_1000_frames_of_another_process(driver: str) -> None:
    with anyio.fail_after(120):
        handed, code = await _consume(driver, 1000)
    assert (handed, code) == (1000, 0)


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_killed_producer_ends_the_consumer_never_hangs(driver: str) -> None:
    start = time.monotonic()
    with anyio.fail_after(60):
        handed, code = await _consume(driver, 1000, kill_after=300)
    assert handed == 300
    assert code == -9
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_producer_killed_during_a_wait_ends_it_never_hangs(
    driver: str, anyio_backend_name: str
) -> None:
    """The producer dies while the consumer awaits its record, whose work will never
    complete: the consumer's watch on the process ends the wait. That record stays pending in
    the consumer's context for good, so the consumer is a process of its own too, and the test
    checks that it ends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    start = time.monotonic()
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [sys.executable, __file__, "consume", driver, "1000", "50", anyio_backend_name],
            env=env,
            cwd=ROOT,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    handed, code = (int(x) for x in out.split())
    assert handed == 49  # frame 50's record never completed
    assert code == -9
    assert time.monotonic() - start < 9  # well before the slow frame's 10 s


# ---------------------------------------------------------------------------------------------
# One process: the creator's own use, and bad input.


async def test_the_creator_records_and_awaits_its_event(sim: SimDriver) -> None:
    async with acs.create_ipc_event(driver=sim) as event, acs.open_stream(driver=sim) as s:
        assert event.query()  # never recorded: complete, as CUDA says
        gate = hold(s)
        event.record(s)
        assert not event.query()
        with anyio.move_on_after(0.1) as scope:
            await event.wait()
        assert scope.cancelled_caught
        async with acs.open_stream(driver=sim) as other:
            other.enqueue_event_wait(event)
            await anyio.sleep(0.05)
            assert not other.query()
            gate.set()
            with anyio.fail_after(10):
                await acs.wait_event(event)
                await other.wait_complete()
        assert event.query()
        assert not event.opened
        handle = event.export()
        assert pickle.loads(pickle.dumps(handle)) == handle
        assert handle.device_uuid == sim.device_uuid(0)


async def test_a_record_completes_after_the_one_before_it(sim: SimDriver) -> None:
    """An interprocess event's records complete in order: a record behind one whose work is
    held up waits for it, on whichever stream it was made (as seen on an H200, where a record
    made after one whose process died never completed)."""
    async with (
        acs.create_ipc_event(driver=sim) as event,
        acs.open_stream(driver=sim) as a,
        acs.open_stream(driver=sim) as b,
    ):
        gate = hold(a)
        event.record(a)
        event.record(b)  # b has nothing else to do
        await anyio.sleep(0.05)
        assert not b.query() and not event.query()
        gate.set()
        with anyio.fail_after(10):
            await b.wait_complete()
        assert event.query()


async def test_opening_in_the_creating_process_is_refused(sim: SimDriver) -> None:
    async with acs.create_ipc_event(driver=sim) as event:
        with pytest.raises(acs.CudaError) as info:
            acs.open_ipc_event(event.export(), driver=sim)
        assert info.value.status == 201  # CUDA_ERROR_INVALID_CONTEXT


async def test_closing_while_awaited_is_refused(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        event = acs.create_ipc_event(driver=sim)
        gate = hold(s)
        event.record(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(event.wait)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.BusyResourceError):
                event.close()
            gate.set()
        await event.aclose()
        assert event.closed


async def test_bad_input_and_closed_events(sim: SimDriver) -> None:
    with pytest.raises(TypeError):
        acs.create_ipc_event("0", driver=sim)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not exist"):
        acs.create_ipc_event(5, driver=sim)
    with pytest.raises(TypeError, match="IpcEventHandle"):
        acs.open_ipc_event(b"\0" * 64, driver=sim)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 bytes"):
        acs.IpcEventHandle(b"short", bytes(16))
    with pytest.raises(TypeError):
        acs.IpcEventHandle("x" * 64, bytes(16))  # type: ignore[arg-type]
    with pytest.raises(acs.DeviceMismatchError, match="no device"):
        acs.open_ipc_event(acs.IpcEventHandle(bytes(64), b"\xff" * 16), driver=sim)
    with pytest.raises(acs.CudaError):  # the right device, a handle of nothing
        acs.open_ipc_event(acs.IpcEventHandle(bytes(64), sim.device_uuid(0)), driver=sim)
    with pytest.raises(TypeError):
        acs.IpcEvent()
    other = SimDriver()
    event = acs.create_ipc_event(driver=sim)
    async with acs.open_stream(1, driver=sim) as s1, acs.open_stream(driver=other) as foreign:
        with pytest.raises(acs.DeviceMismatchError, match="device 1"):
            event.record(s1)
        with pytest.raises(acs.DeviceMismatchError):
            event.record(foreign)
        with pytest.raises(acs.DeviceMismatchError):
            foreign.enqueue_event_wait(event)
        with pytest.raises(TypeError):
            event.record(s1.handle)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="Event or IpcEvent"):
            s1.enqueue_event_wait(object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="knows its device"):
            await acs.wait_event(event, device=0)
    await event.aclose()
    for call in (event.query, event.export, lambda: event.record(s1)):
        with pytest.raises(anyio.ClosedResourceError):
            call()
    with pytest.raises(anyio.ClosedResourceError):
        await event.wait()


async def test_a_stream_wait_outlives_the_closed_event(sim: SimDriver) -> None:
    """cuStreamWaitEvent captured the record: closing the event does not release the wait."""
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        event = acs.create_ipc_event(driver=sim)
        gate = hold(a)
        event.record(a)
        b.enqueue_event_wait(event)
        event.close()
        await anyio.sleep(0.1)
        assert not b.query()
        gate.set()
        with anyio.fail_after(10):
            await b.wait_complete()


async def test_a_wait_covers_the_record_of_its_call_only(sim: SimDriver) -> None:
    """A record made after the call (by another process, pipelining) is not waited for: here
    it waits for the waiter's acknowledgement, and covering it would deadlock."""
    async with (
        acs.create_ipc_event(driver=sim) as event,
        acs.open_stream(driver=sim) as a,
        acs.open_stream(driver=sim) as b,
    ):
        first = hold(a)
        event.record(a)
        ack = hold(b)
        called = anyio.Event()

        async def consumer() -> None:
            called.set()
            await event.wait()
            ack.set()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer)
                await called.wait()
                event.record(b)  # behind the acknowledgement
                first.set()
        ack.set()


def test_a_handle_naming_another_file_is_refused(sim: SimDriver, tmp_path: Path) -> None:
    """A stale or forged handle whose pid and fd name an ordinary file is refused, and the file
    is neither mapped nor written."""
    import struct

    from aiocudasem._driver._sim import _ipc as _sim

    victim = tmp_path / "victim"
    victim.write_bytes(b"A" * 4096)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time; print(os.open({str(victim)!r}, os.O_RDWR), "
            "flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fd = int(holder.stdout.readline())  # type: ignore[union-attr]
        raw = struct.pack(_sim._IPC_FORMAT, _sim._IPC_TAG, holder.pid, fd, victim.stat().st_ino)
        handle = acs.IpcEventHandle(raw.ljust(64, b"\0"), sim.device_uuid(0))
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(acs.CudaError) as info:
            acs.open_ipc_event(handle, driver=sim)
        assert info.value.status == 1
        assert len(os.listdir("/proc/self/fd")) == before
        assert victim.read_bytes() == b"A" * 4096
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()  # type: ignore[union-attr]


def test_a_device_without_interprocess_events_is_refused() -> None:
    class NoIpc(SimDriver):
        def ipc_event_create(self, ordinal: int) -> int:
            raise acs.UnsupportedFeatureError("no interprocess events [test]")

    with pytest.raises(acs.UnsupportedFeatureError):
        acs.create_ipc_event(driver=NoIpc())


def test_a_collected_event_is_released_with_a_warning(sim: SimDriver) -> None:
    event = acs.create_ipc_event(driver=sim)
    handle = event._handle
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del event
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) for w in caught)
    acs.open_stream(driver=sim).close()  # the library's next use releases it
    assert handle not in sim._events


async def _consume_and_say(driver: str, frames: int, kill_during: int) -> None:
    handed, code = await _consume(driver, frames, kill_during=kill_during)
    print(handed, code, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "consume":
        anyio.run(
            _consume_and_say,
            sys.argv[2],
            int(sys.argv[3]),
            int(sys.argv[4]),
            backend=sys.argv[5],
        )
    else:
        anyio.run(_produce, int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
