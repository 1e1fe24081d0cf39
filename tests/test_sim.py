"""The simulated device's semantics, through the driver Protocol (no event loop).

Every blocking call is bounded: gates wait at most ``GATE_S``, host-side waits take a timeout and
``stream_synchronize`` runs on a helper thread joined with a timeout (see :func:`sync`), so a bug
in the simulator fails a test instead of hanging the suite.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from aiocudasem import CudaError, DeviceFaultError, Driver
from aiocudasem.lowlevel import SemaphoreDesc, SemOp
from aiocudasem.testing import SEEN, SimDriver, SimProducer, frame_word, workloads

TIMEOUT = 10.0  # the bound on every wait that is expected to succeed
SHORT = 0.05  # how long a "not yet" check gives the simulator to (wrongly) make progress
GATE_S = 60.0  # a gate never blocks a worker thread for longer than this

OPAQUE_FD = 1  # CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD (binary)
TIMELINE_FD = 9  # CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
NON_FD_TYPES = (2, 3, 4, 5, 6, 7, 8, 10)  # Win32, D3D, NvSciSync, keyed mutex handle types

HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Sim:
    """A fresh two-device SimDriver plus bookkeeping so every test cleans up after itself."""

    def __init__(self) -> None:
        self.drv = SimDriver(devices=2)
        self._gates: list[threading.Event] = []
        self._streams: list[int] = []
        self._fds: list[int] = []
        self._callbacks: list[Any] = []

    def stream(self, device: int = 0) -> int:
        s = self.drv.stream_create(device, True, 0)
        self._streams.append(s)
        return s

    def gate(self, stream: int) -> threading.Event:
        """Enqueue a kernel that runs until the returned Event is set."""
        ev = threading.Event()
        self._gates.append(ev)
        self.drv.launch(stream, lambda: ev.wait(GATE_S) and None)
        return ev

    def marker(self, stream: int) -> threading.Event:
        """Enqueue a kernel that sets the returned Event when it runs."""
        ev = threading.Event()
        self.drv.launch(stream, ev.set)
        return ev

    def export(self, producer: SimProducer) -> int:
        fd = producer.export_fd()
        self._fds.append(fd)
        return fd

    def semaphore(
        self, timeline: bool = True, initial: int = 0, device: int = 0
    ) -> tuple[int, SimProducer]:
        producer = self.drv.create_semaphore(timeline=timeline, initial=initial)
        kind = TIMELINE_FD if timeline else OPAQUE_FD
        handle = self.drv.import_semaphore(device, SemaphoreDesc(kind, fd=self.export(producer)))
        return handle, producer

    def host_fn(self, fn: Callable[[int | None], None]) -> int:
        """A C function pointer the simulator can call (a ctypes callback kept alive here)."""
        cb = HostFn(fn)
        self._callbacks.append(cb)
        addr = ctypes.cast(cb, ctypes.c_void_p).value
        assert addr
        return addr

    def worker(self, stream: int) -> threading.Thread | None:
        """The stream's worker thread (an implementation detail, used to join it)."""
        name = f"aiocudasem-sim-{id(self.drv):x}-{stream:#x}"
        return next((t for t in threading.enumerate() if t.name == name), None)

    def close(self) -> None:
        for g in self._gates:
            g.set()
        for s in self._streams:
            try:
                self.drv.stream_destroy(s)
            except CudaError:
                pass
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass  # imported: the simulator closed it


@pytest.fixture
def sim() -> Iterator[Sim]:
    h = Sim()
    try:
        yield h
    finally:
        h.close()


