"""The API in the forms the docs show, for ``mypy --strict`` (listed in ``[tool.mypy] files``).

Not a test module: pytest does not collect it (its name does not start with ``test_``) and
nothing here runs. mypy checks that each documented call type-checks as written, so that a
signature that drifts from the docs fails CI. The behaviour is tested in ``tests/test_*.py``.
"""

from __future__ import annotations

from typing import assert_type

import anyio
import anyio.abc

import aiocudasem as acs
from aiocudasem import lowlevel
from aiocudasem.testing import (
    SimDriver,
    SimProducer,
    hold,
    import_sim_semaphore,
    workloads,
)


async def handoff_sections(ready: acs.ExternalSemaphore, done: acs.ExternalSemaphore) -> None:
    async with ready, done, acs.open_stream(0) as stream:
        for n in range(1, 4):
            async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)) as s:
                assert s is stream
        async with stream.handoff([acs.Wait(ready, 4)], [acs.Signal(done, 4)]):
            pass
        section: acs.HandOff = stream.handoff((acs.Wait(ready, 5),), acs.Signal(done, 5))
        async with section:
            pass


def entry_forms(
    stream: acs.Stream,
    a: acs.ExternalSemaphore,
    b: acs.ExternalSemaphore,
    binary_sem: acs.ExternalSemaphore,
) -> None:
    stream.enqueue_wait(acs.Wait(a, 5))
    stream.enqueue_wait(acs.Wait(a, 5), acs.Wait(b, 7), acs.Wait(binary_sem))
    stream.enqueue_wait([acs.Wait(a, 5), acs.Wait(b, 7)])
    stream.enqueue_wait((acs.Wait(a, 5), acs.Wait(b, 7)))
    waits: list[acs.Wait] = [acs.Wait(a, 5), acs.Wait(binary_sem)]
    stream.enqueue_wait(waits)
    stream.enqueue_wait(*waits)
    stream.enqueue_signal(acs.Signal(a, 6))
    stream.enqueue_signal(acs.Signal(a, 6), acs.Signal(binary_sem))
    stream.enqueue_signal([acs.Signal(a, 6), acs.Signal(b, 8)])
    value: int | None = acs.Wait(binary_sem).value
    assert value is None


async def facades(stream: acs.Stream, a: acs.ExternalSemaphore, foreign: object) -> None:
    await acs.wait_external_semaphores(acs.Wait(a, 1), stream)
    await acs.wait_external_semaphores([acs.Wait(a, 6)], stream)
    await acs.wait_external_semaphores((acs.Wait(a, 6),), stream.handle)
    await acs.wait_stream(foreign)
    await acs.wait_stream(stream.handle, driver="sim")
    borrowed: acs.Stream = acs.Stream.adopt(foreign, driver="sim")
    await borrowed.aclose()
    await a.wait_value(6)
    with anyio.move_on_after(0.5):
        await stream.wait_complete()


async def other_libraries(torch_event: object, tensor: object, raw_event: int) -> None:
    await acs.wait_event(torch_event)
    await acs.wait_event(raw_event, device=1, driver="cuda")
    await acs.ready(tensor)
    await acs.ready(tensor, driver="sim")
    await acs.ready(tensor, tensor, raw_event, driver="sim")


async def across_processes(sock: anyio.abc.UNIXSocketStream, fd: int) -> None:
    await acs.send_semaphore(sock, fd, acs.HandleType.TIMELINE_SEMAPHORE_FD)
    await acs.send_semaphore(sock, fd, acs.HandleType.OPAQUE_FD, close=False)
    sem = await acs.receive_semaphore(sock, device=0, driver="sim")
    assert_type(sem, acs.ExternalSemaphore)
    await sem.aclose()


async def records_by_number(sock: anyio.abc.UNIXSocketStream, stream: acs.Stream) -> None:
    async with acs.create_ipc_recorder(0, driver="sim") as recorder:
        await acs.send_ipc_recorder(sock, recorder)
        n: int = recorder.record(stream)
        assert_type(recorder.event, acs.IpcEvent)
        await recorder.aclose(limit_s=None)
    records = await acs.receive_ipc_records(sock, driver="sim")
    assert_type(records, acs.IpcRecords)
    await records.wait_record(n)
    records.enqueue_wait(stream, n)
    assert_type(records.completed, int)
    records.abandon()
    await records.aclose()


async def simulated_driver() -> None:
    sim = SimDriver(devices=2)
    named: SimDriver = SimDriver(devices=1, name="sim-b")
    shared = acs.get_driver("sim")
    assert_type(shared, SimDriver)
    driver = acs.get_driver()
    assert_type(driver, acs.Driver)
    assert_type(acs.get_driver("cuda"), acs.Driver)
    assert driver.simulated or not named.simulated or shared is sim
    producer: SimProducer = sim.create_semaphore()
    binary: SimProducer = shared.create_semaphore(timeline=False, initial=1)
    producer.signal(3)
    binary.signal()
    assert producer.block_until(3, timeout=1.0)
    assert producer.is_timeline and producer.value == 3
    fd: int = producer.export_fd()
    sem = acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=sim)
    ready, peer = import_sim_semaphore(sim)
    done, _ = import_sim_semaphore("sim", timeline=False, initial=0, device=1)
    async with sem, ready, done, acs.open_stream(driver=sim) as stream:
        seen: list[int] = []
        sim.launch(stream.handle, lambda: seen.append(peer.value))
        gate = hold(stream)
        gate.set()
        work = workloads(stream.driver)
        work.launch_spin(stream.handle, 2_000_000)
        await stream.wait_complete()
    sim.inject_fault(0, status=700)
    sim.inject_fault()
    producer.set_stuck()


def tuning_and_statistics() -> None:
    settings: acs.Tuning = acs.configure(spin_limit=0)
    acs.configure(spin_limit=250e-6, max_spinners=8, watchdog=0.08, wake="side_stream")
    acs.configure(watchdog=settings.watchdog)
    stats: lowlevel.Statistics = lowlevel.statistics()
    counts: list[int] = [stats.parked, stats.spinning, stats.armed, stats.chained]
    counts += [stats.completed, stats.faulted, stats.faults_seen, stats.leaked]
    assert all(c >= 0 for c in counts)
    driver: acs.Driver = acs.get_driver("sim")
    assert driver.device_count() >= 1


def refused_forms(stream: acs.Stream, a: acs.ExternalSemaphore) -> None:
    """Forms the API refuses at run time that mypy refuses too. mypy --strict reports an
    unused ``type: ignore``, so each line fails the check if its form starts to type-check."""
    w = acs.Wait(a, 1)
    stream.enqueue_wait(w, [w])  # type: ignore[call-overload]
    stream.enqueue_wait(acs.Signal(a, 1))  # type: ignore[call-overload]
    stream.handoff(w, w)  # type: ignore[arg-type]
    import_sim_semaphore("cuda")  # type: ignore[arg-type]
