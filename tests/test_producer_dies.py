"""A producer process killed with SIGKILL mid-stream, as the consumer process lives it.

The producer sends its ``ready`` and ``done`` timelines over a Unix socket, hands a few frames
over (``ready = n``, then it waits for ``done >= n``), and is killed while the consumer's
stream waits in a hand-off for the next frame and a task of the consumer is parked in a host
wait for the last frame. The consumer is what a user would write: a task watches the socket
and calls ``ready.abandon()`` at end-of-file; the hand-off's exit and the parked wait raise
``AbandonedError``; everything closes and the process exits with 0.

Both ends are real processes (``python -m tests.test_producer_dies consumer|producer ...``),
so that the kill and the exit are real. The test measures from the kill to the consumer's
exit, on asyncio, asyncio+uvloop and trio, and checks that the consumer's fds were back to
what it started with before it exited. Here both ends run on the simulated device and share
host timelines (pages of shared memory, which cross processes on the simulator too);
tests/gpu/test_producer_dies_gpu.py runs the same consumer on the real GPU against a Vulkan
producer's timeline semaphores.
"""

from __future__ import annotations

import json
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

import aiocudasem as acs
from aiocudasem._notifier import current_notifier
from aiocudasem.testing import SimDriver, workloads
from tests.conftest import fd_targets, open_fds

ROOT = Path(__file__).resolve().parent.parent

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {"use_uvloop": False}),
    "asyncio+uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}
FRAMES = 3  # frames the producer hands over before it is killed
LAST_FRAME = 1000  # the frames it promised: a task of the consumer waits for the last one
MiB = 1 << 20
# A consumer still running this long after it started prints its notifier's state.
STUCK_S = float(os.environ.get("AIOCUDASEM_TEST_STUCK_S", "20"))
# A resource that the consumer leaves to the collector is a defect of the scenario: say so.
WARN = ["-W", "always::ResourceWarning"]
CONSUMER = [sys.executable, *WARN, "-m", "tests.test_producer_dies", "consumer"]


def say(*words: object) -> None:
    print(*words, flush=True)


# ---------------------------------------------------------------------------- the consumer


async def watch(
    sock: anyio.abc.UNIXSocketStream,
    ready: acs.HostTimeline | acs.ExternalSemaphore,
    noticed: list[float],
) -> None:
    """Abandon ``ready`` once the producer's end of the socket closes: it exited or was
    killed, and will never signal again."""
    try:
        await sock.receive()  # the producer sends nothing more: only end-of-file comes
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        pass
    noticed.append(time.monotonic())
    ready.abandon()


async def wait_for_the_last_frame(
    ready: acs.HostTimeline | acs.ExternalSemaphore, report: dict[str, Any]
) -> None:
    try:
        await ready.wait_value(LAST_FRAME)
    except acs.AbandonedError as exc:
        report["parked_error"] = [type(exc).__name__, isinstance(exc, anyio.BrokenResourceError)]
    else:
        report["parked_error"] = None


def _dump_if_stuck(notifier: Any, driver: acs.Driver, finished: threading.Event) -> None:
    """Print the notifier's state if the consumer has not finished within STUCK_S: a hang
    then shows what was armed, what the C queue saw and what the driver says of each point."""
    if finished.wait(STUCK_S):
        return
    try:
        c = notifier._c
        lines = [
            f"STUCK after {STUCK_S} s: c.stats={c.stats()} queued={c.queued()}",
            f"  draining={notifier._draining} heir={notifier._heir!r} asleep={notifier._asleep}"
            f" check={notifier._check} fd_readable="
            f"{bool(select.select([notifier._fd], [], [], 0)[0])}",
            f"  heads={[(k[1], p.seq) for k, p in list(notifier._heads.items())]}",
            f"  chains={[(k[1], [p.seq for p in ch]) for k, ch in list(notifier._chains.items())]}",
        ]
        for token, p in list(notifier._armed.items()):
            try:
                eq = driver.event_query(p.event)
            except Exception as exc:
                eq = repr(exc)
            try:
                sq = driver.stream_query(p.stream)
            except Exception as exc:
                sq = repr(exc)
            lines.append(
                f"  armed token={token} seq={p.seq} stream={p.stream:#x} event={p.event:#x}"
                f" done={p.done} waiting={p.waiting} fired={c.fired(token)}"
                f" event_query={eq} stream_query={sq}"
            )
        say("\n".join(lines))
    except Exception as exc:
        say(f"STUCK, and the dump failed: {exc!r}")


async def consume(fd: int, driver_name: str, kind: str, report: dict[str, Any]) -> None:
    driver = acs.get_driver(driver_name)
    finished = threading.Event()
    threading.Thread(
        target=_dump_if_stuck, args=(current_notifier(), driver, finished), daemon=True
    ).start()
    try:
        await _consume(fd, driver, driver_name, kind, report)
    finally:
        finished.set()