def sync(drv: SimDriver, stream: int, timeout: float = TIMEOUT) -> None:
    """``stream_synchronize`` with a bound: fails the test instead of hanging."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            drv.stream_synchronize(stream)
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"stream_synchronize({stream:#x}) did not return in {timeout}s"
    if err:
        raise err[0]


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------ devices


def test_is_a_driver() -> None:
    drv = SimDriver(devices=3)
    assert isinstance(drv, Driver)
    assert drv.simulated is True
    assert drv.device_count() == 3
    uuids = {drv.device_uuid(i) for i in range(3)}
    assert len(uuids) == 3
    assert all(len(u) == 16 for u in uuids)
    assert drv.device_name(1) == "Simulated CUDA device 1"
    drv.check_health(2)
    with pytest.raises(ValueError, match=">= 1"):
        SimDriver(devices=0)


@pytest.mark.parametrize("ordinal", [-1, 2, 7])
def test_bad_device_ordinal_raises_invalid_device(sim: Sim, ordinal: int) -> None:
    drv = sim.drv
    calls: list[Callable[[], object]] = [
        lambda: drv.device_uuid(ordinal),
        lambda: drv.device_name(ordinal),
        lambda: drv.check_health(ordinal),
        lambda: drv.stream_create(ordinal, True, 0),
        lambda: drv.event_create(ordinal),
        lambda: drv.import_semaphore(ordinal, SemaphoreDesc(TIMELINE_FD, fd=-1)),
    ]
    for call in calls:
        with pytest.raises(CudaError) as info:
            call()
        assert info.value.status == 101
        assert not isinstance(info.value, DeviceFaultError)


# ------------------------------------------------------------------------------ streams


def test_stream_is_fifo(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    seen: list[int] = []
    for i in range(200):
        drv.launch(s, lambda i=i: seen.append(i))
    sync(drv, s)
    assert seen == list(range(200))
    assert drv.stream_query(s)
    assert drv.stream_device(s) == 0
    assert drv.stream_device(sim.stream(1)) == 1


def test_an_enqueue_on_a_full_stream_blocks_until_the_device_drains_one(sim: Sim) -> None:
    """As a GPU's queue of commands: once a stream holds ``queue_depth`` operations, the next
    enqueue blocks the calling thread until one completes (or the device faults)."""
    drv, s = sim.drv, sim.stream()
    drv.queue_depth = 4
    gate = sim.gate(s)
    for _ in range(3):
        drv.launch(s, lambda: None)  # four held now, the gate included
    enqueued = threading.Event()
    t = threading.Thread(target=lambda: (drv.launch(s, lambda: None), enqueued.set()))
    t.start()
    assert not enqueued.wait(SHORT)  # blocked: the stream is full
    gate.set()
    assert enqueued.wait(TIMEOUT)
    t.join(TIMEOUT)
    sync(drv, s)


def test_a_fault_releases_an_enqueue_blocked_on_a_full_stream(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    drv.queue_depth = 2
    sim.gate(s)
    drv.launch(s, lambda: None)
    done: list[BaseException | None] = []

    def enqueue() -> None:
        try:
            drv.launch(s, lambda: None)
            done.append(None)
        except BaseException as exc:  # the fault, if the launch looks again
            done.append(exc)

    t = threading.Thread(target=enqueue)
    t.start()
    t.join(SHORT)
    assert t.is_alive()
    drv.inject_fault(0)
    t.join(TIMEOUT)
    assert not t.is_alive() and len(done) == 1


def test_stream_query_reflects_completion(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    assert drv.stream_query(s)  # nothing enqueued
    gate = sim.gate(s)
    after = sim.marker(s)
    assert not drv.stream_query(s)
    assert not after.wait(SHORT)
    assert not drv.stream_query(s)
    gate.set()
    assert after.wait(TIMEOUT)
    sync(drv, s)
    assert drv.stream_query(s)


def test_stream_synchronize_blocks_until_done(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    gate = sim.gate(s)
    seen: list[str] = []
    drv.launch(s, lambda: seen.append("work"))
    t = threading.Thread(
        target=lambda: (drv.stream_synchronize(s), seen.append("synced")), daemon=True
    )
    t.start()
    t.join(SHORT)
    assert t.is_alive()  # still blocked behind the gate
    assert seen == []
    gate.set()
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert seen == ["work", "synced"]


def test_streams_run_independently(sim: Sim) -> None:
    drv = sim.drv
    a, b = sim.stream(), sim.stream()
    gate = sim.gate(a)
    done_b = sim.marker(b)
    assert done_b.wait(TIMEOUT)  # b is not held up by a's gate
    assert not drv.stream_query(a)
    gate.set()
    sync(drv, a)


def test_legacy_default_stream(sim: Sim) -> None:
    drv = sim.drv
    assert drv.stream_device(0) == 0
    seen: list[int] = []
    drv.launch(0, lambda: seen.append(1))
    sync(drv, 0)
    assert seen == [1]
    with pytest.raises(CudaError) as info:
        drv.stream_destroy(0)
    assert info.value.status == 400


def test_stream_destroy_lets_pending_work_finish(sim: Sim) -> None:
    drv = sim.drv
    s = drv.stream_create(0, True, 0)
    gate = sim.gate(s)
    done = sim.marker(s)
    drv.stream_destroy(s)  # returns at once
    with pytest.raises(CudaError) as info:
        drv.stream_query(s)
    assert info.value.status == 400
    assert not done.is_set()
    gate.set()
    assert done.wait(TIMEOUT)
    worker = sim.worker(s)
    if worker is not None:
        worker.join(TIMEOUT)
        assert not worker.is_alive()
    with pytest.raises(CudaError) as info:
        drv.stream_destroy(s)
    assert info.value.status == 400


def test_host_function_is_called_with_user_data_in_order(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    seen: list[int | None] = []
    fn = sim.host_fn(seen.append)
    seen_kernels: list[int] = []
    drv.launch_host_func(s, fn, 0x1234)
    drv.launch(s, lambda: seen_kernels.append(len(seen)))
    drv.launch_host_func(s, fn, 0x5678)
    sync(drv, s)
    assert seen == [0x1234, 0x5678]
    assert seen_kernels == [1]  # the kernel ran between the two host functions


def test_host_function_runs_the_real_c_notifier(sim: Sim) -> None:
    from aiocudasem._notify import HOST_FN as HOST_FUNCTION
    from aiocudasem._notify import Notifier as HostNotifier

    drv, s = sim.drv, sim.stream()
    n = HostNotifier()
    try:
        gate = sim.gate(s)
        drv.launch_host_func(s, HOST_FUNCTION, n.arm(42))
        assert n.drain() == []
        gate.set()
        sync(drv, s)
        assert n.drain() == [42]
        assert n.stats()["pending"] == 0
    finally:
        n.close()


# ------------------------------------------------------------------------------ events


def test_event_captures_only_earlier_work(sim: Sim) -> None:
    drv = sim.drv
    s, other = sim.stream(), sim.stream()
    ev = drv.event_create(0)
    assert drv.event_query(ev)  # never recorded: complete, as in CUDA
    first = sim.gate(s)
    drv.event_record(ev, s)
    second = sim.gate(s)  # enqueued after the record: not part of the event
    assert not drv.event_query(ev)

    drv.stream_wait_event(other, ev)
    reached = sim.marker(other)
    assert not reached.wait(SHORT)  # `other` waits for the event
    assert not drv.stream_query(other)
    assert not drv.event_query(ev)

    first.set()
    assert reached.wait(TIMEOUT)  # the event completed although `second` still blocks s
    assert drv.event_query(ev)
    assert not drv.stream_query(s)
    second.set()
    sync(drv, s)
    sync(drv, other)
    drv.event_destroy(ev)


def _synchronize_in_thread(drv: SimDriver, event: int) -> tuple[threading.Thread, list[Any]]:
    """``event_synchronize`` on a helper thread; the list gets "done" or the exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            drv.event_synchronize(event)
            out.append("done")
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_event_synchronize_waits_for_the_recorded_work_only(sim: Sim) -> None:
    drv = sim.drv
    s = sim.stream()
    ev = drv.event_create(0, blocking=True)
    t, out = _synchronize_in_thread(drv, ev)  # never recorded: returns at once
    t.join(TIMEOUT)
    assert out == ["done"]
    first = sim.gate(s)
    drv.event_record(ev, s)
    second = sim.gate(s)  # after the record: not waited for
    t, out = _synchronize_in_thread(drv, ev)
    t.join(SHORT)
    assert t.is_alive()
    first.set()
    t.join(TIMEOUT)
    assert out == ["done"]
    second.set()
    sync(drv, s)
    drv.event_destroy(ev)


