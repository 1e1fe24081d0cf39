"""wait_event(): awaiting a CUDA event that another library owns (PyTorch, CuPy, cuda.core or a
raw handle), on the simulated device. The objects below carry the attributes those libraries
expose (``cuda_event`` and ``device.index``, ``ptr``, ``handle`` and ``device.device_id``); the
GPU suite repeats the main cases with the libraries themselves."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier import side_streams
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import StallWatch

pytestmark = pytest.mark.anyio


class TorchLike:
    """What torch.cuda.Event shows: ``cuda_event`` (0 until the first record) and ``device``
    (a torch.device, None until the first record)."""

    class _Device:
        def __init__(self, index: int) -> None:
            self.type, self.index = "cuda", index

    def __init__(self, handle: int, device: int | None) -> None:
        self.cuda_event = handle
        self.device = None if device is None else self._Device(device)


class CupyLike:
    def __init__(self, handle: int) -> None:
        self.ptr = handle


class CUevent:
    """cuda-bindings' handle type: an object that converts with int()."""

    def __init__(self, value: int) -> None:
        self._value = value

    def __int__(self) -> int:
        return self._value


class CoreLike:
    """What a cuda.core Event shows: ``handle`` (a CUevent) and ``device.device_id``."""

    class _Device:
        def __init__(self, device_id: int) -> None:
            self.device_id = device_id

    def __init__(self, handle: int, device: int) -> None:
        self.handle = CUevent(handle)
        self.device = self._Device(device)


@pytest.fixture
def held(sim: SimDriver) -> Iterator[tuple[acs.Stream, int, object]]:
    """A stream held by a simulated kernel, and an event recorded behind that kernel (a raw
    handle of the driver, as another library would own it)."""
    stream = acs.open_stream(driver=sim)
    gate = hold(stream)
    event = sim.event_create(0)
    sim.event_record(event, stream.handle)
    yield stream, event, gate
    gate.set()  # type: ignore[attr-defined]
    stream.close()
    sim.event_destroy(event)


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda h: h, id="raw int"),
        pytest.param(lambda h: CUevent(h), id="CUevent"),
        pytest.param(lambda h: TorchLike(h, 0), id="torch"),
        pytest.param(lambda h: CupyLike(h), id="cupy"),
        pytest.param(lambda h: CoreLike(h, 0), id="cuda.core"),
    ],
)
async def test_waits_until_the_foreign_event_completes(
    sim: SimDriver, held: tuple[acs.Stream, int, object], wrap: object
) -> None:
    _, event, gate = held
    foreign = wrap(event)  # type: ignore[operator]
    woke: list[float] = []

    async def waiter() -> None:
        await acs.wait_event(foreign, driver=sim)
        woke.append(time.perf_counter())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            assert not woke, "returned before the event's work completed"
            assert not sim.event_query(event)
            released = time.perf_counter()
            gate.set()  # type: ignore[attr-defined]
    assert sim.event_query(event)
    assert woke[0] >= released


async def test_a_completed_or_never_recorded_event_returns_at_once(sim: SimDriver) -> None:
    event = sim.event_create(0)
    try:
        with anyio.fail_after(5):
            await acs.wait_event(event, driver=sim)  # created, never recorded: complete
            await acs.wait_event(TorchLike(0, None), driver=sim)  # PyTorch before record()
    finally:
        sim.event_destroy(event)


async def test_many_waiters_of_one_event_share_one_host_function(
    sim: SimDriver, held: tuple[acs.Stream, int, object]
) -> None:
    _, event, gate = held
    sides = side_streams.count(sim)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(lambda: acs.wait_event(event, driver=sim))
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            st = statistics()
            assert st.armed == 1, st
            assert st.parked == 50, st
            assert side_streams.count(sim) == sides + 1  # one side stream for the event
            gate.set()  # type: ignore[attr-defined]
    assert statistics().parked == 0


async def test_a_pending_event_does_not_delay_another(sim: SimDriver) -> None:
    """Each foreign event has its own chain and side stream: an event whose work never ends
    does not hold back the host function of one that completes."""
    slow = acs.open_stream(driver=sim)
    slow_gate = hold(slow)
    fast = acs.open_stream(driver=sim)
    fast_gate = hold(fast)
    pending, done = sim.event_create(0), sim.event_create(0)
    sim.event_record(pending, slow.handle)
    sim.event_record(done, fast.handle)
    try:
        with anyio.fail_after(10), StallWatch() as watch:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: acs.wait_event(pending, driver=sim))
                await anyio.wait_all_tasks_blocked()
                t0 = time.perf_counter()
                fast_gate.set()
                await acs.wait_event(done, driver=sim)
                took = time.perf_counter() - t0
                assert took < 0.5 + watch.stall, (took, watch.stall)
                tg.cancel_scope.cancel()
    finally:
        slow_gate.set()
        slow.close()
        fast.close()
        sim.event_destroy(pending)
        sim.event_destroy(done)


async def test_cancelling_abandons_the_wait_only(
    sim: SimDriver, held: tuple[acs.Stream, int, object]
) -> None:
    _, event, gate = held
    with anyio.move_on_after(0.05) as scope:
        await acs.wait_event(event, driver=sim)
    assert scope.cancelled_caught
    # The event and the loop are unharmed: a new wait still completes once the work does.
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: acs.wait_event(event, driver=sim))
            await anyio.sleep(0.02)
            gate.set()  # type: ignore[attr-defined]
    assert statistics().parked == 0