async def _consume(
    fd: int, driver: acs.Driver, driver_name: str, kind: str, report: dict[str, Any]
) -> None:
    work = workloads(driver)
    receive = acs.receive_host_timeline if kind == "host-timeline" else acs.receive_semaphore
    async with await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock:
        ready = await receive(sock, driver=driver)
        done = await receive(sock, driver=driver)
        async with ready, done, acs.open_stream(driver=driver) as stream:
            # Under CUDA's lazy loading a kernel launched for the first time behind a pending
            # semaphore wait can deadlock (docs/lazy-loading.md): launch it once before.
            work.launch_spin(stream.handle, 1_000)
            await stream.wait_complete()
            report["gpu_free_before"] = gpu_free_bytes(driver_name)
            noticed: list[float] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, sock, ready, noticed)
                tg.start_soon(wait_for_the_last_frame, ready, report)
                await anyio.wait_all_tasks_blocked()  # both are parked before the first frame
                n = 0
                try:
                    for n in range(1, LAST_FRAME + 1):
                        async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
                            work.launch_spin(stream.handle, 20_000)  # stands in for its kernels
                            say(f"frame {n}")
                        report["handed"] = n
                except acs.AbandonedError as exc:
                    broken = isinstance(exc, anyio.BrokenResourceError)
                    report["handoff_error"] = [type(exc).__name__, n, broken]
            report["noticed"] = noticed[0]
            report["stream_idle"] = stream.query()


def gpu_free_bytes(driver_name: str) -> int | str | None:
    """Device 0's free memory (``cuMemGetInfo`` in its primary context) on the real driver,
    or why it could not be read; None on the simulated device."""
    if driver_name != "cuda":
        return None
    try:
        from cuda.bindings import driver as cu

        ok = cu.CUresult.CUDA_SUCCESS
        status, dev = cu.cuDeviceGet(0)
        if status != ok:
            return f"cuDeviceGet: {status!r}"
        # The library retains the primary context already: this retain only counts, and its
        # release destroys nothing.
        status, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        if status != ok:
            return f"cuDevicePrimaryCtxRetain: {status!r}"
        try:
            (status,) = cu.cuCtxPushCurrent(ctx)
            if status != ok:
                return f"cuCtxPushCurrent: {status!r}"
            try:
                status, free, _total = cu.cuMemGetInfo()
            finally:
                cu.cuCtxPopCurrent()
        finally:
            cu.cuDevicePrimaryCtxRelease(dev)
    except Exception as exc:  # the bindings differ: the figure is missing, not the test
        return f"{type(exc).__name__}: {exc}"
    return int(free) if status == ok else f"cuMemGetInfo: {status!r}"


async def warm_up(driver_name: str) -> None:
    """What a process sets up once and keeps (the device's context, loaded kernels, and
    uvloop's pipe, which it keeps for the process), so that the fds counted before the run
    are the process's own baseline."""
    driver = acs.get_driver(driver_name)
    async with acs.open_stream(driver=driver) as stream:
        workloads(driver).launch_spin(stream.handle, 1_000)
        await stream.wait_complete()
    gpu_free_bytes(driver_name)  # the bindings it imports are loaded before the count too


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def consumer_main(fd: int, driver_name: str, kind: str, backend: str) -> None:
    records = _Records()
    logging.getLogger("aiocudasem").addHandler(records)
    name, options = BACKENDS[backend]
    anyio.run(warm_up, driver_name, backend=name, backend_options=options)
    before = open_fds()
    report: dict[str, Any] = {}
    anyio.run(consume, fd, driver_name, kind, report, backend=name, backend_options=options)
    after = open_fds()
    report["gpu_free_after"] = gpu_free_bytes(driver_name)
    report["socket_closed"] = fd not in after
    report["new_fds"] = fd_targets(after - before)
    report["log"] = records.messages
    report["exiting"] = time.monotonic()
    say("REPORT", json.dumps(report))


# ---------------------------------------------------------------------------- the producer


async def produce(fd: int) -> None:
    driver = SimDriver()
    async with (
        await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)) as sock,
        acs.create_host_timeline(driver=driver) as ready,
        acs.create_host_timeline(driver=driver) as done,
    ):
        await acs.send_host_timeline(sock, ready)
        await acs.send_host_timeline(sock, done)
        for n in range(1, FRAMES + 1):
            ready.signal(n)
            with anyio.fail_after(30):
                await done.wait_value(n)  # the consumer's stream signals it after frame n
        say(f"handed over {FRAMES} frames")
        await anyio.sleep_forever()  # until killed


# ---------------------------------------------------------------------------- the test's side


def child_env() -> dict[str, str]:
    paths = [str(ROOT), *sys.path]
    # A child that hangs is sent SIGABRT (see _stacks()): faulthandler then prints every
    # thread's stack.
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "PYTHONFAULTHANDLER": "1",
    }


def _stacks(proc: subprocess.Popen[str]) -> str:
    """What a hung child says once it is sent SIGABRT: its threads' stacks."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
    try:
        return proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate(timeout=30)[0]


def _exit_time(proc: subprocess.Popen[str], limit: float) -> float | None:
    """The ``time.monotonic()`` at which ``proc`` exits, within ``limit`` seconds, or None.
    A pidfd becomes readable the moment the process exits, where polling would add its
    period to the figure."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        readable, _, _ = select.select([pidfd], [], [], limit)
        return time.monotonic() if readable else None
    finally:
        os.close(pidfd)


