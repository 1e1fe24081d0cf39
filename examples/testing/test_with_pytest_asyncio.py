"""Testing code that uses aiocudasem with pytest-asyncio, on the simulated device.

Run: ``pytest examples/testing/test_with_pytest_asyncio.py``. No GPU is needed: every object
comes from a fresh ``SimDriver``, a simulated machine private to the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from mycode import finished_within, process_frame

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, wait_all_tasks_blocked


@pytest.fixture
def sim() -> SimDriver:
    return SimDriver(devices=1)  # a fresh machine per test: an injected fault stays in it


@pytest_asyncio.fixture
async def stream(sim: SimDriver) -> AsyncIterator[acs.Stream]:
    async with acs.open_stream(driver=sim) as s:
        yield s


@pytest.mark.asyncio
async def test_kernel_runs_after_the_producer_signals(sim: SimDriver, stream: acs.Stream) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, peer = import_sim_semaphore(sim)
    seen: list[int] = []

    def kernel(s: acs.Stream) -> None:  # a simulated kernel: records what it saw when it ran
        sim.launch(s.handle, lambda: seen.append(producer.value))

    async with ready, done:
        task = asyncio.create_task(process_frame(stream, ready, done, 7, kernel))
        await wait_all_tasks_blocked()  # the task is parked on the GPU wait
        assert seen == []  # the kernel has not run
        assert peer.value == 0
        assert not task.done()
        producer.signal(7)
        async with asyncio.timeout(5):  # a bug fails the test instead of hanging it
            await task
        assert seen == [7]  # the kernel ran after the producer's signal
        assert peer.value == 7  # and the signal back fired before the task resumed


@pytest.mark.asyncio
async def test_finished_within_gives_up_and_the_stream_stays_usable(stream: acs.Stream) -> None:
    gate = hold(stream)  # the stream is busy until gate.set(): no timing guesswork
    assert not await finished_within(stream, 0.05)
    gate.set()
    assert await finished_within(stream, 5)


@pytest.mark.asyncio
async def test_a_device_fault_reaches_the_consumer(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)  # the producer never signals
    done, _ = import_sim_semaphore(sim)
    stream = acs.open_stream(driver=sim)
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, sim.inject_fault, 0, 700)  # CUDA_ERROR_ILLEGAL_ADDRESS, mid-wait
    async with asyncio.timeout(5):
        with pytest.raises(acs.DeviceFaultError) as info:
            await process_frame(stream, ready, done, 1, lambda s: None)
    assert info.value.status == 700
    stream.close()  # releases it without waiting for work that the fault dropped
    await ready.aclose()  # semaphores close normally after a fault
    await done.aclose()