def test_event_synchronize_raises_when_another_stream_faults_the_device(sim: Sim) -> None:
    drv = sim.drv
    s, other = sim.stream(), sim.stream()
    sem, _ = sim.semaphore()
    drv.enqueue_semaphore_waits([SemOp(sem, value=1)], s)  # never signalled
    ev = drv.event_create(0, blocking=True)
    drv.event_record(ev, s)
    t, out = _synchronize_in_thread(drv, ev)
    t.join(SHORT)
    assert t.is_alive()
    workloads(drv).launch_trap(other)  # the whole context faults, as a trap does on a GPU
    t.join(TIMEOUT)
    assert len(out) == 1 and isinstance(out[0], DeviceFaultError), out
    assert out[0].status == 719


def test_stream_wait_event_captures_the_record_at_call_time(sim: Sim) -> None:
    drv = sim.drv
    s, other = sim.stream(), sim.stream()
    ev = drv.event_create(0)
    first = sim.gate(s)
    drv.event_record(ev, s)
    drv.stream_wait_event(other, ev)  # waits for the record made so far...
    second = sim.gate(s)
    drv.event_record(ev, s)  # ...not for this later one
    reached = sim.marker(other)
    assert not reached.wait(SHORT)
    first.set()
    assert reached.wait(TIMEOUT)
    assert not drv.event_query(ev)  # the re-recorded event waits for `second`
    second.set()
    sync(drv, s)
    assert drv.event_query(ev)