def kill_mid_stream(
    producer_argv: Sequence[str], driver: str, kind: str, backend: str, timeout: float = 60
) -> dict[str, Any]:
    """Start a producer (``producer_argv`` plus its end of a socket pair) and a consumer,
    SIGKILL the producer once the consumer's stream waits for frame ``FRAMES + 1``, and
    return the consumer's report with the times measured here: ``kill_to_exit`` and
    ``noticed_to_exit`` (seconds; CLOCK_MONOTONIC is one clock for every process)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = child_env()
    with mine, theirs:
        producer = subprocess.Popen(
            [*producer_argv, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        consumer = subprocess.Popen(
            [*CONSUMER, str(mine.fileno()), driver, kind, backend],
            pass_fds=[mine.fileno()],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
    # Only the two children hold the socket's ends now: the producer's death closes its end.
    out: list[str] = []
    try:
        assert consumer.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(consumer.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while f"frame {FRAMES + 1}\n" not in out:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(
                        f"the consumer never reached frame {FRAMES + 1}:\n{''.join(out)}"
                        f"{_stacks(consumer)}\nthe producer said:\n{_stacks(producer)}"
                    )
                if sel.select(left):
                    line = consumer.stdout.readline()
                    if not line:
                        producer.kill()
                        said = producer.communicate(timeout=30)[0]
                        pytest.fail(
                            f"the consumer exited before frame {FRAMES + 1}:\n{''.join(out)}\n"
                            f"the producer said:\n{said}"
                        )
                    out.append(line)
        assert producer.poll() is None, "the producer exited before it was killed"
        killed = time.monotonic()
        producer.kill()
        exited = _exit_time(consumer, 10)
        if exited is None:
            rest = _stacks(consumer)
            pytest.fail(
                f"{backend}: the consumer still ran 10 s after its producer was killed:\n"
                f"{''.join(out)}{rest}"
            )
        rest = consumer.communicate(timeout=30)[0]
        said = producer.communicate(timeout=30)[0]
    finally:
        for proc in (producer, consumer):
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    text = "".join(out) + rest
    assert producer.returncode == -signal.SIGKILL, said
    assert consumer.returncode == 0, f"status {consumer.returncode}:\n{text}"
    for bad in ("Traceback", "ResourceWarning", "Exception ignored"):
        assert bad not in text, text
    reports = [line for line in rest.splitlines() if line.startswith("REPORT ")]
    assert len(reports) == 1, text
    report: dict[str, Any] = json.loads(reports[0].removeprefix("REPORT "))
    report["kill_to_exit"] = exited - killed
    report["noticed_to_exit"] = exited - report["noticed"]
    report["kill_to_noticed"] = report["noticed"] - killed
    report["output"] = text
    say(
        f"{driver}/{backend}: noticed {report['kill_to_noticed'] * 1e3:.1f} ms after the kill, "
        f"released everything {(report['exiting'] - report['noticed']) * 1e3:.1f} ms and "
        f"exited {report['noticed_to_exit'] * 1e3:.1f} ms after noticing, "
        f"{report['kill_to_exit'] * 1e3:.1f} ms after the kill"
    )
    return report


def check_report(report: dict[str, Any], kill_bound: float) -> None:
    """What every run of the scenario must show: see the module's docstring."""
    text = report["output"]
    assert report.get("handed") == FRAMES, text
    # The section that waited for the frame that never came was released, ran, and said so.
    assert report.get("handoff_error") == ["AbandonedError", FRAMES + 1, True], text
    assert report.get("parked_error") == ["AbandonedError", True], text
    assert report["stream_idle"] is True, text
    # No leak, failed release or slow close was logged (the lazy-loading notice is the
    # driver's mode, reported once per process on the real GPU).
    lazy = "CUDA loads modules lazily"
    assert [m for m in report["log"] if not m.startswith(lazy)] == [], text
    assert report["socket_closed"], text
    # The library's promise: within a second of noticing, the process is gone.
    assert report["noticed_to_exit"] < 1.0, report["noticed_to_exit"]
    assert report["kill_to_exit"] < kill_bound, report["kill_to_exit"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_killed_producer_process_ends_the_consumer_cleanly(backend: str) -> None:
    producer = [sys.executable, "-m", "tests.test_producer_dies", "producer", backend]
    report = kill_mid_stream(producer, "sim", "host-timeline", backend)
    check_report(report, kill_bound=3.0)  # generous for a loaded CI host; the figure is printed
    assert report["new_fds"] == {}, report["output"]


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "consumer":
        consumer_main(int(args[0]), args[1], args[2], args[3])
    elif role == "producer":
        backend, options = BACKENDS[args[0]]
        anyio.run(produce, int(args[1]), backend=backend, backend_options=options)
    else:
        sys.exit(f"unknown role {role!r}: consumer or producer")
