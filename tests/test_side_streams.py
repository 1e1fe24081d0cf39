"""The side streams shared by every loop of the process: one thread's eviction never destroys a
side stream that another thread has taken and not yet enqueued on."""

from __future__ import annotations

import functools
import threading

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier._pools import destroy_stream
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import until_parked

pytestmark = pytest.mark.anyio


async def test_an_eviction_by_another_thread_waits_for_a_launch_in_progress(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop takes the side stream of its work stream and enqueues the event wait and the host
    function on it. Another thread that evicts that side stream in between (the table is full)
    would destroy it first, and the launch would fail on a freed handle: the waiter would get a
    CudaError for work that completes. The eviction has to wait until the launch is done."""
    from aiocudasem._notifier import _pools
    from aiocudasem._notifier._pools import destroy_stream, side_streams

    monkeypatch.setattr(_pools._SideStreams, "_LIMIT", 1)  # the next new side stream evicts
    other = sim.stream_create(0, True, 0)  # another loop's work stream
    threads: list[threading.Thread] = []
    wait_event = sim.stream_wait_event

    def racing_wait_event(stream: int, event: int) -> None:
        if not threads:  # the first launch: another thread gets a side stream meanwhile
            t = threading.Thread(
                target=side_streams.enqueue_on, args=(sim, 0, other, lambda side: None), daemon=True
            )
            threads.append(t)
            t.start()
            t.join(0.2)  # done by now unless it waits for this launch
        wait_event(stream, event)

    monkeypatch.setattr(sim, "stream_wait_event", racing_wait_event)
    try:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.wait_complete)
                    await anyio.wait_all_tasks_blocked()  # parked: its launch is done
                    gate.set()
        assert len(threads) == 1
        threads[0].join(10)
        assert not threads[0].is_alive()
        assert side_streams.count(sim) == 1  # the other work stream's, which evicted ours
    finally:
        destroy_stream(sim, other)


async def test_a_failed_destroy_of_an_evicted_side_stream_does_not_fail_the_launch(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evicted side stream is destroyed after the host function is enqueued on the new one.
    If that destroy fails, the launch must still succeed: a launch that raised would have its
    C node freed while the host function that writes to it is queued."""
    from aiocudasem._driver._sim._status import _error
    from aiocudasem._notifier import _pools
    from aiocudasem._notifier._pools import destroy_stream, side_streams

    monkeypatch.setattr(_pools._SideStreams, "_LIMIT", 1)
    other = sim.stream_create(0, True, 0)
    sides: list[int] = []
    destroy = sim.stream_destroy

    def failing_destroy(stream: int) -> None:
        if stream == sides[0]:
            raise _error(400, "cuStreamDestroy")
        destroy(stream)

    try:
        async with acs.open_stream(driver=sim) as s:
            # open_stream() made the stream's side stream; gone again (as if evicted), it is
            # made at the launch, which evicts the other work stream's.
            side_streams.drop(sim, s.handle)
            side_streams.enqueue_on(sim, 0, other, sides.append)  # the side stream to be evicted
            monkeypatch.setattr(sim, "stream_destroy", failing_destroy)
            gate = hold(s)
            with (
                pytest.warns(RuntimeWarning, match="destroying an evicted side stream failed"),
                anyio.fail_after(10),
            ):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.wait_complete)  # parks: its launch evicts the other's
                    await anyio.wait_all_tasks_blocked()
                    gate.set()
    finally:
        monkeypatch.setattr(sim, "stream_destroy", destroy)
        destroy(sides[0])
        destroy_stream(sim, other)


