"""Interprocess records: a producer process records, a consumer awaits each record by number.

The simulated device keeps an interprocess event's state, and a host timeline's value, in pages
of shared memory, so these tests run a real second process for the producer, on the simulated
device here (``tests/gpu/test_ipc_records_gpu.py`` repeats them on a GPU). Run directly, this
file is that producer: ``python tests/test_ipc_records.py FD DRIVER MODE RECORDS``, where MODE
is ``run`` (RECORDS records, at most ``WINDOW`` ahead of the consumer; record ``SLOW``, if
given as a fifth argument, runs for 10 s), ``wait`` (send, then ``aclose()``: it waits for the
consumer) or ``nowait`` (send, then ``close()`` at once, and stay alive). Run as
``python tests/test_ipc_records.py consume DRIVER KIND RECORDS SLOW BACKEND``, it is a consumer
of its own (KIND ``in_order`` or ``killed``), which prints one JSON line of what it saw.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

import anyio
import anyio.abc
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, workloads

ROOT = Path(__file__).resolve().parents[1]
#: How many records the producer may run ahead of what the consumer has taken.
WINDOW = 64

# ---------------------------------------------------------------------------------------------
# The producer: this file, run as a script in a second process.


def _driver(name: str) -> acs.Driver:
    return acs.get_driver("cuda") if name == "cuda" else SimDriver()


async def _produce(fd: int, driver_name: str, mode: str, records: int, slow: int) -> None:
    drv = _driver(driver_name)
    sock = await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd))
    async with sock, contextlib.AsyncExitStack() as stack:
        recorder = acs.create_ipc_recorder(driver=drv)
        if mode == "nowait":
            await acs.send_ipc_recorder(sock, recorder)
            recorder.close()  # the event is destroyed before the consumer opens it
            print("closed", flush=True)
            await anyio.sleep(30)  # alive: the open fails for the event, not for the process
            return
        if mode == "wait":
            await acs.send_ipc_recorder(sock, recorder)
            print("sent", flush=True)
            start = time.monotonic()
            await recorder.aclose()  # waits until the consumer has opened and released it
            print(f"waited {time.monotonic() - start:.3f} {recorder.outstanding}", flush=True)
            return
        work = workloads(drv)
        consumed = await acs.receive_host_timeline(sock, driver=drv)  # the consumer's progress
        stack.push_async_callback(consumed.aclose)
        payload = acs.create_host_timeline(driver=drv)
        stack.push_async_callback(payload.aclose)
        stack.push_async_callback(recorder.aclose)  # after the stream: the consumer acks
        stream = acs.open_stream(driver=drv)
        stack.push_async_callback(stream.aclose)
        await acs.send_host_timeline(sock, payload)
        await acs.send_ipc_recorder(sock, recorder)
        for n in range(1, records + 1):
            if n > WINDOW:
                stream.enqueue_wait(acs.Wait(consumed, n - WINDOW))
            if n == slow:
                work.launch_spin(stream.handle, 10_000_000_000)
            stream.enqueue_signal(acs.Signal(payload, n))  # record n's work: the GPU writes n
            assert recorder.record(stream) == n
        await stream.wait_complete()
        print(f"recorded {recorder.count}", flush=True)


# ---------------------------------------------------------------------------------------------
# The consumer side, in the test process.


async def _spawn(
    driver_name: str, mode: str, records: int = 0, slow: int = 0
) -> tuple[anyio.abc.Process, anyio.abc.UNIXSocketStream]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [str(theirs.fileno()), driver_name, mode, str(records), str(slow)]
    proc = await anyio.open_process(
        [sys.executable, __file__, *args],
        stdin=None,
        stderr=None,
        pass_fds=[theirs.fileno()],
        env=env,
        cwd=ROOT,
    )
    theirs.close()
    return proc, await anyio.abc.UNIXSocketStream.from_socket(mine)


async def _output(proc: anyio.abc.Process) -> str:
    assert proc.stdout is not None
    out = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
        while True:
            out += await proc.stdout.receive()
    return out.decode()


async def consume_in_order(
    driver_name: str, records: int, drv: acs.Driver | None = None
) -> tuple[int, int, str]:
    """Take ``records`` records of a producer process, each awaited by number in order;
    returns the records taken, the producer's exit status and what it printed."""
    drv = drv if drv is not None else _driver(driver_name)
    proc, sock = await _spawn(driver_name, "run", records)
    taken = 0
    try:
        async with sock, acs.create_host_timeline(driver=drv) as consumed:
            await acs.send_host_timeline(sock, consumed)
            payload = await acs.receive_host_timeline(sock, driver=drv)
            async with payload, await acs.receive_ipc_records(sock, driver=drv) as records_:
                for n in range(1, records + 1):
                    await records_.wait_record(n)
                    # Record n's work is done here, and the producer is at most WINDOW ahead.
                    assert payload.value >= n
                    assert n <= records_.completed <= n - 1 + WINDOW
                    taken += 1
                    consumed.signal(n)
                # A stream of this process waits for the last record on the GPU too.
                async with acs.open_stream(driver=drv) as stream:
                    records_.enqueue_wait(stream, records)
                    await stream.wait_complete()
                assert records_.event.query()
            out = await _output(proc)
    finally:
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            code = await proc.wait()
    return taken, code, out


