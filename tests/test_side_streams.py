"""The side streams shared by every loop of the process: one thread's eviction never destroys a
side stream that another thread has taken and not yet enqueued on."""

from __future__ import annotations

import threading

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold

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
    from aiocudasem._driver._sim import _error
    from aiocudasem._notifier import _pools
    from aiocudasem._notifier._pools import destroy_stream, side_streams

    monkeypatch.setattr(_pools._SideStreams, "_LIMIT", 1)
    other = sim.stream_create(0, True, 0)
    sides: list[int] = []
    side_streams.enqueue_on(sim, 0, other, sides.append)  # the side stream to be evicted
    destroy = sim.stream_destroy

    def failing_destroy(stream: int) -> None:
        if stream == sides[0]:
            raise _error(400, "cuStreamDestroy")
        destroy(stream)

    monkeypatch.setattr(sim, "stream_destroy", failing_destroy)
    try:
        async with acs.open_stream(driver=sim) as s:
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