async def test_a_stream_makes_its_side_stream_when_opened_or_adopted(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never in the middle of an await: creating a CUDA stream can block while host functions
    are queued behind work that cannot progress (see ``side_streams.ensure``). A wait that
    parks then creates no stream at all."""
    from aiocudasem import configure
    from aiocudasem._notifier import side_streams

    before = side_streams.count(sim)
    raw = sim.stream_create(0, True, 0)
    saved = configure()
    configure(spin_limit=0)  # every wait that finds work parks
    try:
        async with acs.open_stream(driver=sim) as s:
            assert side_streams.count(sim) == before + 1
            borrowed = acs.Stream.adopt(raw, driver=sim)
            assert side_streams.count(sim) == before + 2
            assert acs.Stream.adopt(raw, driver=sim) is not borrowed
            assert side_streams.count(sim) == before + 2  # the handle's, found again

            def no_new_streams(*args: object) -> int:
                raise AssertionError("a stream was created during a wait")

            monkeypatch.setattr(sim, "stream_create", no_new_streams)
            for stream in (s, borrowed):
                gate = hold(stream)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stream.wait_complete)
                    await until_parked()
                    gate.set()
            monkeypatch.undo()
            await borrowed.aclose()
    finally:
        configure(spin_limit=saved.spin_limit)
        destroy_stream(sim, raw)


async def test_a_stream_whose_side_stream_cannot_be_made_is_not_opened(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_stream() raises the driver's error and destroys the stream it created; adopt()
    raises it and leaves the foreign stream as it was."""
    from aiocudasem._driver._sim._status import _error

    raw = sim.stream_create(0, True, 0)
    create = sim.stream_create
    made: list[int] = []

    def first_only(ordinal: int, non_blocking: bool, priority: int) -> int:
        if made:
            raise _error(2, "cuStreamCreateWithPriority")  # out of memory, say
        made.append(create(ordinal, non_blocking, priority))
        return made[-1]

    destroyed: list[int] = []
    destroy = sim.stream_destroy

    def recording_destroy(stream: int) -> None:
        destroyed.append(stream)
        destroy(stream)

    monkeypatch.setattr(sim, "stream_create", first_only)
    monkeypatch.setattr(sim, "stream_destroy", recording_destroy)
    with pytest.raises(acs.CudaError, match="cuStreamCreate"):
        acs.open_stream(driver=sim)
    assert destroyed == made  # the work stream went with the failure
    made.append(0)  # every later creation fails
    with pytest.raises(acs.CudaError, match="cuStreamCreate"):
        acs.Stream.adopt(raw, driver=sim)
    assert sim.stream_query(raw)  # still the caller's, and usable
    monkeypatch.undo()
    sim.stream_destroy(raw)


async def test_the_work_stream_wake_makes_no_side_streams(sim: SimDriver) -> None:
    from aiocudasem import configure
    from aiocudasem._notifier import side_streams

    before = side_streams.count(sim)
    configure(wake="work_stream")
    try:
        async with acs.open_stream(driver=sim):
            assert side_streams.count(sim) == before
    finally:
        configure(wake=acs.Tuning().wake)


async def test_a_foreign_stream_awaited_once_gets_a_side_stream_only_if_it_parks(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wait_stream() and wait_external_semaphores() adopt a foreign stream for one wait: a
    wait that ends at its first query makes no side stream (a stream awaited once and then
    destroyed by its owner leaves none behind), and needs no stream creation to succeed."""
    from aiocudasem._notifier import side_streams

    before = side_streams.count(sim)
    for _ in range(5):
        h = sim.stream_create(0, True, 0)
        await acs.wait_stream(h, driver=sim)  # idle: done at its first query
        sim.stream_destroy(h)
    assert side_streams.count(sim) == before

    def refused(*args: object) -> int:
        raise acs.CudaError("refused", 2)

    h = sim.stream_create(0, True, 0)
    try:
        with monkeypatch.context() as m:
            m.setattr(sim, "stream_create", refused)
            await acs.wait_stream(h, driver=sim)  # needs no side stream, so none is made
        gate = hold(acs.Stream._adopt(h, sim, prepare=False))  # no side stream made here
        assert side_streams.count(sim) == before
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(acs.wait_stream, h, driver=sim))  # parks: made now
            await until_parked()
            assert side_streams.count(sim) == before + 1
            gate.set()
    finally:
        destroy_stream(sim, h)


async def test_each_new_semaphore_reserves_a_stream_and_restores_the_reserved_side_streams(
    sim: SimDriver,
) -> None:
    """One private stream per semaphore or timeline made (up to the 64 a device keeps), each
    with its side stream, which a later one restores if an eviction took it."""
    from aiocudasem._notifier import host_wait_streams, side_streams

    host_wait_streams._free.pop(sim, None)
    first = acs.create_host_timeline(driver=sim)
    (reserved,) = host_wait_streams._free[sim][0]
    side_streams.drop(sim, reserved)  # evicted meanwhile, say
    before = side_streams.count(sim)
    second = acs.create_host_timeline(driver=sim)
    free = host_wait_streams._free[sim][0]
    assert len(free) == 2 and free[0] == reserved
    assert side_streams.count(sim) == before + 2  # the new stream's, and the first's again
    made: list[int] = []
    side_streams.enqueue_on(sim, 0, reserved, made.append)
    assert side_streams.count(sim) == before + 2  # found, not made
    for _ in range(70):
        sem, _producer = import_sim_semaphore(sim)
        await sem.aclose()
    assert len(host_wait_streams._free[sim][0]) == 64  # no more than a device keeps
    await first.aclose()
    await second.aclose()


async def test_a_lone_host_side_wait_takes_a_stream_that_has_its_side_stream(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two overlapping host-side waits on one timeline: the second makes a private stream of
    its own, and both end while spinning, so that stream has no side stream when it goes back.
    A later lone wait that parks must take the reserved one, whose side stream exists, and
    make no stream."""
    from aiocudasem import configure
    from aiocudasem._notifier import host_wait_streams

    host_wait_streams._free.pop(sim, None)
    timeline = acs.create_host_timeline(driver=sim)
    saved = configure()
    try:
        configure(spin_limit=1.0)  # both waits end while spinning: no side stream for the second
        async with anyio.create_task_group() as tg:
            tg.start_soon(timeline.wait_value, 1)
            await anyio.sleep(0.01)
            tg.start_soon(timeline.wait_value, 2)  # a second private stream, made now
            await anyio.sleep(0.01)
            timeline.signal(1)
            await anyio.sleep(0.05)
            timeline.signal(2)
        assert len(host_wait_streams._free[sim][0]) == 2
        configure(spin_limit=0)  # the next wait parks

        def no_new_streams(*args: object) -> int:
            raise AssertionError("a stream was created during a wait")

        with monkeypatch.context() as m:
            m.setattr(sim, "stream_create", no_new_streams)
            async with anyio.create_task_group() as tg:
                tg.start_soon(timeline.wait_value, 10)
                await until_parked()
                timeline.signal(10)
    finally:
        configure(spin_limit=saved.spin_limit)
        timeline.signal(10)  # a wait that failed left its stream waiting for it
        with anyio.fail_after(5):
            await timeline.aclose()