async def consume_until_killed(
    driver_name: str, records: int, slow: int, drv: acs.Driver | None = None
) -> tuple[int, int, type[BaseException] | None, float]:
    """Take records until record ``slow``, whose work runs 10 s; kill the producer while the
    consumer awaits it, and abandon the records when the process is seen to end. Returns the
    records taken, the producer's exit status, what the wait for ``slow`` raised, and how long
    the consumer took to release everything."""
    drv = drv if drv is not None else _driver(driver_name)
    proc, sock = await _spawn(driver_name, "run", records, slow)
    taken = 0
    raised: type[BaseException] | None = None
    async with sock, acs.create_host_timeline(driver=drv) as consumed:
        await acs.send_host_timeline(sock, consumed)
        payload = await acs.receive_host_timeline(sock, driver=drv)
        records_ = await acs.receive_ipc_records(sock, driver=drv)
        stream = acs.open_stream(driver=drv)
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                await proc.wait()
                records_.abandon()  # the producer is gone: release every wait on its records

            tg.start_soon(watch)
            for n in range(1, records + 1):
                if n == slow:
                    records_.enqueue_wait(stream, n)  # a GPU wait for the dead record, too
                    tg.start_soon(_kill_soon, proc)
                try:
                    await records_.wait_record(n)
                except acs.AbandonedError as exc:
                    raised = type(exc)
                    break
                taken += 1
                consumed.signal(n)
        start = time.monotonic()
        # Nothing of this process waits for the dead record's event: everything releases.
        await stream.wait_complete()
        await stream.aclose()
        await records_.aclose()
        await payload.aclose()
        released = time.monotonic() - start
    with anyio.fail_after(30):
        code = await proc.wait()
    return taken, code, raised, released


async def _kill_soon(proc: anyio.abc.Process) -> None:
    await anyio.sleep(0.2)
    proc.kill()


pytestmark = pytest.mark.anyio


async def test_10000_records_awaited_in_order_none_missed_none_twice() -> None:
    with anyio.fail_after(120):
        taken, code, out = await consume_in_order("sim", 10_000)
    assert (taken, code) == (10_000, 0)
    assert "recorded 10000" in out


async def test_a_producer_killed_mid_stream_is_abandoned_never_hangs() -> None:
    start = time.monotonic()
    with anyio.fail_after(60):
        taken, code, raised, released = await consume_until_killed("sim", 1000, 50)
    assert taken == 49  # record 50's work never completed
    assert code == -9
    assert raised is acs.AbandonedError
    assert released < 5
    assert time.monotonic() - start < 9  # well before the slow record's 10 s


