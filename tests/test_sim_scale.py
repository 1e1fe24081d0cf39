"""The simulated device at scale: what many blocked or abandoned waits cost it.

Users and CI run pipelines on the simulator with hundreds of parked waits; each one must cost
nothing while nothing happens, and a state change must reach only the waits it concerns.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _hostword
from aiocudasem.lowlevel import SemaphoreDesc, SemOp
from aiocudasem.testing import SimDriver, SimProducer, hold, import_sim_semaphore

TIMEOUT = 10.0
TIMELINE_FD = 9  # CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD


def sim_threads(sim: SimDriver) -> int:
    """How many threads the simulator ``sim`` is running (its stream workers among them)."""
    prefix = f"aiocudasem-sim-{id(sim):x}-"
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


def until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    """Poll ``condition()`` until true or ``timeout``; return its last value."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(0.01)
    return True


# ------------------------------------------------------------------ abandoned host timeline waits


@pytest.mark.anyio
async def test_abandoned_host_timeline_waits_cost_no_cpu_at_idle(sim: SimDriver) -> None:
    """A cancelled ``wait_value()`` leaves a GPU wait on the word enqueued for good; 64 of them
    must not keep a core busy, nor slow the device's other work down."""
    timeline = acs.create_host_timeline(0, driver=sim)
    async with anyio.create_task_group() as tg:
        for i in range(64):

            async def abandon(target: int = 100 + i) -> None:
                with anyio.move_on_after(0.05):
                    await timeline.wait_value(target)

            tg.start_soon(abandon)
    await anyio.sleep(0.3)  # past any fast polling of young waits
    cpu, wall = time.process_time(), time.monotonic()
    await anyio.sleep(1.0)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    print(f"64 abandoned host timeline waits: {100 * cpu / wall:.1f} % of a core at idle")
    assert cpu / wall < 0.15

    stream = acs.open_stream(driver=sim)
    started = time.perf_counter()
    for _ in range(20):
        sim.launch(stream.handle, lambda: time.sleep(100e-6))
        await stream.wait_complete()
    each = (time.perf_counter() - started) / 20
    print(f"a 100 us kernel plus its wait beside them: {each * 1e3:.2f} ms")
    assert each < 0.025
    await stream.aclose()
    timeline.signal(10_000)  # let the waits go, so that the timeline can be released
    with anyio.fail_after(TIMEOUT):
        await timeline.aclose()


def test_a_word_wait_notices_a_store_it_was_not_told_of() -> None:
    """Another process may write a shared host timeline: the simulator, like a GPU, must see
    the store without being told, also after waiting for a long time."""
    sim = SimDriver()
    word = ctypes.c_uint64(0)
    address = ctypes.addressof(word)
    sim.host_register(0, address, 8)
    stream = sim.stream_create(0, True, 0)
    sim.enqueue_wait_value64(stream, address, 5)
    time.sleep(0.5)
    assert not sim.stream_query(stream)
    _hostword.store(address, 5)  # a plain store: what a peer process's signal is, here
    assert until(lambda: sim.stream_query(stream), 2.0)
    sim.stream_destroy(stream)
    sim.host_unregister(address)


def test_an_in_process_store_wakes_a_word_wait_at_once() -> None:
    """A store the simulator makes or is told of completes the waits on the word before the
    call returns, however long they have waited (their polls have slowed down by then)."""
    sim = SimDriver()
    word = ctypes.c_uint64(0)
    address = ctypes.addressof(word)
    sim.host_register(0, address, 8)
    waiting, writer = sim.stream_create(0, True, 0), sim.stream_create(0, True, 0)
    sim.enqueue_wait_value64(waiting, address, 1)
    time.sleep(0.3)
    sim.enqueue_write_value64(writer, address, 1)
    sim.stream_synchronize(writer)
    assert sim.stream_query(waiting)
    sim.enqueue_wait_value64(waiting, address, 2)
    time.sleep(0.3)
    _hostword.store(address, 2)
    sim.notify_word(address)
    assert sim.stream_query(waiting)
    with pytest.raises(TypeError):
        sim.notify_word("0x10")  # type: ignore[arg-type]
    for s in (waiting, writer):
        sim.stream_destroy(s)
    sim.host_unregister(address)


# ------------------------------------------------------------------ one wake per change


