"""A loop's notifier lives exactly as long as the loop: its fd and its points are released when
the loop ends, not when the garbage collector gets round to it. Points and Events outlive loops
cleanly, and a forked child gets a clear error instead of a hang."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier import event_pool
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, workloads
from tests.conftest import fd_targets, open_fds, wait_for_child, watchdog_events

BACKENDS = [
    pytest.param("asyncio", {}, id="asyncio"),
    pytest.param("asyncio", {"use_uvloop": True}, id="asyncio+uvloop"),
    pytest.param("trio", {}, id="trio"),
]


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Prove that a release does not wait for the collector."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize(("backend", "options"), BACKENDS)
def test_each_loop_releases_its_fd_when_it_ends(
    backend: str, options: dict[str, Any], parked: None, no_gc: None
) -> None:
    sim = SimDriver(devices=1)

    async def one_loop() -> None:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(s.wait_complete)
                    while statistics().parked == 0:  # parked: the notifier and its fd exist
                        await anyio.sleep(0.001)
                    gate.set()
            assert statistics().fired == 1

    anyio.run(one_loop, backend=backend, backend_options=options)  # warm-up: threads, pools
    before = open_fds()
    for _ in range(200):
        anyio.run(one_loop, backend=backend, backend_options=options)
    new = fd_targets(open_fds() - before)
    assert not new, f"ended loops kept fds until collection: {new}"


@pytest.mark.parametrize(("backend", "options"), BACKENDS)
def test_a_loop_ending_with_an_armed_cancelled_wait_leaks_neither_fd_nor_event(
    backend: str, options: dict[str, Any], parked: None, no_gc: None
) -> None:
    sim = SimDriver(devices=1)
    gates: list[threading.Event] = []
    streams: list[acs.Stream] = []

    async def one_loop() -> None:
        s = acs.open_stream(driver=sim)
        streams.append(s)
        gates.append(hold(s))
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            with anyio.fail_after(5):
                while statistics().pending == 0:  # parked, its host function armed
                    await anyio.sleep(0.001)
            tg.cancel_scope.cancel()  # then abandoned
        assert statistics().pending == 1

    anyio.run(one_loop, backend=backend, backend_options=options)
    before = open_fds()
    for _ in range(20):
        anyio.run(one_loop, backend=backend, backend_options=options)
    # The loops are over, their host functions still outstanding (the work is gated), yet their
    # fds are gone already.
    new = fd_targets(open_fds() - before)
    assert not new, f"ended loops kept fds: {new}"
    for g in gates:
        g.set()
    for s in streams:
        s.close()
    # Every event is back in the pool: none was left behind with a dead loop. (The fault
    # watchdog's own event lives as long as its thread.)
    with sim._lock:
        events = set(sim._events)
    assert events - watchdog_events(sim) == set(event_pool.free_list(sim, 0))


@pytest.mark.parametrize(("backend", "options"), BACKENDS)
def test_an_event_can_be_awaited_again_in_a_later_loop(
    backend: str, options: dict[str, Any], parked: None
) -> None:
    sim = SimDriver(devices=1)
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    ev = s.record()

    async def abandon() -> None:
        with anyio.move_on_after(0.01) as scope:
            await ev.wait()  # armed in this loop's notifier, then cancelled
        assert scope.cancelled_caught

    async def wait() -> None:
        with anyio.fail_after(5):  # this hung silently
            await ev.wait()

    anyio.run(abandon, backend=backend, backend_options=options)
    gate.set()
    anyio.run(wait, backend=backend, backend_options=options)
    assert ev.query()
    ev.close()
    s.close()


def test_an_event_awaited_by_two_loops_at_once_is_refused(parked: None) -> None:
    sim = SimDriver(devices=1)
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    ev = s.record()
    parked_in_a = threading.Event()
    release_a = threading.Event()
    errors: list[BaseException] = []

    async def loop_a() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ev.wait)
            await anyio.wait_all_tasks_blocked()
            parked_in_a.set()
            await anyio.to_thread.run_sync(release_a.wait)
            gate.set()

    def run_a() -> None:
        try:
            anyio.run(loop_a)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=run_a)
    t.start()
    try:
        assert parked_in_a.wait(5)

        async def loop_b() -> None:
            with anyio.fail_after(5), pytest.raises(anyio.BusyResourceError, match="one event"):
                await ev.wait()

        anyio.run(loop_b, backend="trio")
    finally:
        release_a.set()
        t.join(5)
    assert not t.is_alive()
    assert errors == []
    ev.close()
    s.close()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_loop_that_meets_another_loops_arming_mid_wait_is_refused(
    parked: None, backend: str
) -> None:
    """Loop B begins to wait for an event before loop A has armed it, and A arms it during
    B's first checkpoint. B must be refused when it comes to arm, not park on A's host
    function (which reports to A's fd, never to B's: B would hang, and A would wake B's
    coroutines from A's thread)."""
    from aiocudasem._notifier import current_notifier

    sim = SimDriver(devices=1)
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    ev = s.record()
    b_began, armed_in_a = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    async def loop_b() -> None:
        notifier = current_notifier()
        checkpoint, first = notifier.checkpoint, True

        def checkpoint_after_a_arms() -> Any:
            nonlocal first
            if first:  # B's first checkpoint: A arms the point meanwhile
                first = False
                b_began.set()
                assert armed_in_a.wait(5)
            return checkpoint()

        notifier.checkpoint = checkpoint_after_a_arms
        try:
            with anyio.fail_after(5):
                await ev.wait()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    t = threading.Thread(target=anyio.run, args=(loop_b,), kwargs={"backend": backend})
    t.start()

    async def loop_a() -> None:
        assert await anyio.to_thread.run_sync(b_began.wait, 5)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ev.wait)
            await anyio.wait_all_tasks_blocked()
            armed_in_a.set()
            await anyio.to_thread.run_sync(t.join, 10)
            gate.set()

    try:
        anyio.run(loop_a)
    finally:
        armed_in_a.set()
        gate.set()
        t.join(10)
    assert not t.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], anyio.BusyResourceError), repr(outcome[0])
    assert "one event loop at a time" in str(outcome[0])
    ev.close()
    s.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() with threads
