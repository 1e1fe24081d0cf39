"""send_semaphore() / receive_semaphore(): an exported semaphore's fd over a Unix socket.

The simulated device keeps its state in one process, so here both ends run in this process,
over a socket pair: the fd really travels through the kernel (SCM_RIGHTS) and arrives as a new
fd number, which the simulator, like a driver, resolves to the file it refers to. A peer that
dies is a real second process. The GPU suite sends a Vulkan semaphore to another process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.abc
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver
from tests.conftest import open_fds

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pair() -> AsyncIterator[tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = await anyio.abc.UNIXSocketStream.from_socket(a)
    right = await anyio.abc.UNIXSocketStream.from_socket(b)
    async with left, right:
        yield left, right


async def test_a_sent_timeline_hands_frames_over(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    ready, done = sim.create_semaphore(timeline=True), sim.create_semaphore(timeline=True)
    kind = acs.HandleType.TIMELINE_SEMAPHORE_FD
    sent = [ready.export_fd(), done.export_fd()]
    for fd in sent:
        await acs.send_semaphore(producer_end, fd, kind)
    for fd in sent:
        with pytest.raises(OSError):  # closed once sent: the receiver owns the semaphore
            os.fstat(fd)
    r = await acs.receive_semaphore(consumer_end, driver=sim)
    d = await acs.receive_semaphore(consumer_end, driver=sim)
    async with r, d, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(10):
            for n in range(1, 51):
                ready.signal(n)
                async with stream.handoff(acs.Wait(r, n), acs.Signal(d, n)):
                    pass
                assert done.value == n


async def test_a_binary_semaphore_travels_too(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    binary = sim.create_semaphore(timeline=False)
    await acs.send_semaphore(producer_end, binary.export_fd(), acs.HandleType.OPAQUE_FD)
    sem = await acs.receive_semaphore(consumer_end, driver=sim)
    async with sem:
        assert sem.handle_type is acs.HandleType.OPAQUE_FD
        binary.signal()
        with anyio.fail_after(10):
            await sem.wait_signaled()


async def test_keeping_the_senders_copy_and_importing_twice(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    """close=False keeps the sender's fd open; the export can still be imported only once,
    as with a driver, and a refused import leaves no fd behind."""
    producer_end, consumer_end = pair
    sem = sim.create_semaphore(timeline=True)
    fd = sem.export_fd()
    kind = acs.HandleType.TIMELINE_SEMAPHORE_FD
    await acs.send_semaphore(producer_end, fd, kind, close=False)
    await acs.send_semaphore(producer_end, fd, kind, close=False)
    first = await acs.receive_semaphore(consumer_end, driver=sim)
    before = open_fds()
    with pytest.raises(acs.CudaError):
        await acs.receive_semaphore(consumer_end, driver=sim)  # the export is spent
    assert open_fds() == before
    os.close(fd)
    await first.aclose()


async def test_send_refuses_an_fd_out_of_range(
    pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream],
) -> None:
    producer_end, _ = pair
    for bad in (-1, 2**31, 2**40):
        with pytest.raises(ValueError, match=r"fd must be in \[0, 2\*\*31\)"):
            await acs.send_semaphore(producer_end, bad, acs.HandleType.OPAQUE_FD)


async def test_a_wrong_message_is_a_value_error_and_leaks_no_fd(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    before = open_fds()
    r, w = os.pipe()
    try:
        await producer_end.send_fds(b"hello".ljust(64), [r])
        with pytest.raises(ValueError, match="not a semaphore sent by aiocudasem"):
            await acs.receive_semaphore(consumer_end, driver=sim)
        await producer_end.send_fds(b"aiocudasem-semaphore 1 NOT_A_TYPE".ljust(64), [r])
        with pytest.raises(ValueError, match="unknown handle type 'NOT_A_TYPE'"):
            await acs.receive_semaphore(consumer_end, driver=sim)
        await producer_end.send_fds(b"aiocudasem-semaphore 1 OPAQUE_FD".ljust(64), [r, w])
        with pytest.raises(ValueError, match="carries one fd, this one 2"):
            await acs.receive_semaphore(consumer_end, driver=sim, device=0)
        await producer_end.send(b"aiocudasem-semaphore 1 OPAQUE_FD".ljust(64))
        with pytest.raises(ValueError, match="carries one fd, this one 0"):
            await acs.receive_semaphore(consumer_end, driver=sim)
        # A real semaphore message whose fd the driver refuses: closed, not leaked.
        await producer_end.send_fds(b"aiocudasem-semaphore 1 OPAQUE_FD".ljust(64), [r])
        with pytest.raises(acs.CudaError):
            await acs.receive_semaphore(consumer_end, driver=sim)
    finally:
        os.close(r)
        os.close(w)
    assert open_fds() == before


async def test_bad_arguments_are_type_and_value_errors(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, _ = pair
    sem = sim.create_semaphore(timeline=True)
    fd = sem.export_fd()
    try:
        with pytest.raises(TypeError, match="HandleType"):
            await acs.send_semaphore(producer_end, fd, "TIMELINE_SEMAPHORE_FD")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="not passed as an fd"):
            await acs.send_semaphore(producer_end, fd, acs.HandleType.OPAQUE_WIN32)
        with pytest.raises(TypeError, match="int file descriptor"):
            await acs.send_semaphore(producer_end, True, acs.HandleType.OPAQUE_FD)
        with pytest.raises(ValueError, match="not an open file descriptor"):
            await acs.send_semaphore(producer_end, 987654, acs.HandleType.OPAQUE_FD)
        os.fstat(fd)  # none of that closed the fd
    finally:
        os.close(fd)


async def test_a_cancelled_receive_receives_nothing(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    with anyio.move_on_after(0.05) as scope:
        await acs.receive_semaphore(consumer_end, driver=sim)
    assert scope.cancelled_caught
    sem = sim.create_semaphore(timeline=True)
    await acs.send_semaphore(producer_end, sem.export_fd(), acs.HandleType.TIMELINE_SEMAPHORE_FD)
    received = await acs.receive_semaphore(consumer_end, driver=sim)
    await received.aclose()


_PEER = """
import os, signal, socket, sys, time
sock = socket.socket(fileno=int(sys.argv[1]))
print("ready", flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(60)
"""


@pytest.fixture(params=["exits", "is killed"])
def peer(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[str, subprocess.Popen[str], socket.socket]]:
    """A second process holding the other end of a socket pair: it says "ready", then exits,
    or stays until the test kills it."""
    how = request.param
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = subprocess.Popen(
        [sys.executable, "-c", _PEER, str(theirs.fileno()), "exit" if how == "exits" else "stay"],
        pass_fds=[theirs.fileno()],
        stdout=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield how, proc, mine
    finally:
        mine.close()
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_a_peer_process_that_goes_away_ends_the_receive(
    sim: SimDriver, peer: tuple[str, subprocess.Popen[str], socket.socket]
) -> None:
    """The producer process exits, or is killed mid-run: the consumer's receive ends with
    anyio.EndOfStream at once, never a hang."""
    how, proc, mine = peer
    async with await anyio.abc.UNIXSocketStream.from_socket(mine) as consumer_end:
        if how == "is killed":
            proc.kill()
        t0 = time.perf_counter()
        with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
            await acs.receive_semaphore(consumer_end, driver=sim)
        assert time.perf_counter() - t0 < 5


async def test_a_sent_host_timeline_is_one_value_at_both_ends(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    async with acs.open_stream(1, driver=sim) as stream:
        await stream.wait_complete()  # the loop's notifier (its fd lives with the loop) exists
        before = open_fds()
        async with acs.create_host_timeline(3, driver=sim) as mine:
            await acs.send_host_timeline(producer_end, mine)
            assert mine.value == 3  # the sender keeps its timeline
            theirs = await acs.receive_host_timeline(consumer_end, device=1, driver=sim)
            async with theirs:
                assert theirs.value == 3 and theirs.device == 1
                stream.enqueue_wait(acs.Wait(theirs, 4))
                mine.signal(4)
                with anyio.fail_after(10):
                    await stream.wait_complete()
        assert open_fds() == before


async def test_a_wrong_host_timeline_message_is_refused_and_leaks_no_fd(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    producer_end, consumer_end = pair
    before = open_fds()
    sem = sim.create_semaphore(timeline=True)
    await acs.send_semaphore(producer_end, sem.export_fd(), acs.HandleType.TIMELINE_SEMAPHORE_FD)
    with pytest.raises(ValueError, match="not a host timeline sent by"):
        await acs.receive_host_timeline(consumer_end, driver=sim)
    r, w = os.pipe()
    try:
        await producer_end.send_fds(b"aiocudasem-host-timeline 1".ljust(64), [r, w])
        with pytest.raises(ValueError, match="carries one fd, this one 2"):
            await acs.receive_host_timeline(consumer_end, driver=sim)
        # The right message with an fd that is not a timeline's page: refused, and closed.
        await producer_end.send_fds(b"aiocudasem-host-timeline 1".ljust(64), [r])
        with pytest.raises(ValueError, match="not a host timeline's"):
            await acs.receive_host_timeline(consumer_end, driver=sim)
    finally:
        os.close(r)
        os.close(w)
    assert open_fds() == before
    with pytest.raises(TypeError, match="HostTimeline"):
        await acs.send_host_timeline(producer_end, sem)  # type: ignore[arg-type]
    closed = acs.create_host_timeline(driver=sim)
    await closed.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        await acs.send_host_timeline(producer_end, closed)


async def test_a_peer_process_that_goes_away_ends_a_host_timeline_receive(
    sim: SimDriver, peer: tuple[str, subprocess.Popen[str], socket.socket]
) -> None:
    how, proc, mine = peer
    async with await anyio.abc.UNIXSocketStream.from_socket(mine) as consumer_end:
        if how == "is killed":
            proc.kill()
        with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
            await acs.receive_host_timeline(consumer_end, driver=sim)


async def test_anything_but_a_unix_socket_stream_is_a_type_error_and_consumes_nothing(
    sim: SimDriver, pair: tuple[anyio.abc.UNIXSocketStream, anyio.abc.UNIXSocketStream]
) -> None:
    """A plain socket (the usual mistake), an int or None: a TypeError that names the type to
    pass, raised before an fd is sent, received, exported or closed."""
    producer_end, consumer_end = pair
    sem = sim.create_semaphore(timeline=True)
    fd = sem.export_fd()
    timeline = acs.create_host_timeline(driver=sim)
    plain, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        before = open_fds()
        for bad in (plain, plain.fileno(), None):
            calls = [
                acs.send_semaphore(bad, fd, acs.HandleType.TIMELINE_SEMAPHORE_FD),  # type: ignore[arg-type]
                acs.receive_semaphore(bad, driver=sim),  # type: ignore[arg-type]
                acs.send_host_timeline(bad, timeline),  # type: ignore[arg-type]
                acs.receive_host_timeline(bad, driver=sim),  # type: ignore[arg-type]
            ]
            for call in calls:
                with pytest.raises(TypeError, match=r"anyio\.abc\.UNIXSocketStream") as info:
                    await call
                if isinstance(bad, socket.socket):
                    assert "from_socket()" in str(info.value)
        assert open_fds() == before  # nothing exported, received or closed
        os.fstat(fd)  # the semaphore's fd is still the caller's
        other.setblocking(False)
        with pytest.raises(BlockingIOError):
            other.recv(1)  # nothing went over the plain socket
        # The streams still work: a refused call took nothing from them.
        await acs.send_host_timeline(producer_end, timeline)
        async with await acs.receive_host_timeline(consumer_end, driver=sim) as received:
            timeline.signal(3)
            assert received.value == 3
    finally:
        plain.close()
        other.close()
        os.close(fd)
        await timeline.aclose()
