from __future__ import annotations

import gc
import os
import sys

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore

pytestmark = pytest.mark.anyio

U64 = 2**64


# ---------------------------------------------------------------- import and fd ownership


async def test_import_takes_the_fd_on_success(sim: SimDriver) -> None:
    producer = sim.create_semaphore(timeline=True)
    fd = producer.export_fd()
    sem = acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=sim)
    with pytest.raises(OSError):
        os.fstat(fd)  # the driver owns it now, and closed it
    assert sem.is_timeline
    assert sem.handle_type is acs.HandleType.TIMELINE_SEMAPHORE_FD
    assert sem.device == 0
    await sem.aclose()
    await sem.aclose()
    assert sem.closed
    with pytest.raises(anyio.ClosedResourceError):
        sem.handle  # noqa: B018


async def test_failed_import_leaves_the_fd_with_the_caller(sim: SimDriver) -> None:
    producer = sim.create_semaphore(timeline=True)
    fd = producer.export_fd()
    # A timeline fd imported as a binary semaphore: the driver refuses it.
    with pytest.raises(acs.CudaError) as info:
        acs.import_semaphore(acs.HandleType.OPAQUE_FD, fd, driver=sim)
    assert info.value.status == 1
    os.fstat(fd)  # still open, still ours
    sem = acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=sim)
    await sem.aclose()


async def test_import_of_a_foreign_fd_fails_and_keeps_it(sim: SimDriver) -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(acs.CudaError, match=f"fd {r} is not a semaphore exported as OPAQUE_FD"):
            acs.import_semaphore(acs.HandleType.OPAQUE_FD, r, driver=sim)
        os.fstat(r)
    finally:
        os.close(r)
        os.close(w)


async def test_import_of_a_closed_fd_is_a_value_error(sim: SimDriver) -> None:
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(ValueError, match="not an open file descriptor"):
        acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, r, driver=sim)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc"),
    [
        ((99, 3), {}, ValueError),
        ((True, 3), {}, TypeError),
        ((acs.HandleType.OPAQUE_FD, "3"), {}, TypeError),
        ((acs.HandleType.OPAQUE_FD, -1), {}, ValueError),
        ((acs.HandleType.OPAQUE_FD, None), {}, TypeError),
        ((acs.HandleType.OPAQUE_FD, 0), {"name": "x"}, ValueError),
        ((acs.HandleType.OPAQUE_FD, 0), {"device": -1}, ValueError),
        ((acs.HandleType.NVSCISYNC, 0), {}, ValueError),
        ((acs.HandleType.NVSCISYNC, 1), {"name": "x"}, ValueError),
    ],
)
async def test_import_bad_input(
    sim: SimDriver, args: tuple[object, ...], kwargs: dict[str, object], exc: type
) -> None:
    with pytest.raises(exc):
        acs.import_semaphore(*args, driver=sim, **kwargs)  # type: ignore[arg-type]


async def test_import_on_a_missing_device(sim: SimDriver) -> None:
    producer = sim.create_semaphore()
    fd = producer.export_fd()
    with pytest.raises(ValueError, match="does not exist"):
        acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, device=5, driver=sim)
    os.close(fd)


WINDOWS_TYPES = [
    acs.HandleType.OPAQUE_WIN32,
    acs.HandleType.OPAQUE_WIN32_KMT,
    acs.HandleType.D3D12_FENCE,
    acs.HandleType.D3D11_FENCE,
    acs.HandleType.D3D11_KEYED_MUTEX,
    acs.HandleType.D3D11_KEYED_MUTEX_KMT,
    acs.HandleType.TIMELINE_SEMAPHORE_WIN32,
]


@pytest.mark.skipif(sys.platform == "win32", reason="checks the non-Windows refusal")
@pytest.mark.parametrize("kind", WINDOWS_TYPES)
async def test_windows_handle_types_are_refused_off_windows(
    sim: SimDriver, kind: acs.HandleType
) -> None:
    with pytest.raises(acs.UnsupportedHandleTypeError, match="only on Windows"):
        acs.import_semaphore(kind, 0x1234, driver=sim)
    with pytest.raises(acs.UnsupportedHandleTypeError):
        acs.import_semaphore(kind, name="Local\\fence", driver=sim)


async def test_nvscisync_is_refused_where_the_driver_lacks_it(sim: SimDriver) -> None:
    with pytest.raises(acs.UnsupportedHandleTypeError) as info:
        acs.import_semaphore(acs.HandleType.NVSCISYNC, 0x1000, driver=sim)
    assert info.value.status == 801


