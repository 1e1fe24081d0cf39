from __future__ import annotations

import gc
import threading

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold

pytestmark = pytest.mark.anyio


async def test_wait_complete_waits_for_enqueued_work(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        ran: list[int] = []
        gate = hold(s)
        sim.launch(s.handle, lambda: ran.append(1))
        assert not s.query()
        with anyio.move_on_after(0.02):
            await s.wait_complete()
        assert ran == []  # still gated: the wait did not return early
        gate.set()
        with anyio.fail_after(5):
            await s.wait_complete()
        assert ran == [1]
        assert s.query()


async def test_wait_complete_on_idle_stream_is_a_checkpoint(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await s.wait_complete()
            pytest.fail("a cancelled scope must stop wait_complete")  # pragma: no cover
        assert scope.cancelled_caught


async def test_wait_complete_records_an_event_only_on_a_busy_stream(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle stream has completed everything enqueued so far: the await is a checkpoint and
    records nothing. A busy one records an event and waits for exactly that work."""
    records: list[int] = []
    record = sim.event_record

    def counting(event: int, stream: int) -> None:
        records.append(stream)
        record(event, stream)

    monkeypatch.setattr(sim, "event_record", counting)
    async with acs.open_stream(driver=sim) as s:
        with anyio.fail_after(5):
            await s.wait_complete()
        assert records == []  # not the stream's, nor the watchdog's: nothing parked
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.sleep(0.05)
            # (The watchdog records its own event on the side stream, behind the parked wait.)
            assert [h for h in records if h == s.handle] == [s.handle]
            assert not s.query()  # still waiting for the held kernel
            gate.set()
        assert s.query()


@pytest.mark.parametrize("phase", ["parked", "spinning"])
async def test_wait_complete_never_waits_for_work_enqueued_after_it_parked(
    sim: SimDriver, phase: str
) -> None:
    """The event of a busy stream's wait is recorded after the first checkpoint, before the
    wait parks or spins on it (in C on asyncio): work enqueued once the waiter sleeps, or while
    it spins, does not delay it. A spinner's place and its event come back when it ends."""
    from aiocudasem.lowlevel import statistics

    acs.configure(spin_limit=30.0 if phase == "spinning" else acs.Tuning().spin_limit)
    try:
        async with acs.open_stream(driver=sim) as s:
            free = len(s._events)
            gate = hold(s)
            woke = anyio.Event()

            async def waiter() -> None:
                await s.wait_complete()
                woke.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter)
                if phase == "parked":
                    await anyio.wait_all_tasks_blocked()
                else:
                    for _ in range(5):
                        await anyio.lowlevel.checkpoint()  # the waiter spins meanwhile
                    assert statistics().spinning == 1 and statistics().parked == 0
                later = hold(s)  # enqueued while the waiter is parked, or spins
                gate.set()
                with anyio.fail_after(5):
                    await woke.wait()
                assert not s.query()  # the later work still runs: the wait did not cover it
                assert statistics().spinning == 0
                later.set()
            if phase == "spinning":
                assert len(s._events) == max(free, 1)  # its event is back in the pool
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_wait_complete_fails_clearly_if_another_task_closes_the_stream(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed by another task during the wait's first checkpoint: the wait raises
    ClosedResourceError instead of querying a destroyed stream's handle. The close is made
    from inside that checkpoint, so that it comes after the wait started: here on the loops
    whose checkpoint wait_complete() delegates to (trio), below on asyncio's bare one."""
    from aiocudasem._notifier import current_notifier

    notifier = current_notifier()
    if notifier.bare_yield:
        pytest.skip("asyncio's bare checkpoint: the test below")
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    checkpoint = notifier.checkpoint

    async def closing_checkpoint() -> None:
        s.close()  # another task's close, while this one is at its checkpoint
        await checkpoint()

    monkeypatch.setattr(notifier, "checkpoint", closing_checkpoint)  # read at each wait
    try:
        with anyio.fail_after(5), pytest.raises(anyio.ClosedResourceError, match="closed"):
            await s.wait_complete()
    finally:
        monkeypatch.undo()
        gate.set()


async def test_wait_complete_fails_clearly_if_closed_during_asyncio_s_bare_checkpoint(
    sim: SimDriver, anyio_backend_name: str
) -> None:
    """The same on asyncio's own path, where the checkpoint and the first query are one C
    awaitable: a callback queued before the wait yields runs during its checkpoint."""
    if anyio_backend_name != "asyncio":
        pytest.skip("the C checkpoint is asyncio's")
    import asyncio

    from aiocudasem._notifier import current_notifier

    assert current_notifier().bare_yield
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    queried: list[int] = []
    query = sim.stream_query

    def counting(h: int) -> bool:
        queried.append(h)
        return query(h)

    sim.stream_query = counting  # type: ignore[method-assign]
    try:
        asyncio.get_running_loop().call_soon(s.close)
        with anyio.fail_after(5), pytest.raises(anyio.ClosedResourceError, match="closed"):
            await s.wait_complete()
        assert queried == []  # the destroyed handle was never queried
    finally:
        del sim.stream_query
        gate.set()


async def test_concurrent_acloses_of_an_owned_stream_both_return(sim: SimDriver) -> None:
    """aclose() is idempotent across tasks too: the one that finds the stream closed by the
    other while it waited returns instead of raising."""
    s = acs.open_stream(driver=sim)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.aclose)
            tg.start_soon(s.aclose)
    assert s.closed
    s2 = acs.open_stream(driver=sim)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(s2.aclose)
            await anyio.lowlevel.checkpoint()
            s2.close()  # a plain close racing the aclose
    assert s2.closed


async def test_event_wait_and_query(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        ev = s.record()
        after = hold(s)  # work after the record must not delay the event
        assert not ev.query()
        gate.set()
        with anyio.fail_after(5):
            await ev.wait()
        assert ev.query()
        assert not s.query()
        after.set()
        ev.close()
        ev.close()  # idempotent
        assert ev.closed
        with pytest.raises(anyio.ClosedResourceError):
            await ev.wait()


async def test_many_waiters_on_one_event_share_one_notification(sim: SimDriver) -> None:
    from aiocudasem.lowlevel import statistics

    acs.configure(spin_limit=0)
    try:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            ev = s.record()
            woke = 0

            async def waiter() -> None:
                nonlocal woke
                await ev.wait()
                woke += 1

            before = statistics().fired
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(waiter)
                await anyio.wait_all_tasks_blocked()
                gate.set()
            assert woke == 50
            assert statistics().fired - before == 1
            ev.close()
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_wait_event_orders_two_streams(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        order: list[str] = []
        gate = hold(a)
        sim.launch(a.handle, lambda: order.append("a"))
        ev = a.record()
        b.enqueue_event_wait(ev)
        sim.launch(b.handle, lambda: order.append("b"))
        gate.set()
        with anyio.fail_after(5):
            await b.wait_complete()
        assert order == ["a", "b"]
        ev.close()
        with pytest.raises(TypeError, match="Event"):
            b.enqueue_event_wait(object())  # type: ignore[arg-type]


async def test_stream_protocol_and_properties(sim: SimDriver) -> None:
    s = acs.open_stream(1, priority=-1, non_blocking=False, driver=sim)
    assert s.device == 1
    assert s.owned
    assert s.driver is sim
    assert s.__cuda_stream__() == (0, s.handle)
    assert "owned" in repr(s)
    await s.aclose()
    await s.aclose()  # idempotent
    assert s.closed
    assert "closed" in repr(s)
    with pytest.raises(anyio.ClosedResourceError):
        s.handle  # noqa: B018
    with pytest.raises(anyio.ClosedResourceError):
        await s.wait_complete()
    with pytest.raises(anyio.ClosedResourceError):
        s.query()


class _Foreign:
    """Stands in for a cuda.core / CuPy / PyTorch stream."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


async def test_adopt_foreign_stream_borrows_it(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as owner:
        borrowed = acs.Stream.adopt(_Foreign(owner.handle), driver=sim)
        assert not borrowed.owned
        assert borrowed.handle == owner.handle
        assert acs.Stream.adopt(owner) is owner
        gate = hold(owner)
        gate.set()
        with anyio.fail_after(5):
            await borrowed.wait_complete()
            await acs.wait_stream(_Foreign(owner.handle), driver=sim)
            await acs.wait_stream(owner.handle, driver=sim)
        await borrowed.aclose()
        # Closing the borrowed one leaves the owner's stream alive.
        assert owner.query()
        with anyio.fail_after(5):
            await owner.wait_complete()


async def test_adopt_raw_legacy_default_stream(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default streams (0, 1, 2) always record their event, idle or not: on the legacy
    stream it also waits for every blocking stream, which a query of it may not."""
    records: list[int] = []
    record = sim.event_record
    monkeypatch.setattr(sim, "event_record", lambda e, h: (records.append(h), record(e, h)))
    s = acs.Stream.adopt(0, driver=sim)
    assert s.device == 0
    with anyio.fail_after(5):
        await s.wait_complete()
        await s.wait_complete()
    assert records.count(0) == 2
    await s.aclose()


@pytest.mark.parametrize(
    ("obj", "exc"),
    [
        ("stream", TypeError),
        (1.5, TypeError),
        (True, TypeError),
        (-1, ValueError),
        (2**64, ValueError),  # was CudaError 400 from the driver
        (type("Bad", (), {"__cuda_stream__": lambda self: 7})(), TypeError),
        (_Foreign(-1), ValueError),
        (_Foreign(2**64), ValueError),
    ],
)
async def test_adopt_rejects_non_streams(sim: SimDriver, obj: object, exc: type) -> None:
    with pytest.raises(exc):
        acs.Stream.adopt(obj, driver=sim)


class _Versioned:
    def __init__(self, version: int, handle: int) -> None:
        self.version = version
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


async def test_adopt_checks_the_protocol_version(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as owner:
        with pytest.raises(ValueError, match="protocol version 1: only version 0"):
            acs.Stream.adopt(_Versioned(1, owner.handle), driver=sim)
        borrowed = acs.Stream.adopt(_Versioned(0, owner.handle), driver=sim)
        assert borrowed.handle == owner.handle
        await borrowed.aclose()


class _Broken:
    def __cuda_stream__(self) -> tuple[int, int]:
        raise RuntimeError("the stream was released")


async def test_adopt_chains_an_error_of_the_protocol(sim: SimDriver) -> None:
    with pytest.raises(ValueError, match="_Broken as a CUDA stream: its __cuda_stream__") as info:
        acs.Stream.adopt(_Broken(), driver=sim)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "the stream was released" in str(info.value)


async def test_adopt_refuses_a_closed_stream_and_another_driver(sim: SimDriver) -> None:
    other = SimDriver()
    s = acs.open_stream(driver=sim)
    with pytest.raises(acs.DeviceMismatchError, match="driver object at") as info:
        acs.Stream.adopt(s, driver=other)
    assert f"{id(sim):#x}" in str(info.value)
    assert f"{id(other):#x}" in str(info.value)
    assert acs.Stream.adopt(s, driver=sim) is s
    await s.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        acs.Stream.adopt(s)


async def test_adopt_unknown_handle_is_a_cuda_error(sim: SimDriver) -> None:
    with pytest.raises(acs.CudaError) as info:
        acs.Stream.adopt(0xDEAD0, driver=sim)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"device": 2}, ValueError),
        ({"device": -1}, ValueError),
        ({"device": "0"}, TypeError),
        ({"device": True}, TypeError),
        ({"priority": 1.0}, TypeError),
        ({"non_blocking": 1}, TypeError),
        ({"driver": 42}, TypeError),
        ({"driver": "opencl"}, ValueError),
    ],
)
async def test_open_stream_bad_input(sim: SimDriver, kwargs: dict[str, object], exc: type) -> None:
    kwargs.setdefault("driver", sim)
    with pytest.raises(exc):
        acs.open_stream(**kwargs)  # type: ignore[arg-type]


async def test_no_public_constructors() -> None:
    with pytest.raises(TypeError, match="open_stream"):
        acs.Stream()
    with pytest.raises(TypeError, match="record"):
        acs.Event()
    with pytest.raises(TypeError, match="import_semaphore"):
        acs.ExternalSemaphore()


async def test_exit_on_error_destroys_without_waiting(sim: SimDriver) -> None:
    gate = None
    with pytest.raises(KeyError):
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            raise KeyError("body failed")
    assert s.closed  # destroyed at once although its work is still gated
    assert gate is not None
    gate.set()


async def test_forgotten_stream_warns_and_is_destroyed(sim: SimDriver) -> None:
    s = acs.open_stream(driver=sim)
    handle = s.handle
    with pytest.warns(ResourceWarning, match="aclose"):
        del s
        gc.collect()
    # The collector only queued the release; the library's next use performs it.
    sim.stream_query(handle)
    async with acs.open_stream(driver=sim):
        pass
    with pytest.raises(acs.CudaError):
        sim.stream_query(handle)


@pytest.mark.parametrize("lock", ["driver", "side streams"])
def test_collection_inside_a_locked_section_does_not_deadlock(sim: SimDriver, lock: str) -> None:
    """The collector runs finalizers in whichever thread allocates, possibly one that holds
    the driver's (non-reentrant) lock or the side-stream table's. A finalizer that took such a
    lock would deadlock that thread; it must only queue the release."""
    from aiocudasem import _release
    from aiocudasem._notifier import side_streams

    held = sim._lock if lock == "driver" else side_streams._lock
    stream = acs.open_stream(driver=sim)
    cycle: list[object] = [stream, stream.record()]
    del stream
    cycle.append(cycle)  # reachable only through a cycle, as a stored traceback makes it
    del cycle
    done = threading.Event()

    def collect_while_holding() -> None:
        with held:
            gc.collect()
        done.set()

    with pytest.warns(ResourceWarning):
        t = threading.Thread(target=collect_while_holding, daemon=True)
        t.start()
        t.join(5)
    assert done.is_set(), "a finalizer blocked on a lock its own thread holds"
    assert _release.pending() >= 1
    _release.flush()
    assert _release.pending() == 0