def test_stream_wait_event_on_unrecorded_event_does_not_wait(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    ev = drv.event_create(0)
    drv.stream_wait_event(s, ev)
    assert sim.marker(s).wait(TIMEOUT)


def test_stream_wait_event_across_devices(sim: Sim) -> None:
    drv = sim.drv
    s0, s1 = sim.stream(0), sim.stream(1)
    ev = drv.event_create(0)
    gate = sim.gate(s0)
    drv.event_record(ev, s0)
    drv.stream_wait_event(s1, ev)
    reached = sim.marker(s1)
    assert not reached.wait(SHORT)
    gate.set()
    assert reached.wait(TIMEOUT)


def test_timing_events_measure_elapsed_time(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    start, end = drv.event_create(0, timing=True), drv.event_create(0, timing=True)
    drv.event_record(start, s)
    workloads(drv).launch_spin(s, 30_000_000)  # 30 ms of simulated kernel
    drv.event_record(end, s)
    sync(drv, s)
    ms = drv.event_elapsed_ms(start, end)
    assert 29.0 <= ms < 5_000.0
    assert drv.event_elapsed_ms(end, start) == pytest.approx(-ms)


def test_event_elapsed_errors(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    a, b = drv.event_create(0, timing=True), drv.event_create(0, timing=True)
    plain = drv.event_create(0)
    with pytest.raises(CudaError) as info:
        drv.event_elapsed_ms(a, b)  # never recorded
    assert info.value.status == 400

    drv.event_record(a, s)
    drv.event_record(plain, s)
    gate = sim.gate(s)
    drv.event_record(b, s)
    with pytest.raises(CudaError) as info:
        drv.event_elapsed_ms(a, b)  # b not reached yet
    assert info.value.status == 600  # CUDA_ERROR_NOT_READY
    gate.set()
    sync(drv, s)
    assert drv.event_elapsed_ms(a, b) >= 0.0
    with pytest.raises(CudaError) as info:
        drv.event_elapsed_ms(a, plain)  # not a timing event
    assert info.value.status == 400


def test_event_record_on_another_devices_stream_raises(sim: Sim) -> None:
    drv = sim.drv
    ev = drv.event_create(0)
    with pytest.raises(CudaError) as info:
        drv.event_record(ev, sim.stream(1))
    assert info.value.status == 400


# ------------------------------------------------------------------------------ timeline


def test_timeline_gpu_wait_completes_at_or_above_value(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=True)
    assert producer.is_timeline
    drv.enqueue_semaphore_waits([SemOp(sem, value=5)], s)
    reached = sim.marker(s)
    assert not reached.wait(SHORT)
    producer.signal(4)
    assert not reached.wait(SHORT)  # 4 < 5: still waiting
    assert not drv.stream_query(s)
    producer.signal(7)  # >= 5
    assert reached.wait(TIMEOUT)
    sync(drv, s)
    assert drv.stream_query(s)


def test_timeline_gpu_wait_for_value_already_reached(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=True, initial=10)
    assert producer.value == 10
    drv.enqueue_semaphore_waits([SemOp(sem, value=10)], s)
    drv.enqueue_semaphore_waits([SemOp(sem, value=3)], s)
    sync(drv, s)


def test_timeline_gpu_signal_sets_the_value(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=True)
    gate = sim.gate(s)
    drv.enqueue_semaphore_signals([SemOp(sem, value=9)], s)
    assert producer.value == 0
    assert producer.block_until(9, timeout=SHORT) is False  # not signalled yet
    gate.set()
    assert producer.block_until(9, timeout=TIMEOUT) is True
    assert producer.value == 9
    assert producer.block_until(5, timeout=0) is True  # already above
    assert producer.block_until(10, timeout=SHORT) is False


def test_timeline_gpu_signal_then_gpu_wait_on_another_stream(sim: Sim) -> None:
    drv = sim.drv
    producer_stream, consumer_stream = sim.stream(), sim.stream()
    sem, producer = sim.semaphore(timeline=True)
    drv.enqueue_semaphore_waits([SemOp(sem, value=1)], consumer_stream)
    reached = sim.marker(consumer_stream)
    gate = sim.gate(producer_stream)
    drv.enqueue_semaphore_signals([SemOp(sem, value=1)], producer_stream)
    assert not reached.wait(SHORT)
    gate.set()
    assert reached.wait(TIMEOUT)
    assert producer.value == 1


def test_producer_argument_checks(sim: Sim) -> None:
    _, timeline = sim.semaphore(timeline=True)
    _, binary = sim.semaphore(timeline=False)
    # The wrong type is TypeError, a value out of range ValueError.
    with pytest.raises(TypeError, match="signalled with a value"):
        timeline.signal()
    with pytest.raises(TypeError, match="timeline value must be an int"):
        timeline.signal(True)
    with pytest.raises(TypeError, match="timeline value must be an int in"):
        timeline.signal("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeline value"):
        timeline.signal(-1)
    with pytest.raises(ValueError, match="timeline value"):
        timeline.signal(1 << 64)
    with pytest.raises(TypeError, match="needs a value"):
        timeline.block_until(None, timeout=0)
    with pytest.raises(TypeError, match="timeline value must be an int"):
        timeline.block_until("1", timeout=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeout"):
        timeline.block_until(0, timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="without a value"):
        binary.signal(1)
    with pytest.raises(ValueError, match="without a value"):
        binary.block_until(1, timeout=0)
    assert timeline.value == 0  # nothing above changed it
    with pytest.raises(ValueError, match="binary semaphore starts at 0"):
        sim.drv.create_semaphore(timeline=False, initial=2)
    with pytest.raises(ValueError, match="initial"):
        sim.drv.create_semaphore(initial=-1)
    with pytest.raises(TypeError, match="initial must be an int"):
        sim.drv.create_semaphore(initial="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeline must be a bool"):
        sim.drv.create_semaphore(timeline=1)  # type: ignore[arg-type]


def test_driver_argument_checks(sim: Sim) -> None:
    with pytest.raises(TypeError, match="devices must be an int"):
        SimDriver(devices="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="devices must be an int"):
        SimDriver(devices=True)
    with pytest.raises(TypeError, match="name must be a str"):
        SimDriver(name=1)  # type: ignore[arg-type]
    drv = sim.drv
    with pytest.raises(TypeError, match=r"SimDriver\.launch\(\) takes a stream"):
        drv.launch("0x10", lambda: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        drv.launch(sim.stream(), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ordinal must be an int"):
        drv.inject_fault("0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not exist"):
        drv.inject_fault(drv.device_count())
    with pytest.raises(TypeError, match="status must be an int"):
        drv.inject_fault(0, "700")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a sticky CUresult: use one of"):
        drv.inject_fault(0, 1)
    drv.check_health(0)  # none of the above faulted the device
    assert repr(drv).startswith("<SimDriver 'sim' devices=2 at 0x")


# ------------------------------------------------------------------------------ binary


def test_binary_one_wait_per_signal(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=False)
    assert not producer.is_timeline
    drv.enqueue_semaphore_waits([SemOp(sem)], s)
    first = sim.marker(s)
    drv.enqueue_semaphore_waits([SemOp(sem)], s)
    second = sim.marker(s)
    assert not first.wait(SHORT)
    producer.signal()
    assert first.wait(TIMEOUT)
    assert not second.wait(SHORT)  # the signal was consumed by the first wait
    assert producer.value == 0
    producer.signal()
    assert second.wait(TIMEOUT)
    sync(drv, s)
    assert producer.value == 0


def test_binary_signals_do_not_accumulate(sim: Sim) -> None:
    # A binary semaphore is signalled or not: two signals before a wait are one signal.
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=False)
    producer.signal()
    producer.signal()
    assert producer.value == 1
    drv.enqueue_semaphore_waits([SemOp(sem)], s)
    first = sim.marker(s)
    drv.enqueue_semaphore_waits([SemOp(sem)], s)
    second = sim.marker(s)
    assert first.wait(TIMEOUT)
    assert not second.wait(SHORT)
    producer.signal()
    assert second.wait(TIMEOUT)


def test_binary_gpu_signal_host_wait_consumes(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=False)
    assert producer.block_until(timeout=SHORT) is False
    drv.enqueue_semaphore_signals([SemOp(sem)], s)
    assert producer.block_until(timeout=TIMEOUT) is True
    assert producer.value == 0
    assert producer.block_until(timeout=SHORT) is False  # consumed by the first host wait


def test_binary_one_signal_releases_one_of_two_gpu_waiters(sim: Sim) -> None:
    """Two streams wait on one binary semaphore; one signal must release exactly one of them.

    The race is made deterministic with a trace hook on the workers: the first worker whose
    ``_block_until`` (called from ``wait_all``) returns True is held right after it returns,
    i.e. after the readiness check and before the consuming ``sem.value = 0``. A correct
    simulator consumes the signal atomically with the check, so holding a worker there cannot
    let a second waiter through; the buggy one lets the other stream pass on the same signal.
    If the simulator is restructured so the hook never fires, the test still checks that one
    signal released one waiter (racily, but never falsely failing).

    Regression test: at commit 920093a ``wait_all`` checked ``sem.value >= 1`` in
    ``_block_until``, dropped the lock, and re-took it to set ``sem.value = 0``, so this test
    failed (2 waits released by one signal) every run."""
    drv = sim.drv
    hold_lock = threading.Lock()
    held = threading.Event()
    resume = threading.Event()

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "return" and arg is True:
            with hold_lock:
                first = not held.is_set()
                held.set()
            if first:
                resume.wait(TIMEOUT)
        return local

    def global_trace(frame: FrameType, event: str, arg: object) -> Any:
        caller = frame.f_back
        if (
            frame.f_code.co_name == "_block_until"
            and caller is not None
            and caller.f_code.co_name == "wait_all"
        ):
            return local
        return None

    sem, producer = sim.semaphore(timeline=False)
    released = threading.Semaphore(0)
    previous = threading.gettrace()
    threading.settrace(global_trace)  # applies to threads started from now: the two workers
    try:
        streams = [sim.stream(), sim.stream()]
        for s in streams:
            drv.enqueue_semaphore_waits([SemOp(sem)], s)
            drv.launch(s, released.release)
        producer.signal()  # one signal
        held.wait(1.0)  # bounded: a restructured simulator may never reach the hook
        count = int(released.acquire(timeout=0.5))  # another waiter got through meanwhile?
        resume.set()
        while released.acquire(timeout=0.3):
            count += 1
    finally:
        threading.settrace(previous)  # type: ignore[arg-type]
        resume.set()
    # Release whichever stream is still waiting, so teardown is clean.
    producer.signal()
    producer.signal()
    assert count == 1, f"one binary signal released {count} GPU waits"


# ------------------------------------------------------------------------------ batches


def test_batch_wait_waits_for_all(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    a, pa = sim.semaphore(timeline=True)
    b, pb = sim.semaphore(timeline=True)
    c, pc = sim.semaphore(timeline=False)
    drv.enqueue_semaphore_waits([SemOp(a, value=2), SemOp(b, value=3), SemOp(c)], s)
    reached = sim.marker(s)
    pc.signal()  # out of order: the batch waits for every entry
    assert not reached.wait(SHORT)
    pb.signal(3)
    assert not reached.wait(SHORT)
    pa.signal(1)  # below 2
    assert not reached.wait(SHORT)
    pa.signal(2)
    assert reached.wait(TIMEOUT)
    assert pc.value == 0  # the binary entry was consumed


def test_batch_signal_signals_all(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    a, pa = sim.semaphore(timeline=True)
    b, pb = sim.semaphore(timeline=False)
    drv.enqueue_semaphore_signals([SemOp(a, value=4), SemOp(b)], s)
    sync(drv, s)
    assert pa.value == 4
    assert pb.value == 1


# ------------------------------------------------------------------------------ import


@pytest.mark.parametrize(("timeline", "kind"), [(True, TIMELINE_FD), (False, OPAQUE_FD)])
def test_import_success_takes_the_fd(sim: Sim, timeline: bool, kind: int) -> None:
    drv = sim.drv
    producer = drv.create_semaphore(timeline=timeline)
    fd = producer.export_fd()
    handle = drv.import_semaphore(0, SemaphoreDesc(kind, fd=fd))
    assert handle != 0
    with pytest.raises(OSError, match="Bad file descriptor") as info:
        os.fstat(fd)
    assert info.value.errno == errno.EBADF
    # The same fd number cannot be imported twice.
    with pytest.raises(CudaError) as cinfo:
        drv.import_semaphore(0, SemaphoreDesc(kind, fd=fd))
    assert cinfo.value.status == 1
    # One semaphore, two imports (two exports): distinct handles, shared state.
    other = drv.import_semaphore(1, SemaphoreDesc(kind, fd=producer.export_fd()))
    assert other != handle
    drv.destroy_semaphore(handle)
    drv.destroy_semaphore(other)
    with pytest.raises(CudaError) as cinfo:
        drv.destroy_semaphore(handle)
    assert cinfo.value.status == 400


def _assert_import_fails(drv: SimDriver, desc: SemaphoreDesc, status: int) -> None:
    with pytest.raises(CudaError) as info:
        drv.import_semaphore(0, desc)
    assert info.value.status == status
    assert not isinstance(info.value, DeviceFaultError)
    assert "[simulated]" in str(info.value)


def test_import_wrong_kind_leaves_the_fd_open(sim: Sim) -> None:
    drv = sim.drv
    timeline = drv.create_semaphore(timeline=True)
    binary = drv.create_semaphore(timeline=False)
    tfd, bfd = sim.export(timeline), sim.export(binary)
    _assert_import_fails(drv, SemaphoreDesc(OPAQUE_FD, fd=tfd), 1)
    _assert_import_fails(drv, SemaphoreDesc(TIMELINE_FD, fd=bfd), 1)
    assert fd_is_open(tfd)
    assert fd_is_open(bfd)
    # Still importable with the right kind afterwards.
    drv.import_semaphore(0, SemaphoreDesc(TIMELINE_FD, fd=tfd))
    assert not fd_is_open(tfd)


def test_import_unknown_fd_leaves_it_open(sim: Sim) -> None:
    drv = sim.drv
    fd = os.eventfd(0, os.EFD_CLOEXEC)  # a real fd the simulator never exported
    sim._fds.append(fd)
    _assert_import_fails(drv, SemaphoreDesc(TIMELINE_FD, fd=fd), 1)
    assert fd_is_open(fd)
    _assert_import_fails(drv, SemaphoreDesc(TIMELINE_FD, fd=-1), 1)


def test_import_nonzero_flags_leaves_the_fd_open(sim: Sim) -> None:
    drv = sim.drv
    fd = sim.export(drv.create_semaphore(timeline=True))
    _assert_import_fails(drv, SemaphoreDesc(TIMELINE_FD, fd=fd, flags=1), 1)
    assert fd_is_open(fd)


@pytest.mark.parametrize("kind", NON_FD_TYPES)
def test_import_non_fd_handle_type_is_not_supported(sim: Sim, kind: int) -> None:
    drv = sim.drv
    fd = sim.export(drv.create_semaphore(timeline=True))
    _assert_import_fails(drv, SemaphoreDesc(kind, fd=fd, win32_handle=1), 801)
    assert fd_is_open(fd)


def test_semaphore_used_on_another_devices_stream_raises(sim: Sim) -> None:
    drv = sim.drv
    sem, _ = sim.semaphore(device=0)
    s1 = sim.stream(1)
    for call in (drv.enqueue_semaphore_waits, drv.enqueue_semaphore_signals):
        with pytest.raises(CudaError) as info:
            call([SemOp(sem, value=1)], s1)
        assert info.value.status == 400


# ------------------------------------------------------------------------------ faults


def test_injected_fault_is_sticky_and_drops_pending_work(sim: Sim) -> None:
    drv = sim.drv
    s = sim.stream(0)
    ev = drv.event_create(0)
    sem, producer = sim.semaphore(device=0)
    ran: list[str] = []
    host_calls: list[int | None] = []
    fn = sim.host_fn(host_calls.append)

    gate = sim.gate(s)
    drv.launch(s, lambda: ran.append("kernel"))
    drv.launch_host_func(s, fn, 7)
    worker = sim.worker(s)  # taken now: it exits once the fault is seen
    assert worker is not None
    drv.inject_fault(0)
    gate.set()  # the gate kernel finishes; everything behind it was dropped
    worker.join(TIMEOUT)
    assert not worker.is_alive()  # a faulted stream's worker exits
    assert ran == []
    assert host_calls == []

    calls: list[Callable[[], object]] = [
        lambda: drv.check_health(0),
        lambda: drv.device_name(0),
        lambda: drv.stream_create(0, True, 0),
        lambda: drv.stream_query(s),
        lambda: drv.stream_query(0),
        lambda: sync(drv, s),  # raises at once, does not block
        lambda: drv.stream_device(s),
        lambda: drv.stream_wait_event(s, ev),
        lambda: drv.launch(s, lambda: None),
        lambda: drv.launch_host_func(s, fn, 8),
        lambda: workloads(drv).launch_spin(s, 1),
        lambda: workloads(drv).launch_trap(s),
        lambda: drv.event_create(0),
        lambda: drv.event_record(ev, s),
        lambda: drv.event_query(ev),
        lambda: drv.enqueue_semaphore_waits([SemOp(sem, value=1)], s),
        lambda: drv.enqueue_semaphore_signals([SemOp(sem, value=1)], s),
        lambda: drv.import_semaphore(0, SemaphoreDesc(TIMELINE_FD, fd=-1)),
    ]
    for call in calls:
        with pytest.raises(DeviceFaultError) as info:
            call()
        assert info.value.status == 700
        assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert host_calls == []
    producer.signal(1)  # the host side of a semaphore is not the device: still works
    assert producer.value == 1

    # Device 1 is unaffected.
    drv.check_health(1)
    s1 = sim.stream(1)
    seen: list[int] = []
    drv.launch(s1, lambda: seen.append(1))
    sync(drv, s1)
    assert seen == [1]

    # The first fault wins.
    drv.inject_fault(0, 719)
    with pytest.raises(DeviceFaultError) as info:
        drv.check_health(0)
    assert info.value.status == 700


def test_fault_wakes_blocked_waits_and_synchronize(sim: Sim) -> None:
    drv = sim.drv
    s, waiting = sim.stream(), sim.stream()
    sem, _ = sim.semaphore()
    drv.enqueue_semaphore_waits([SemOp(sem, value=1)], waiting)  # never signalled
    gate = sim.gate(s)
    errors: list[BaseException] = []

    def synchronize() -> None:
        try:
            drv.stream_synchronize(waiting)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=synchronize, daemon=True)
    t.start()
    t.join(SHORT)
    assert t.is_alive()
    # A stream blocked in a wait has no worker thread; if it has one, it ends on the fault.
    worker = sim.worker(waiting)
    drv.inject_fault(0)
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], DeviceFaultError)
    assert errors[0].status == 700
    if worker is not None:
        worker.join(TIMEOUT)  # the blocked semaphore wait gave up on the fault
        assert not worker.is_alive()
    gate.set()


def test_inject_fault_rejects_non_sticky_status(sim: Sim) -> None:
    with pytest.raises(ValueError, match="sticky"):
        sim.drv.inject_fault(0, 1)
    sim.drv.check_health(0)


def test_launch_trap_faults_with_launch_failed(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    workloads(drv).launch_trap(s)
    with pytest.raises(DeviceFaultError) as info:
        sync(drv, s)
    assert info.value.status == 719
    with pytest.raises(DeviceFaultError) as info:
        drv.check_health(0)
    assert info.value.status == 719
    assert info.value.name == "CUDA_ERROR_LAUNCH_FAILED"
    drv.check_health(1)


def test_raising_kernel_faults_with_launch_failed(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream(1)
    after: list[int] = []

    def boom() -> None:
        raise RuntimeError("kernel bug")

    gate = sim.gate(s)  # both launches are enqueued before the faulting kernel runs
    drv.launch(s, boom)
    drv.launch(s, lambda: after.append(1))
    gate.set()
    with pytest.raises(DeviceFaultError) as info:
        sync(drv, s)
    assert info.value.status == 719
    assert after == []  # work behind the failed kernel is dropped
    with pytest.raises(DeviceFaultError):
        drv.stream_create(1, True, 0)
    drv.check_health(0)  # the other device is fine


def test_stuck_producer_ignores_signals(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    sem, producer = sim.semaphore(timeline=True)
    producer.set_stuck()
    producer.signal(5)
    assert producer.value == 0
    drv.enqueue_semaphore_signals([SemOp(sem, value=6)], s)
    sync(drv, s)
    assert producer.value == 0  # GPU signals are ignored too
    assert producer.block_until(5, timeout=SHORT) is False
    drv.enqueue_semaphore_waits([SemOp(sem, value=1)], s)
    reached = sim.marker(s)
    assert not reached.wait(SHORT)
    producer.set_stuck(False)
    producer.signal(1)
    assert reached.wait(TIMEOUT)
    assert producer.value == 1


def test_stuck_binary_producer_ignores_signals(sim: Sim) -> None:
    _, producer = sim.semaphore(timeline=False)
    producer.set_stuck()
    producer.signal()
    assert producer.value == 0
    assert producer.block_until(timeout=SHORT) is False


# ------------------------------------------------------------------------------ handles


def test_invalid_handles_raise_invalid_handle(sim: Sim) -> None:
    drv = sim.drv
    bogus = 0xDEAD0
    s = sim.stream()
    ev = drv.event_create(0)
    fn = sim.host_fn(lambda _p: None)
    calls: list[Callable[[], object]] = [
        lambda: drv.stream_query(bogus),
        lambda: sync(drv, bogus),
        lambda: drv.stream_destroy(bogus),
        lambda: drv.stream_device(bogus),
        lambda: drv.stream_wait_event(bogus, ev),
        lambda: drv.stream_wait_event(s, bogus),
        lambda: drv.launch(bogus, lambda: None),
        lambda: drv.launch_host_func(bogus, fn, 0),
        lambda: workloads(drv).launch_spin(bogus, 1),
        lambda: workloads(drv).launch_trap(bogus),
        lambda: drv.event_query(bogus),
        lambda: drv.event_destroy(bogus),
        lambda: drv.event_record(bogus, s),
        lambda: drv.event_record(ev, bogus),
        lambda: drv.event_elapsed_ms(bogus, ev),
        lambda: drv.destroy_semaphore(bogus),
        lambda: drv.enqueue_semaphore_waits([SemOp(bogus)], s),
        lambda: drv.enqueue_semaphore_signals([SemOp(bogus)], s),
    ]
    for call in calls:
        with pytest.raises(CudaError) as info:
            call()
        assert info.value.status == 400, call
        assert info.value.name == "CUDA_ERROR_INVALID_HANDLE"
    drv.event_destroy(ev)
    with pytest.raises(CudaError) as info:
        drv.event_query(ev)  # destroyed
    assert info.value.status == 400
    # Nothing was enqueued on s by the failed calls.
    assert drv.stream_query(s)
    drv.check_health(0)  # an invalid handle is not a fault


# ------------------------------------------------------------------------------ memory


def test_alloc_and_free_pinned(sim: Sim) -> None:
    drv = sim.drv
    ptr = workloads(drv).alloc_pinned(64)
    assert ptr != 0
    buf = (ctypes.c_uint8 * 64).from_address(ptr)
    assert bytes(buf) == bytes(64)  # zeroed
    buf[0], buf[63] = 0xAB, 0xCD
    assert (ctypes.c_uint8 * 64).from_address(ptr)[63] == 0xCD
    other = workloads(drv).alloc_pinned(8)
    assert other != ptr
    workloads(drv).free_pinned(ptr)
    workloads(drv).free_pinned(other)
    with pytest.raises(CudaError) as info:
        workloads(drv).free_pinned(ptr)  # double free
    assert info.value.status == 1
    for bad in (0, -4):
        with pytest.raises(ValueError, match="positive"):
            workloads(drv).alloc_pinned(bad)


def test_launch_check_frame_counts_mismatches(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    words, frames = 1000, 4
    src = workloads(drv).alloc_pinned(4 * words)
    out = workloads(drv).alloc_pinned(4 * frames)
    try:
        data = (ctypes.c_uint32 * words).from_address(src)
        counts = (ctypes.c_uint32 * frames).from_address(out)

        frame = 3
        for i in range(words):
            data[i] = frame_word(frame, i)
        workloads(drv).launch_check_frame(s, src, words, frame, out)
        sync(drv, s)
        assert list(counts) == [0, 0, 0, SEEN]  # intact: exactly SEEN, other slots untouched

        corrupt = (0, 17, 500, words - 1)
        for i in corrupt:
            data[i] ^= 0x1
        workloads(drv).launch_check_frame(s, src, words, frame, out)
        sync(drv, s)
        assert counts[frame] == 2 * SEEN + len(corrupt)  # adds, never overwrites

        # The same data checked as another frame: every word differs.
        workloads(drv).launch_check_frame(s, src, words, 1, out)
        sync(drv, s)
        assert counts[1] == SEEN + words
        assert counts[0] == 0
        assert counts[2] == 0

        # Only the first `words` words are checked.
        frame = 2
        for i in range(words):
            data[i] = frame_word(frame, i)
        workloads(drv).launch_check_frame(s, src, 10, frame, out)
        sync(drv, s)
        assert counts[frame] == SEEN
    finally:
        workloads(drv).free_pinned(src)
        workloads(drv).free_pinned(out)


def test_launch_check_frame_runs_in_stream_order(sim: Sim) -> None:
    drv, s = sim.drv, sim.stream()
    words = 16
    src = workloads(drv).alloc_pinned(4 * words)
    out = workloads(drv).alloc_pinned(4)
    try:
        data = (ctypes.c_uint32 * words).from_address(src)
        counts = (ctypes.c_uint32 * 1).from_address(out)
        gate = sim.gate(s)
        # The data is all zero now: 15 mismatches...
        workloads(drv).launch_check_frame(s, src, words, 0, out)

        def fill() -> None:  # ...unless the check ran before this fill, which it must not
            for i in range(words):
                data[i] = frame_word(0, i)

        drv.launch(s, fill)
        gate.set()
        sync(drv, s)
        assert counts[0] == SEEN + sum(1 for i in range(words) if frame_word(0, i) != 0)
    finally:
        workloads(drv).free_pinned(src)
        workloads(drv).free_pinned(out)


@pytest.mark.parametrize("words", [0, -1, SEEN])
def test_launch_check_frame_rejects_bad_word_counts(sim: Sim, words: int) -> None:
    drv, s = sim.drv, sim.stream()
    with pytest.raises(ValueError, match="words"):
        workloads(drv).launch_check_frame(s, 0, words, 0, 0)
    assert drv.stream_query(s)  # nothing enqueued


def test_an_unknown_handle_type_is_refused_as_the_driver_would() -> None:
    drv = SimDriver()
    producer = drv.create_semaphore()
    fd = producer.export_fd()
    try:
        with pytest.raises(CudaError) as err:
            drv.import_semaphore(0, SemaphoreDesc(99, fd=fd))
        assert err.value.status == 801  # CUDA_ERROR_NOT_SUPPORTED
    finally:
        os.close(fd)


def test_hold_refuses_anything_but_a_stream_of_the_simulated_device() -> None:
    from aiocudasem.testing import hold

    for bad in (7, None, "stream"):
        with pytest.raises(TypeError, match=r"needs an aiocudasem\.Stream"):
            hold(bad)  # type: ignore[arg-type]


def test_every_status_the_simulated_device_raises_has_its_symbolic_name() -> None:
    import re
    from pathlib import Path

    from aiocudasem._driver import _sim
    from aiocudasem._driver._sim._status import _CUDA_NAMES
    from aiocudasem._errors import STICKY_STATUSES

    source = "".join(p.read_text() for p in sorted(Path(_sim.__file__).parent.glob("*.py")))
    raised = {int(n) for n in re.findall(r"_error\((\d+)", source)}
    for status in raised | set(STICKY_STATUSES):
        assert status in _CUDA_NAMES, status
    with pytest.raises(CudaError) as info:
        SimDriver().stream_create(5, True, 0)
    assert info.value.name == "CUDA_ERROR_INVALID_DEVICE"
