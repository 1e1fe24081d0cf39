"""Cancel in the middle of an operation, then prove the library is still consistent: the
stream works, the notifier still wakes everyone else, and no fd leaked."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier import current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import open_fds

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["spin", "park"])
def phase(request: pytest.FixtureRequest) -> Iterator[str]:
    """Cancel while spinning, or while parked on the notifier."""
    if request.param == "park":
        acs.configure(spin_limit=0)
    else:
        acs.configure(spin_limit=10.0, max_spinners=1000)
    yield request.param
    default = acs.Tuning()
    acs.configure(spin_limit=default.spin_limit, max_spinners=default.max_spinners)


async def test_cancelled_wait_leaves_stream_and_notifier_usable(sim: SimDriver, phase: str) -> None:
    current_notifier()  # its fd is per loop, not per wait: open it before counting
    fds = open_fds()
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        with anyio.move_on_after(0.02) as scope:
            await s.wait_complete()
        assert scope.cancelled_caught
        gate.set()
        with anyio.fail_after(5):
            await s.wait_complete()
        gate2 = hold(s)
        gate2.set()
        with anyio.fail_after(5):
            await s.wait_complete()
    assert open_fds() == fds
    assert statistics().parked == 0


async def test_cancelling_the_drainer_loses_no_wakeup(sim: SimDriver) -> None:
    acs.configure(spin_limit=0)
    try:
        async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
            gate_a = hold(a)
            gate_b = hold(b)
            woke: list[str] = []

            async def wait(stream: acs.Stream, name: str) -> None:
                await stream.wait_complete()
                woke.append(name)

            async with anyio.create_task_group() as tg:
                first = anyio.CancelScope()
                # The first parked waiter becomes the drainer.
                tg.start_soon(_scoped, first, wait(a, "a"))
                await anyio.wait_all_tasks_blocked()
                tg.start_soon(wait, b, "b")
                await anyio.wait_all_tasks_blocked()
                first.cancel()  # cancel the drainer while b sleeps
                await anyio.wait_all_tasks_blocked()
                gate_b.set()  # b's completion must still be noticed
                with anyio.fail_after(5):
                    while woke != ["b"]:
                        await anyio.sleep(0.001)
            gate_a.set()
            assert woke == ["b"]
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def _scoped(scope: anyio.CancelScope, coro: object) -> None:
    with scope:
        await coro  # type: ignore[misc]


async def test_cancel_many_random_waiters_others_all_wake(sim: SimDriver) -> None:
    acs.configure(spin_limit=0)
    try:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            ev = s.record()
            woke = 0
            scopes = [anyio.CancelScope() for _ in range(40)]

            async def waiter(i: int) -> None:
                nonlocal woke
                with scopes[i]:
                    await ev.wait()
                    woke += 1

            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(waiter, i)
                await anyio.wait_all_tasks_blocked()
                for i in range(0, 40, 3):  # the drainer (first) among them
                    scopes[i].cancel()
                await anyio.wait_all_tasks_blocked()
                gate.set()
            assert woke == 40 - len(range(0, 40, 3))
            ev.close()
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


async def test_cancelled_host_semaphore_wait_then_reuse(sim: SimDriver) -> None:
    fds = open_fds()
    sem, producer = import_sim_semaphore(sim)
    for _ in range(5):
        with anyio.move_on_after(0.005):
            await sem.wait_value(100)
    producer.signal(100)
    with anyio.fail_after(5):
        await sem.wait_value(100)
    await sem.aclose()
    assert open_fds() - fds <= {current_notifier().fileno()}


async def test_timeout_with_fail_after(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.02):
                await s.wait_complete()
        gate.set()