async def test_the_producer_waits_for_the_consumer_to_open_and_release() -> None:
    """The lifetime rule: the consumer opens the event only after the producer's aclose() has
    begun; aclose() waits for it, so the open succeeds."""
    drv = SimDriver()
    with anyio.fail_after(60):
        proc, sock = await _spawn("sim", "wait")
        async with sock:
            assert proc.stdout is not None
            assert (await proc.stdout.receive()).startswith(b"sent")
            await anyio.sleep(0.5)  # the message waits in the socket meanwhile
            records = await acs.receive_ipc_records(sock, driver=drv)
            assert records.completed == 0
            await anyio.sleep(0.2)
            await records.aclose()
        out = await _output(proc)
        assert await proc.wait() == 0
    waited, outstanding = out.split()[-2:]
    assert float(waited) >= 0.6 and outstanding == "0"


async def test_without_the_rule_the_open_fails_and_still_acknowledges() -> None:
    """``close()`` destroys the event at once: the consumer that was sent it cannot open it
    (as LMCache saw on a GPU: ``invalid argument``), and its receive says so."""
    drv = SimDriver()
    with anyio.fail_after(60):
        proc, sock = await _spawn("sim", "nowait")
        try:
            async with sock:
                assert proc.stdout is not None
                assert (await proc.stdout.receive()).startswith(b"closed")
                with pytest.raises(acs.CudaError):
                    await acs.receive_ipc_records(sock, driver=drv)
        finally:
            proc.kill()
            await proc.wait()


# ---------------------------------------------------------------------------------------------
# One process: numbering, order, the bound on the wait, and bad input.


async def test_records_are_numbered_and_complete_in_order(sim: SimDriver) -> None:
    async with (
        acs.create_ipc_recorder(driver=sim) as recorder,
        acs.open_stream(driver=sim) as a,
        acs.open_stream(driver=sim) as b,
    ):
        assert (recorder.count, recorder.sent, recorder.outstanding) == (0, 0, 0)
        gate = hold(a)
        assert recorder.record(a) == 1
        assert recorder.record(b) == 2  # on another stream: waits for record 1 on the GPU
        await anyio.sleep(0.05)
        assert recorder.timeline.value == 0 and not b.query()
        gate.set()
        with anyio.fail_after(10):
            await b.wait_complete()
        assert recorder.timeline.value == 2 and recorder.event.query()
        assert recorder.count == 2
        assert "records=2" in repr(recorder)


async def test_a_receive_that_cannot_open_acknowledges(sim: SimDriver) -> None:
    """The simulated device refuses to open a handle in the process that made it: the failed
    receive acknowledges, so the producer's aclose() does not wait for it."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(a) as left,
        await anyio.abc.UNIXSocketStream.from_socket(b) as right,
    ):
        recorder = acs.create_ipc_recorder(driver=sim)
        await acs.send_ipc_recorder(left, recorder)
        assert (recorder.sent, recorder.outstanding) == (1, 1)
        with pytest.raises(acs.CudaError):
            await acs.receive_ipc_records(right, driver=sim)
        assert recorder.outstanding == 0
        with anyio.fail_after(5):
            await recorder.aclose()
        assert recorder.closed


async def test_aclose_gives_up_after_its_limit_with_a_warning(
    sim: SimDriver, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(a) as left,
        await anyio.abc.UNIXSocketStream.from_socket(b),
    ):
        recorder = acs.create_ipc_recorder(driver=sim)
        await acs.send_ipc_recorder(left, recorder)  # never received
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="aiocudasem"), anyio.fail_after(10):
            await recorder.aclose(limit_s=0.3)
        assert 0.25 < time.monotonic() - start < 5
        assert recorder.closed
        assert "1 consumer(s) did not release the event within 0.3 s" in caplog.text


async def test_a_slow_aclose_warns_with_the_way_out_and_goes_on_waiting(
    sim: SimDriver, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WARNING that every slow close logs, here after 0.1 s instead of 5 s; the
    acknowledgement that comes afterwards ends the wait."""
    from aiocudasem import _log

    monkeypatch.setattr(_log, "CLOSE_WARNING_S", 0.1)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(a) as left,
        await anyio.abc.UNIXSocketStream.from_socket(b),
    ):
        recorder = acs.create_ipc_recorder(driver=sim)
        await acs.send_ipc_recorder(left, recorder)
        with caplog.at_level(logging.WARNING, logger="aiocudasem"), anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(recorder.aclose)
                await anyio.sleep(0.3)
                assert not recorder.closed
                recorder._acks._increment()  # what the consumer's release does
        assert recorder.closed
        assert "has waited 0.1 s for 1 consumer(s) to release the event" in caplog.text
        assert "30.0 s at most" in caplog.text
        assert "close them first" in caplog.text
        assert "did not release" not in caplog.text


