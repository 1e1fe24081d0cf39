from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, wait_all_tasks_blocked


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # or "trio", or parametrize over both


@pytest.fixture
def sim() -> SimDriver:
    return SimDriver(devices=1)  # a fresh machine per test: faults stay inside it


async def process_frame(
    stream: acs.Stream,
    ready: acs.ExternalSemaphore,
    done: acs.ExternalSemaphore,
    n: int,
    kernel: Callable[[acs.Stream], None],
) -> None:
    """The code under test: wait for the producer, run a kernel, hand the frame back."""
    async with stream.handoff(acs.Wait(ready, n), acs.Signal(done, n)):
        kernel(stream)


@pytest.mark.anyio
async def test_kernel_runs_only_after_the_producer_signals(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, peer = import_sim_semaphore(sim)
    seen: list[int] = []

    def kernel(stream: acs.Stream) -> None:
        sim.launch(stream, lambda: seen.append(producer.value))

    async with ready, done, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(process_frame, stream, ready, done, 1, kernel)
                await wait_all_tasks_blocked()
                assert seen == []  # the GPU side is still waiting:
                assert peer.value == 0  # no kernel yet, no signal back
                producer.signal(1)
        assert seen == [1]  # the kernel saw the producer's value
        assert peer.value == 1  # and the signal back fired before the task resumed


@pytest.mark.anyio
async def test_wait_is_cancellable(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        gate = hold(stream)  # the stream is busy until gate.set()
        with anyio.move_on_after(0.05) as scope:
            await stream.wait_complete()
        assert scope.cancelled_caught
        gate.set()
        with anyio.fail_after(5):
            await stream.wait_complete()  # the stream is still usable


@pytest.mark.anyio
async def test_device_fault_reaches_the_waiter(sim: SimDriver) -> None:
    stream = acs.open_stream(driver=sim)
    hold(stream)  # never released: only the fault ends it

    async def fault_soon() -> None:
        await anyio.sleep(0.01)
        sim.inject_fault(0, status=700)  # CUDA_ERROR_ILLEGAL_ADDRESS

    async with anyio.create_task_group() as tg:
        tg.start_soon(fault_soon)
        with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError) as info:
            await stream.wait_complete()
    assert info.value.status == 700
    with pytest.raises(acs.DeviceFaultError):
        await stream.aclose()  # its wait for pending work fails...
    assert stream.closed  # ...but the stream is released


@pytest.mark.anyio
async def test_host_side_waits(sim: SimDriver) -> None:
    tl, producer = import_sim_semaphore(sim)
    binary, bproducer = import_sim_semaphore(sim, timeline=False)
    producer.signal(3)
    bproducer.signal()
    with anyio.fail_after(5):
        await tl.wait_value(2)  # >= semantics
        await binary.wait_signaled()  # consumes the signal
    assert bproducer.value == 0
    await tl.aclose()
    await binary.aclose()


def test_env_var_selects_the_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIOCUDASEM_DRIVER", "sim")
    assert acs.get_driver().simulated