async def test_the_work_stream_wake_strategy_still_uses_a_side_stream(
    sim: SimDriver, held: tuple[acs.Stream, int, object]
) -> None:
    """configure(wake="work_stream") launches on the work stream, which a foreign event does
    not name: its host function still goes to a side stream."""
    _, event, gate = held
    acs.configure(wake="work_stream")
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: acs.wait_event(event, driver=sim))
                await anyio.sleep(0.02)
                gate.set()  # type: ignore[attr-defined]
    finally:
        acs.configure(wake=acs.Tuning().wake)


async def test_a_device_fault_ends_the_wait(sim: SimDriver, fault_watchdog: float) -> None:
    stream = acs.open_stream(1, driver=sim)
    hold(stream)
    event = sim.event_create(1)
    sim.event_record(event, stream.handle)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                with pytest.raises(acs.DeviceFaultError):
                    await acs.wait_event(TorchLike(event, 1), driver=sim)

            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            sim.inject_fault(1)
    with pytest.raises(acs.DeviceFaultError):
        await stream.aclose()  # released all the same


async def test_an_aiocudasem_event_is_awaited_as_itself(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        gate = hold(stream)
        ev = stream.record()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(acs.wait_event, ev)
                await anyio.sleep(0.02)
                gate.set()
        with pytest.raises(ValueError, match="without device= or driver="):
            await acs.wait_event(ev, device=0)
        ev.close()


async def test_an_unknown_handle_is_the_simulated_drivers_error(sim: SimDriver) -> None:
    with pytest.raises(acs.CudaError):
        await acs.wait_event(123456789, driver=sim)


async def test_bad_input_is_a_type_or_value_error(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    event = sim.event_create(0)
    try:
        async with acs.open_stream(driver=sim) as stream:
            cases: list[tuple[object, dict[str, object], type[Exception], str]] = [
                (stream, {}, TypeError, "wait_stream"),
                (sem, {}, TypeError, "not an event"),
                (True, {}, TypeError, "not a CUDA event|not a CUevent|cannot wait"),
                (1.5, {}, TypeError, "cannot wait for an instance of float"),
                ("0x1234", {}, TypeError, "cannot wait for an instance of str"),
                (0, {}, ValueError, "pointer"),
                (-5, {}, ValueError, "pointer"),
                (1 << 64, {}, ValueError, "pointer"),
                (CupyLike(0), {}, ValueError, "pointer"),
                (CupyLike("x"), {}, TypeError, "not a CUevent handle"),  # type: ignore[arg-type]
                (event, {"device": 5}, ValueError, "does not exist"),
                (event, {"device": -1}, ValueError, "does not exist"),
                (event, {"device": True}, TypeError, "int ordinal"),
                (TorchLike(event, 1), {"device": 0}, ValueError, "belongs to device 1"),
                (event, {"driver": 3}, TypeError, "driver must be"),
            ]
            for obj, kwargs, exc, match in cases:
                with pytest.raises(exc, match=match):
                    await acs.wait_event(obj, driver=kwargs.pop("driver", sim), **kwargs)  # type: ignore[arg-type]
    finally:
        sim.event_destroy(event)
        await sem.aclose()


async def test_a_cancelled_wait_does_not_hold_back_the_next_record(sim: SimDriver) -> None:
    """A wait abandoned while its host function is armed leaves that host function behind the
    old record. After the event is recorded again, a new wait must follow the new record, not
    queue behind the old one (which here never completes)."""
    slow = acs.open_stream(driver=sim)
    slow_gate = hold(slow)
    fast = acs.open_stream(driver=sim)
    fast_gate = hold(fast)
    ev = sim.event_create(0)
    try:
        sim.event_record(ev, slow.handle)
        with anyio.move_on_after(0.05) as scope:
            await acs.wait_event(ev, driver=sim)
        assert scope.cancelled_caught
        sim.event_record(ev, fast.handle)  # allowed: the earlier wait has returned
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: acs.wait_event(ev, driver=sim))
                await anyio.wait_all_tasks_blocked()
                assert statistics().parked == 1  # it parked on the new record
                fast_gate.set()
        assert sim.event_query(ev)
    finally:
        slow_gate.set()
        slow.close()
        fast.close()
        sim.event_destroy(ev)


def test_a_wait_abandoned_in_another_loop_does_not_hold_back_the_next_record() -> None:
    """The side streams outlive an event loop: the same holds across two runs."""
    sim = SimDriver()
    slow = acs.open_stream(driver=sim)
    slow_gate = hold(slow)
    fast = acs.open_stream(driver=sim)
    ev = sim.event_create(0)

    async def abandon() -> None:
        with anyio.move_on_after(0.05):
            await acs.wait_event(ev, driver=sim)

    async def wait_new_record() -> None:
        fast_gate = hold(fast)
        sim.event_record(ev, fast.handle)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: acs.wait_event(ev, driver=sim))
                await anyio.sleep(0.02)
                fast_gate.set()

    try:
        sim.event_record(ev, slow.handle)
        anyio.run(abandon)
        anyio.run(wait_new_record)
        assert sim.event_query(ev)
    finally:
        slow_gate.set()
        slow.close()
        fast.close()
        sim.event_destroy(ev)