async def test_close_without_waiting_warns_of_the_consumers_left(
    sim: SimDriver, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(a) as left,
        await anyio.abc.UNIXSocketStream.from_socket(b),
    ):
        recorder = acs.create_ipc_recorder(driver=sim)
        await acs.send_ipc_recorder(left, recorder)
        with caplog.at_level(logging.WARNING, logger="aiocudasem"):
            recorder.close()
            recorder.close()  # idempotent
        assert "while 1 consumer(s) hold its event or have not opened it yet" in caplog.text
        with pytest.raises(anyio.ClosedResourceError):
            await acs.send_ipc_recorder(left, recorder)


async def test_bad_input(sim: SimDriver) -> None:
    with pytest.raises(TypeError):
        acs.IpcRecorder()
    with pytest.raises(TypeError):
        acs.IpcRecords()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    async with (
        acs.create_ipc_recorder(driver=sim) as recorder,
        acs.open_stream(1, driver=sim) as s1,
        await anyio.abc.UNIXSocketStream.from_socket(a) as left,
        await anyio.abc.UNIXSocketStream.from_socket(b) as right,
    ):
        with pytest.raises(TypeError, match=r"Stream\.adopt"):
            recorder.record(s1.handle)  # type: ignore[arg-type]
        with pytest.raises(acs.DeviceMismatchError, match="device 1"):
            recorder.record(s1)
        assert recorder.count == 0
        with socket.socket() as plain, pytest.raises(TypeError, match="UNIXSocketStream"):
            await acs.send_ipc_recorder(plain, recorder)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="IpcRecorder"):
            await acs.send_ipc_recorder(left, recorder.event)  # type: ignore[arg-type]
        await left.send(b"x" * 112)
        with pytest.raises(ValueError, match="not an IpcRecorder"):
            await acs.receive_ipc_records(right, driver=sim)
    with pytest.raises(anyio.ClosedResourceError):
        recorder.record(s1)


async def _consume_and_say(driver_name: str, kind: str, records: int, slow: int) -> None:
    """A consumer of its own, for the GPU suite: one JSON line of what it saw."""
    report: dict[str, object]
    if kind == "in_order":
        taken, code, out = await consume_in_order(driver_name, records)
        report = {"taken": taken, "code": code, "output": out}
    else:
        taken, code, raised, released = await consume_until_killed(driver_name, records, slow)
        name = None if raised is None else raised.__name__
        report = {"taken": taken, "code": code, "raised": name, "released_s": released}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "consume":
        anyio.run(
            _consume_and_say,
            sys.argv[2],
            sys.argv[3],
            int(sys.argv[4]),
            int(sys.argv[5]),
            backend=sys.argv[6],
        )
    else:
        anyio.run(
            _produce,
            int(sys.argv[1]),
            sys.argv[2],
            sys.argv[3],
            int(sys.argv[4]),
            int(sys.argv[5]),
        )


async def test_a_cancelled_aclose_releases_both_pages(sim: SimDriver) -> None:
    """Cancelled while the count's release waits for the stream that writes it, aclose()
    still releases the acknowledgements' page (by a thread of its own), as close() would."""
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        recorder = acs.create_ipc_recorder(driver=sim)
        recorder.record(s)
        with anyio.move_on_after(0.3) as scope:
            await recorder.aclose()
        assert scope.cancelled_caught
        assert recorder.closed and recorder.timeline.closed and recorder._acks.closed
        gate.set()


async def test_more_bad_input(sim: SimDriver) -> None:
    async with acs.create_ipc_recorder(driver=sim) as recorder:
        with pytest.raises(TypeError, match="limit_s"):
            await recorder.aclose(limit_s="10")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="limit_s"):
            await recorder.aclose(limit_s=-1)
        assert not recorder.closed  # refused before anything was released
