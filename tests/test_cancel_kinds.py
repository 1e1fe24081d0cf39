"""Cancelling many waits of every kind, on the simulated device: each cancellation is cheap,
the streams of abandoned waits are reused once their work completes instead of a stream being
made per wait, and side streams, threads and pooled events are back where they were once the
work has completed."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore

pytestmark = pytest.mark.anyio

KINDS = [
    "Stream.wait_complete",
    "Event.wait",
    "ExternalSemaphore.wait_value",
    "HostTimeline.wait_value",
    "wait_event",
    "IpcEvent.wait",
    "ready",
]


class Producer:
    """An array whose pending work is a simulated kernel on ``stream`` (see test_dlpack)."""

    def __init__(self, sim: SimDriver, stream: acs.Stream) -> None:
        self.sim, self.stream = sim, stream

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        ev = self.sim.event_create(0)
        self.sim.event_record(ev, self.stream.handle)
        self.sim.stream_wait_event(stream, ev)  # type: ignore[arg-type]
        self.sim.event_destroy(ev)
        return object()


class Pending:
    """A wait of one kind on work that stays pending until :meth:`release`; :meth:`renew`
    makes new pending work of the same kind."""

    def __init__(self, sim: SimDriver, kind: str, stream: acs.Stream) -> None:
        self.sim, self.kind, self.stream = sim, kind, stream
        self.value = 0
        self.closers: list[Callable[[], Awaitable[None]]] = []
        self.wait: Callable[[], Awaitable[None]]
        self.gate: threading.Event | None = None
        if kind == "ExternalSemaphore.wait_value":
            self.sem, self.producer = import_sim_semaphore(sim)
            self.closers.append(self.sem.aclose)
        elif kind == "HostTimeline.wait_value":
            self.timeline = acs.create_host_timeline(driver=sim)
            self.closers.append(self.timeline.aclose)
        elif kind == "wait_event":
            self.event = sim.event_create(0)
        elif kind == "IpcEvent.wait":
            self.ipc = acs.create_ipc_event(driver=sim)
            self.closers.append(self.ipc.aclose)
        self.renew()

    def renew(self) -> None:
        self.gate = hold(self.stream)
        self.value += 1
        kind = self.kind
        if kind == "Stream.wait_complete":
            self.wait = self.stream.wait_complete
        elif kind == "Event.wait":
            self.wait = self.stream.record().wait
        elif kind == "ExternalSemaphore.wait_value":
            self.wait = lambda v=self.value: self.sem.wait_value(v)
        elif kind == "HostTimeline.wait_value":
            self.wait = lambda v=self.value: self.timeline.wait_value(v)
        elif kind == "wait_event":
            self.sim.event_record(self.event, self.stream.handle)
            self.wait = lambda: acs.wait_event(self.event, driver=self.sim)
        elif kind == "IpcEvent.wait":
            self.ipc.record(self.stream)
            self.wait = self.ipc.wait
        else:
            x = Producer(self.sim, self.stream)
            self.wait = lambda: acs.ready(x, driver=self.sim)

    def release(self) -> None:
        assert self.gate is not None
        self.gate.set()
        if self.kind == "ExternalSemaphore.wait_value":
            self.producer.signal(self.value)
        elif self.kind == "HostTimeline.wait_value":
            self.timeline.signal(self.value)

    async def aclose(self) -> None:
        for close in self.closers:
            await close()
        if self.kind == "wait_event":
            self.sim.event_destroy(self.event)


@asynccontextmanager
async def pending(sim: SimDriver, kind: str) -> AsyncIterator[Pending]:
    async with acs.open_stream(driver=sim) as stream:
        p = Pending(sim, kind, stream)
        try:
            yield p
        finally:
            p.release()
            await p.aclose()


async def cancel_once(wait: Callable[[], Awaitable[None]]) -> None:
    """Start ``wait``, let it park (or give up on that after 50 ms), and cancel it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        give_up = time.perf_counter() + 0.05
        while statistics().parked == 0 and time.perf_counter() < give_up:
            await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()


async def complete_one(p: Pending) -> None:
    """A wait of the same kind that parks and completes: the work has progressed."""
    p.release()
    p.renew()

    async def release_later() -> None:
        await anyio.sleep(0.01)
        p.release()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(release_later)
            await p.wait()


def count_creations(sim: SimDriver, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []
    create = sim.stream_create

    def counting(ordinal: int, non_blocking: bool, priority: int) -> int:
        handle = create(ordinal, non_blocking, priority)
        made.append(handle)
        return handle

    monkeypatch.setattr(sim, "stream_create", counting)
    return made


@pytest.mark.parametrize("kind", KINDS)
async def test_many_cancelled_waits_are_cheap_and_leave_nothing_behind(
    sim: SimDriver, kind: str
) -> None:
    """Waits cancelled while their work is pending: quick, and once the work completes the
    side streams, threads and pooled events are back to what they were."""
    n = 300
    async with acs.open_stream(driver=sim) as warm:
        await warm.wait_complete()  # the notifier and the first pooled event
    async with pending(sim, kind) as p:
        await complete_one(p)  # what a completed wait of this kind keeps
        gc.collect()
        before, threads = statistics(), threading.active_count()
        p.release()
        p.renew()
        started = time.perf_counter()
        with anyio.fail_after(30):
            for _ in range(n):
                await cancel_once(p.wait)
        took = time.perf_counter() - started
        await complete_one(p)
        # Spare side streams go at the first completed wait that finds them idle (sweeps are
        # at most one per 5 ms), and the simulator's worker threads end once their streams
        # have nothing left to run.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            threading.active_count() > threads or statistics().side_streams > before.side_streams
        ):
            await anyio.sleep(0.02)
            await complete_one(p)
        after = statistics()
        assert took < n * 0.01, f"{n} cancellations took {took:.2f} s"
        assert after.side_streams <= before.side_streams, (before, after)
        assert after.pooled_events <= before.pooled_events + 1, (before, after)
        assert threading.active_count() <= threads
        assert after.parked == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancelled_waits_stream_is_reused_once_its_work_completes(
    sim: SimDriver, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait cancelled, its work completed, and again, as a loop of waits with a timeout
    does: no stream is made per wait (on a GPU, creating a stream is slow, and can block while
    host functions are queued behind blocked work)."""
    n = 200
    async with pending(sim, kind) as p:
        await complete_one(p)
        made = count_creations(sim, monkeypatch)
        started = time.perf_counter()
        with anyio.fail_after(30):
            for _ in range(n):
                p.release()
                await p.stream.wait_complete()
                p.renew()
                await cancel_once(p.wait)
        took = time.perf_counter() - started
        await complete_one(p)
        assert len(made) <= 4, f"{len(made)} streams made for {n} cancelled waits"
        assert took < n * 0.02, f"{n} cancellations took {took:.2f} s"


@pytest.mark.parametrize("kind", ["semaphore", "host timeline"])
async def test_retries_of_an_unreached_value_share_one_stream(
    sim: SimDriver, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that waits for a value with a timeout and tries again, while the producer is
    late: each retry goes behind the abandoned wait's stream instead of making a new one."""
    if kind == "semaphore":
        obj, producer = import_sim_semaphore(sim)
        signal = producer.signal
    else:
        obj = acs.create_host_timeline(driver=sim)
        signal = obj.signal
    async with obj:
        made = count_creations(sim, monkeypatch)
        with anyio.fail_after(30):
            for _ in range(100):
                with anyio.move_on_after(0.002):
                    await obj.wait_value(5)
            signal(5)
            await obj.wait_value(5)
        assert len(made) <= 2, f"{len(made)} streams made for 100 retries of one value"