def test_a_signal_wakes_only_the_streams_that_wait_on_its_semaphore(sim: SimDriver) -> None:
    """500 streams blocked on one semaphore; 200 signal-and-wait cycles on another semaphore
    must not each wake the 500."""
    parked = sim.create_semaphore()
    busy = sim.create_semaphore()
    handles = [sim.import_semaphore(0, _desc(p)) for p in (parked, busy)]
    streams = [sim.stream_create(0, True, 0) for _ in range(500)]
    for s in streams:
        sim.enqueue_semaphore_waits([SemOp(handles[0], 1)], s)
    worker = sim.stream_create(0, True, 0)
    time.sleep(0.2)
    started = time.perf_counter()
    for i in range(1, 201):
        sim.enqueue_semaphore_waits([SemOp(handles[1], i)], worker)
        busy.signal(i)
        sim.stream_synchronize(worker)
    elapsed = time.perf_counter() - started
    print(f"200 cycles beside 500 blocked streams: {elapsed * 1e3:.0f} ms")
    assert elapsed < 1.0
    parked.signal(1)
    for s in streams:
        sim.stream_synchronize(s)
        sim.stream_destroy(s)
    sim.stream_destroy(worker)


def _desc(producer: SimProducer) -> SemaphoreDesc:
    return SemaphoreDesc(handle_type=TIMELINE_FD, fd=producer.export_fd())


@pytest.mark.anyio
@pytest.mark.usefixtures("fault_watchdog")
async def test_a_fault_reaches_1000_parked_host_waiters_quickly(sim: SimDriver) -> None:
    sem, _producer = import_sim_semaphore(sim)
    woken: list[float] = []

    async def wait() -> None:
        with pytest.raises(acs.DeviceFaultError):
            await sem.wait_value(1)
        woken.append(time.perf_counter())

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for _ in range(1000):
                tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.2)
            started = time.perf_counter()
            sim.inject_fault(0)
    await sem.aclose()  # the semaphore went with the context: closing still succeeds
    assert len(woken) == 1000
    latency = max(woken) - started
    print(f"a fault reached 1,000 parked host waiters in {latency * 1e3:.0f} ms")
    assert latency <= 1.0


# ------------------------------------------------------------------ threads


def test_a_destroyed_stream_leaves_no_thread_once_its_work_is_done(sim: SimDriver) -> None:
    producer = sim.create_semaphore()
    handle = sim.import_semaphore(0, _desc(producer))
    before = sim_threads(sim)
    streams = [sim.stream_create(0, True, 0) for _ in range(50)]
    for s in streams:
        sim.launch(s, lambda: None)
        sim.enqueue_semaphore_waits([SemOp(handle, 1)], s)
        sim.stream_destroy(s)
    producer.signal(1)
    assert until(lambda: sim_threads(sim) <= before), sim_threads(sim)
    with sim._lock:
        assert not any(h in sim._streams for h in streams)  # nor any state


def test_a_blocked_destroyed_stream_costs_no_thread(sim: SimDriver) -> None:
    producer = sim.create_semaphore()
    handle = sim.import_semaphore(0, _desc(producer))
    before = sim_threads(sim)
    done: list[int] = []
    streams = [sim.stream_create(0, True, 0) for _ in range(50)]
    for n, s in enumerate(streams):
        sim.enqueue_semaphore_waits([SemOp(handle, 1)], s)
        sim.launch(s, lambda n=n: done.append(n))  # type: ignore[misc]
        sim.stream_destroy(s)
    assert until(lambda: sim_threads(sim) <= before), sim_threads(sim)
    assert not done
    producer.signal(1)  # the work behind the waits still runs, each on its stream's thread
    assert until(lambda: len(done) == 50)
    assert sorted(done) == list(range(50))
    assert until(lambda: sim_threads(sim) <= before), sim_threads(sim)


def test_an_idle_stream_keeps_no_thread(sim: SimDriver) -> None:
    before = sim_threads(sim)
    streams = [sim.stream_create(0, True, 0) for _ in range(50)]
    for s in streams:
        sim.launch(s, lambda: None)
    for s in streams:
        sim.stream_synchronize(s)
    assert until(lambda: sim_threads(sim) <= before), sim_threads(sim)
    ran: list[int] = []
    sim.launch(streams[0], lambda: ran.append(1))  # and the stream still works
    sim.stream_synchronize(streams[0])
    assert ran == [1]
    for s in streams:
        sim.stream_destroy(s)


@pytest.mark.anyio
async def test_cancelled_wait_events_leave_no_simulator_threads(sim: SimDriver) -> None:
    before = sim_threads(sim)
    stream = acs.open_stream(driver=sim)
    gate = hold(stream)
    events = [sim.event_create(0) for _ in range(1000)]
    for ev in events:
        sim.event_record(ev, stream.handle)
    async with anyio.create_task_group() as tg:
        for ev in events:

            async def wait(ev: int = ev) -> None:
                with anyio.move_on_after(0.1):
                    await acs.wait_event(ev, driver=sim)

            tg.start_soon(wait)
    gate.set()
    with anyio.fail_after(TIMEOUT):
        await stream.wait_complete()
    await stream.aclose()
    with anyio.fail_after(TIMEOUT):
        while sim_threads(sim) > before:
            await anyio.sleep(0.02)
    for ev in events:
        sim.event_destroy(ev)