async def test_forgotten_semaphore_warns(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    with pytest.warns(ResourceWarning, match="aclose"):
        del sem
        gc.collect()


# ---------------------------------------------------------------- Wait / Signal entries


async def test_entry_validation(sim: SimDriver) -> None:
    tl, _ = import_sim_semaphore(sim)
    bin_, _ = import_sim_semaphore(sim, timeline=False)
    acs.Wait(tl, U64 - 1)
    acs.Signal(tl, 0)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        acs.Wait(tl, U64)
    with pytest.raises(ValueError):
        acs.Signal(tl, -1)
    with pytest.raises(TypeError):
        acs.Wait(tl, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        acs.Wait(tl, True)
    with pytest.raises(ValueError, match="take no value"):
        acs.Wait(bin_, 1)
    with pytest.raises(ValueError, match="keyed mutex"):
        acs.Wait(tl, 1, key=3)
    with pytest.raises(ValueError, match="keyed mutex"):
        acs.Wait(tl, 1, timeout_ms=10)
    with pytest.raises(ValueError, match="NVSCISYNC"):
        acs.Signal(tl, 1, skip_nvscibuf_memsync=True)
    with pytest.raises(ValueError, match="NVSCISYNC"):
        acs.Wait(tl, 1, nvsci_fence=0x10)
    with pytest.raises(TypeError, match="ExternalSemaphore"):
        acs.Wait(object(), 1)  # type: ignore[arg-type]
    await tl.aclose()
    await bin_.aclose()


async def test_timeline_entries_need_a_value_and_binary_ones_take_none(sim: SimDriver) -> None:
    tl, _ = import_sim_semaphore(sim)
    bin_, _ = import_sim_semaphore(sim, timeline=False)
    # A timeline wait without a value was a wait for 0: already satisfied, silently.
    with pytest.raises(TypeError, match=r"timelines: Wait\(sem, value\) needs the value"):
        acs.Wait(tl)
    with pytest.raises(TypeError, match=r"timelines: Signal\(sem, value\) needs the value"):
        acs.Signal(tl)
    assert acs.Wait(tl, 0).value == 0  # an explicit 0 is allowed
    assert acs.Wait(bin_).value is None
    assert acs.Signal(bin_).value is None
    for value in (0, 1):
        with pytest.raises(ValueError, match=r"take no value .* use Wait\(sem\)"):
            acs.Wait(bin_, value)
        with pytest.raises(ValueError, match=r"take no value .* use Signal\(sem\)"):
            acs.Signal(bin_, value)
    await tl.aclose()
    await bin_.aclose()


async def test_entries_refuse_a_closed_semaphore(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    binary, _ = import_sim_semaphore(sim, timeline=False)
    made_before = acs.Wait(sem, 1)
    await sem.aclose()
    binary.close()
    with pytest.raises(anyio.ClosedResourceError, match="closed external semaphore"):
        acs.Wait(sem, 1)
    with pytest.raises(anyio.ClosedResourceError, match="closed external semaphore"):
        acs.Signal(sem, 1)
    with pytest.raises(anyio.ClosedResourceError, match="closed external semaphore"):
        acs.Wait(binary)
    with pytest.raises(anyio.ClosedResourceError, match="closed"):
        await sem.wait_value(1)
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(anyio.ClosedResourceError, match="closed"):
            s.enqueue_wait(made_before)  # made while open, used once closed


@given(st.integers())
def test_uint64_range_is_enforced(value: int) -> None:
    sim = SimDriver(devices=1)
    producer = sim.create_semaphore()
    sem = acs.import_semaphore(
        acs.HandleType.TIMELINE_SEMAPHORE_FD, producer.export_fd(), driver=sim
    )
    try:
        if 0 <= value < U64:
            assert acs.Wait(sem, value).value == value
            assert acs.Signal(sem, value).value == value
        else:
            with pytest.raises(ValueError):
                acs.Wait(sem, value)
            with pytest.raises(ValueError):
                acs.Signal(sem, value)
    finally:
        sim.destroy_semaphore(sem.handle)
        sem._claim()


# ---------------------------------------------------------------- GPU-side wait and signal


async def test_timeline_gpu_wait_then_signal(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    back, observer = import_sim_semaphore(sim)
    async with acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(sem, 5))
        s.enqueue_signal(acs.Signal(back, 7))
        producer.signal(4)
        with anyio.move_on_after(0.02):
            await s.wait_complete()
        assert observer.value == 0  # 4 < 5: the GPU is still waiting
        producer.signal(6)  # >= 5 releases it
        with anyio.fail_after(5):
            await s.wait_complete()
        assert observer.value == 7
    await sem.aclose()
    await back.aclose()


async def test_binary_wait_consumes_one_signal(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim, timeline=False)
    async with acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(sem))
        s.enqueue_wait(acs.Wait(sem))
        producer.signal()
        with anyio.move_on_after(0.02):
            await s.wait_complete()
        assert not s.query()  # the second wait needs a second signal
        producer.signal()
        with anyio.fail_after(5):
            await s.wait_complete()
        assert producer.value == 0
    await sem.aclose()


async def test_batch_wait_is_one_driver_call(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, pa = import_sim_semaphore(sim)
    b, pb = import_sim_semaphore(sim)
    c, pc = import_sim_semaphore(sim, timeline=False)
    calls: list[int] = []
    real = sim.enqueue_semaphore_waits

    def spy(ops, stream):  # type: ignore[no-untyped-def]
        calls.append(len(ops))
        return real(ops, stream)

    monkeypatch.setattr(sim, "enqueue_semaphore_waits", spy)
    async with acs.open_stream(driver=sim) as s:
        s.enqueue_wait(acs.Wait(a, 1), acs.Wait(b, 2), acs.Wait(c))
        assert calls == [3]
        pa.signal(1)
        pc.signal()
        with anyio.move_on_after(0.02):
            await s.wait_complete()
        assert not s.query()  # b is still short
        pb.signal(2)
        with anyio.fail_after(5):
            await s.wait_complete()
    for sem in (a, b, c):
        await sem.aclose()


async def test_enqueue_checks_entries_and_devices(sim: SimDriver) -> None:
    sem0, _ = import_sim_semaphore(sim, device=0)
    other = SimDriver(devices=1)
    sem_other, _ = import_sim_semaphore(other)
    async with acs.open_stream(1, driver=sim) as s1, acs.open_stream(0, driver=sim) as s0:
        with pytest.raises(acs.DeviceMismatchError, match="device 0"):
            s1.enqueue_wait(acs.Wait(sem0, 1))
        with pytest.raises(acs.DeviceMismatchError) as info:
            s0.enqueue_signal(acs.Signal(sem_other, 1))
        # Both drivers are called "sim": the message tells the two objects apart.
        message = str(info.value)
        assert f"the sim driver object at {id(other):#x}, but the stream" in message
        assert f"belongs to the sim driver object at {id(sim):#x}" in message
        with pytest.raises(TypeError, match="Wait"):
            s0.enqueue_wait(acs.Signal(sem0, 1))  # type: ignore[call-overload]
        with pytest.raises(ValueError, match=r"enqueue_wait\(\) needs at least one"):
            s0.enqueue_wait()
        with pytest.raises(ValueError, match=r"enqueue_wait\(\) needs at least one"):
            s0.enqueue_wait([])
        with pytest.raises(ValueError, match=r"enqueue_signal\(\) needs at least one"):
            s0.enqueue_signal(())
        await sem0.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            s0.enqueue_wait(acs.Wait(sem0, 1))
    await sem_other.aclose()


# ---------------------------------------------------------------- host-side awaits


async def test_wait_value_from_the_host(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    async with anyio.create_task_group() as tg:
        done = anyio.Event()

        async def waiter() -> None:
            await sem.wait_value(3)
            done.set()

        tg.start_soon(waiter)
        producer.signal(2)
        with anyio.move_on_after(0.02):
            await done.wait()
        assert not done.is_set()
        producer.signal(3)
        with anyio.fail_after(5):
            await done.wait()
    with pytest.raises(TypeError, match="wait_signaled"):
        await sem.wait_signaled()
    await sem.aclose()


async def test_wait_signaled_consumes(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim, timeline=False)
    producer.signal()
    with anyio.fail_after(5):
        await sem.wait_signaled()
    assert producer.value == 0
    with pytest.raises(TypeError, match="wait_value"):
        await sem.wait_value(1)
    await sem.aclose()


async def test_cancelled_host_wait_leaves_no_stream_behind(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    live = len(sim._streams)
    with anyio.move_on_after(0.02):
        await sem.wait_value(10)
    producer.signal(10)  # the abandoned private stream completes and is freed
    with anyio.fail_after(5):
        while len(sim._streams) > live + 1:  # + the side stream cache entry at most
            await anyio.sleep(0.001)
    with anyio.fail_after(5):
        await sem.wait_value(10)
    await sem.aclose()


async def test_entry_lists_take_one_entry_several_or_a_sequence(sim: SimDriver) -> None:
    a, pa = import_sim_semaphore(sim)
    b, pb = import_sim_semaphore(sim)
    calls: list[int] = []
    waits, signals = sim.enqueue_semaphore_waits, sim.enqueue_semaphore_signals
    sim.enqueue_semaphore_waits = lambda ops, h: (calls.append(len(ops)), waits(ops, h))[1]  # type: ignore[method-assign]
    sim.enqueue_semaphore_signals = lambda ops, h: (calls.append(len(ops)), signals(ops, h))[1]  # type: ignore[method-assign]
    try:
        async with acs.open_stream(driver=sim) as s:
            w = [acs.Wait(a, 0), acs.Wait(b, 0)]
            s.enqueue_wait(w[0])
            s.enqueue_wait(*w)
            s.enqueue_wait(w)  # was "expected aiocudasem.Wait entries, not list"
            s.enqueue_wait(tuple(w))
            s.enqueue_signal(acs.Signal(a, 1))
            s.enqueue_signal(acs.Signal(a, 2), acs.Signal(b, 2))
            s.enqueue_signal([acs.Signal(a, 3), acs.Signal(b, 3)])
            assert calls == [1, 2, 2, 2, 1, 2, 2]
            with anyio.fail_after(5):
                await acs.wait_external_semaphores(acs.Wait(a, 3), s)
                await acs.wait_external_semaphores((acs.Wait(a, 3), acs.Wait(b, 3)), s)
            async with s.handoff(acs.Wait(a, 3), [acs.Signal(a, 4), acs.Signal(b, 4)]):
                pass
            assert pa.value == pb.value == 4
            for bad, got in (
                ((w[0], w[1:]), "got list beside other entries (give separate entries or one"),
                (([w],), "got list"),
                ((a,), "got ExternalSemaphore"),
            ):
                with pytest.raises(TypeError, match="one list or tuple of them") as info:
                    s.enqueue_wait(*bad)  # type: ignore[call-overload]
                assert got in str(info.value)
            with pytest.raises(TypeError, match=r"wait_external_semaphores\(\) waits takes"):
                await acs.wait_external_semaphores(acs.Signal(a, 1), s)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"handoff\(\) signals takes"):
                s.handoff(w, acs.Wait(a, 1))  # type: ignore[arg-type]
            assert calls == [1, 2, 2, 2, 1, 2, 2, 1, 2, 1, 2]  # nothing enqueued by the errors
    finally:
        del sim.enqueue_semaphore_waits, sim.enqueue_semaphore_signals
    await a.aclose()
    await b.aclose()


async def test_wait_external_semaphores_facade(sim: SimDriver) -> None:
    a, pa = import_sim_semaphore(sim)
    b, pb = import_sim_semaphore(sim, timeline=False)
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)  # earlier work is part of what the facade awaits
        pa.signal(1)
        pb.signal()
        async with anyio.create_task_group() as tg:
            finished = anyio.Event()

            async def call() -> None:
                await acs.wait_external_semaphores([acs.Wait(a, 1), acs.Wait(b)], s)
                finished.set()

            tg.start_soon(call)
            with anyio.move_on_after(0.02):
                await finished.wait()
            assert not finished.is_set()
            gate.set()
        # The facade also takes a foreign stream handle.
        pa.signal(2)
        with anyio.fail_after(5):
            await acs.wait_external_semaphores([acs.Wait(a, 2)], s.handle)
        with anyio.fail_after(5):
            await acs.wait_external_semaphores([], s)  # no waits: the stream's work only
    await a.aclose()
    await b.aclose()


async def test_aclose_waits_for_the_device_without_blocking_the_loop(sim: SimDriver) -> None:
    """cuDestroyExternalSemaphore waits until no stream of the device is blocked on a semaphore
    (the simulator models it). A close on the loop's thread would freeze the loop, and with it
    the task that unblocks the device: aclose() must wait in a worker thread."""
    import threading

    blocker, blocker_producer = import_sim_semaphore(sim)
    other, _ = import_sim_semaphore(sim)
    rescue = threading.Timer(10, blocker_producer.signal, (1,))  # only if the loop froze
    rescue.start()
    ticks = 0
    try:
        async with acs.open_stream(driver=sim) as s:
            s.enqueue_wait(acs.Wait(blocker, 1))  # the device now has a blocked stream

            async def unblock_later() -> None:
                nonlocal ticks
                for _ in range(5):
                    await anyio.sleep(0.01)
                    ticks += 1
                blocker_producer.signal(1)

            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(unblock_later)
                    await other.aclose()  # returns once the device lets it go
            assert ticks == 5  # the loop kept running while the close waited
            assert other.closed
    finally:
        rescue.cancel()
    await blocker.aclose()


@pytest.mark.anyio
async def test_host_waits_on_a_closed_semaphore_name_the_semaphore_not_an_entry(
    sim: SimDriver,
) -> None:
    timeline, _ = import_sim_semaphore(sim)
    binary, _ = import_sim_semaphore(sim, timeline=False)
    for sem, wait in ((timeline, lambda: timeline.wait_value(1)), (binary, binary.wait_signaled)):
        await sem.aclose()
        with pytest.raises(anyio.ClosedResourceError, match="the external semaphore is closed"):
            await wait()
