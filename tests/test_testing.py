"""The helpers of aiocudasem.testing."""

from __future__ import annotations

import time
from statistics import median

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, import_sim_semaphore, wait_all_tasks_blocked

pytestmark = pytest.mark.anyio


async def test_import_sim_semaphore_takes_sim_like_every_driver_argument() -> None:
    # It raised AttributeError ('str' object has no attribute 'create_semaphore').
    sem, producer = import_sim_semaphore("sim")
    async with sem:
        assert sem.driver is acs.get_driver("sim")
        assert sem.is_timeline
        producer.signal(2)
        with anyio.fail_after(5):
            await sem.wait_value(2)
    binary, bproducer = import_sim_semaphore("sim", timeline=False, initial=1, device=1)
    async with binary:
        assert binary.device == 1
        assert not binary.is_timeline
        assert bproducer.value == 1


@pytest.mark.parametrize("driver", ["cuda", "opencl", None, 0])
async def test_import_sim_semaphore_refuses_other_drivers(driver: object) -> None:
    with pytest.raises(TypeError, match="needs the simulated driver: pass a SimDriver or 'sim'"):
        import_sim_semaphore(driver)  # type: ignore[arg-type]


async def _handoff(stream: acs.Stream, sem: acs.ExternalSemaphore, left: list[bool]) -> None:
    async with stream.handoff(acs.Wait(sem, 1), acs.Signal(sem, 2)):
        pass  # the GPU waits for the producer; the exit awaits the stream
    left.append(True)


async def test_wait_all_tasks_blocked_returns_soon_after_a_wait_starts(sim: SimDriver) -> None:
    """Right after a hand-off starts its wait can run (its checkpoint, its spin) before it
    parks: anyio's call then takes 0.1 s on asyncio. The library's looks again each pass.
    The bound is loose (a loaded machine), the median of ten far below anyio's 0.1 s."""
    took = []
    for _ in range(10):
        sem, producer = import_sim_semaphore(sim)
        async with sem, acs.open_stream(driver=sim) as stream:
            left: list[bool] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(_handoff, stream, sem, left)
                t0 = time.perf_counter()
                with anyio.fail_after(10):
                    await wait_all_tasks_blocked()
                took.append(time.perf_counter() - t0)
                assert left == []  # its exit waits for the producer's value
                assert statistics().parked == 1  # parked, not spinning
                producer.signal(1)
            assert left == [True]
    assert median(took) < 0.03, took


async def test_wait_all_tasks_blocked_waits_for_a_task_that_keeps_running() -> None:
    """It does not return while another task can run: here one that yields 2,000 times."""
    steps = []
    release = anyio.Event()

    async def busy() -> None:
        for i in range(2000):
            steps.append(i)
            await anyio.lowlevel.checkpoint()
        await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(busy)
        with anyio.fail_after(10):
            await wait_all_tasks_blocked()
        assert len(steps) == 2000
        release.set()


async def test_two_wait_all_tasks_blocked_see_each_other_as_blocked() -> None:
    done = []

    async def waiter() -> None:
        await wait_all_tasks_blocked()
        done.append(True)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
    assert done == [True, True]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_wait_all_tasks_blocked_falls_back_to_anyios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task that does not show the future it awaits: anyio's, which is right, only slower."""
    from aiocudasem._notifier._loops import _asyncio

    monkeypatch.setattr(_asyncio, "has_fut_waiter", lambda task: False)
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(release.wait)
        with anyio.fail_after(10):
            await wait_all_tasks_blocked()
        release.set()