def test_a_forked_child_gets_a_clear_error_not_a_hang() -> None:
    sim = SimDriver(devices=1)
    s = acs.open_stream(driver=sim)
    sem, producer = _used_semaphore(sim)

    async def use() -> None:
        workloads(sim).launch_spin(s.handle, 10_000)
        await s.wait_complete()
        producer.signal(1)
        await sem.wait_value(1)

    anyio.run(use)  # the parent used the stream, the semaphore, the pools and the workers
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 10
        try:

            async def child() -> int:
                failures = 0
                with anyio.fail_after(5):
                    for op in (s.wait_complete, lambda: sem.wait_value(2)):
                        try:
                            await op()
                        except acs.DriverUnavailableError as exc:
                            failures += "fork" in str(exc)
                try:
                    acs.open_stream(driver=sim)
                except acs.DriverUnavailableError:
                    failures += 1
                return 0 if failures == 3 else 11

            code = anyio.run(child)
            if code == 0:
                fresh = SimDriver(devices=1)  # a simulated device made in the child works

                async def fresh_device() -> None:
                    with anyio.fail_after(5):
                        async with acs.open_stream(driver=fresh) as t:
                            workloads(fresh).launch_spin(t.handle, 10_000)
                            await t.wait_complete()

                anyio.run(fresh_device)
        except BaseException:
            code = 12
        os._exit(code)
    assert wait_for_child(pid, 30) == 0
    s.close()
    anyio.run(sem.aclose)


@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork() with threads
async def test_a_fork_does_not_leave_the_parents_parked_loop_spinning() -> None:
    """A forked child shares the parent's eventfd; whatever it writes there (its at-fork handler
    wakes its own inherited loops) must cost the parked parent one wake-up, not a busy loop."""
    import time

    sim = SimDriver(devices=1)
    async with acs.open_stream(driver=sim) as s:
        workloads(sim).launch_spin(s.handle, 800_000_000)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await anyio.sleep(0.2)  # parked: the drainer sleeps on the fd
            assert statistics().parked == 1
            woke, cpu = statistics().drainer_wakeups, time.process_time()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - a child that never runs a loop
                os._exit(0)
            assert wait_for_child(pid, 30) == 0
        woke = statistics().drainer_wakeups - woke
        cpu = time.process_time() - cpu
    assert woke <= 3, f"the parent's drainer woke {woke} times"
    assert cpu < 0.3, f"the parent used {cpu:.2f} s of CPU while parked"


def _used_semaphore(sim: SimDriver) -> tuple[acs.ExternalSemaphore, Any]:
    from aiocudasem.testing import import_sim_semaphore

    return import_sim_semaphore(sim)
