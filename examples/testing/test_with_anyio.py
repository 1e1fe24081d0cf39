"""Testing code that uses aiocudasem with anyio's pytest plugin, on asyncio and on trio.

Run: ``pytest -p anyio examples/testing/test_with_anyio.py`` (the plugin comes with anyio;
``-p anyio`` loads it even where plugin autoloading is off). Each test runs once per backend of
the ``anyio_backend`` fixture below. No GPU is needed: every object comes from a fresh
``SimDriver``, a simulated machine private to the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from mycode import finished_within, process_frame

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, wait_all_tasks_blocked

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sim() -> SimDriver:
    return SimDriver(devices=1)  # a fresh machine per test: an injected fault stays in it


@pytest.fixture
async def stream(sim: SimDriver) -> AsyncIterator[acs.Stream]:
    async with acs.open_stream(driver=sim) as s:
        yield s


async def test_kernel_runs_after_the_producer_signals(sim: SimDriver, stream: acs.Stream) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, peer = import_sim_semaphore(sim)
    seen: list[int] = []

    def kernel(s: acs.Stream) -> None:  # a simulated kernel: records what it saw when it ran
        sim.launch(s.handle, lambda: seen.append(producer.value))

    async with ready, done:
        with anyio.fail_after(5):  # a bug fails the test instead of hanging it
            async with anyio.create_task_group() as tg:
                tg.start_soon(process_frame, stream, ready, done, 7, kernel)
                await wait_all_tasks_blocked()  # the task is parked on the GPU wait
                assert seen == []  # the kernel has not run
                assert peer.value == 0
                producer.signal(7)
        assert seen == [7]  # the kernel ran after the producer's signal
        assert peer.value == 7  # and the signal back fired before the task resumed


async def test_finished_within_gives_up_and_the_stream_stays_usable(stream: acs.Stream) -> None:
    gate = hold(stream)  # the stream is busy until gate.set(): no timing guesswork
    assert not await finished_within(stream, 0.05)
    gate.set()
    assert await finished_within(stream, 5)


async def test_a_device_fault_reaches_the_consumer(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)  # the producer never signals
    done, _ = import_sim_semaphore(sim)
    stream = acs.open_stream(driver=sim)

    async def fault_soon() -> None:
        await anyio.sleep(0.01)
        sim.inject_fault(0, status=700)  # CUDA_ERROR_ILLEGAL_ADDRESS, mid-wait

    async with anyio.create_task_group() as tg:
        tg.start_soon(fault_soon)
        with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError) as info:
            await process_frame(stream, ready, done, 1, lambda s: None)
    assert info.value.status == 700
    stream.close()  # releases it without waiting for work that the fault dropped
    await ready.aclose()  # semaphores close normally after a fault
    await done.aclose()
