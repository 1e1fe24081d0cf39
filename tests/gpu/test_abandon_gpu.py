"""Giving up on a producer and closing under waiters, on the real driver: Vulkan semaphores
imported into CUDA, and host timelines. The CPU suite's tests/test_abandon.py checks the same
promises on the simulated device."""

from __future__ import annotations

import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice
from tests.gpu.conftest import import_vk

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


async def test_abandon_lets_a_blocked_handoff_and_its_objects_close(
    cuda: acs.Driver, vk: VulkanDevice
) -> None:
    vk_ready, vk_done = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
    try:
        ready, done = import_vk(vk_ready, cuda), import_vk(vk_done, cuda)
        errors: list[BaseException] = []
        with anyio.fail_after(20):
            async with ready, done, acs.open_stream(driver=cuda) as stream:
                with anyio.move_on_after(0.2) as scope:
                    async with stream.handoff(acs.Wait(ready, 5), acs.Signal(done, 5)):
                        pass
                assert scope.cancelled_caught

                async def parked() -> None:
                    try:
                        await ready.wait_value(6)
                    except acs.AbandonedError as exc:
                        errors.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(parked)
                    await anyio.sleep(0.05)
                    gave_up = time.monotonic()
                    ready.abandon()
                await stream.wait_complete()
            closed_after = time.monotonic() - gave_up
        assert len(errors) == 1
        assert vk_ready.value == 6  # the highest value waited for, signalled by CUDA
        assert vk_done.value == 5  # the section's signal went out behind the released wait
        assert closed_after < 1.0, closed_after
    finally:
        vk_ready.close()
        vk_done.close()


async def test_abandon_of_a_binary_semaphore_on_the_gpu(cuda: acs.Driver, vk: VulkanDevice) -> None:
    vk_sem = vk.create_binary_semaphore()
    try:
        sem = import_vk(vk_sem, cuda)
        with anyio.fail_after(20):
            async with sem, acs.open_stream(driver=cuda) as a, acs.open_stream(driver=cuda) as b:
                a.enqueue_wait(acs.Wait(sem))
                b.enqueue_wait(acs.Wait(sem))
                await anyio.sleep(0.05)
                assert not a.query() and not b.query()
                sem.abandon()
                await a.wait_complete()
                await b.wait_complete()
    finally:
        vk_sem.close()


async def test_closing_wakes_parked_waiters_on_the_gpu(cuda: acs.Driver, vk: VulkanDevice) -> None:
    vk_sem = vk.create_timeline_semaphore()
    timeline = acs.create_host_timeline(driver=cuda)
    twin = acs.open_host_timeline(timeline.export_fd(), driver=cuda)  # the same page
    try:
        sem = import_vk(vk_sem, cuda)
        outcomes: list[str] = []

        async def wait(fn: object) -> None:
            try:
                await fn()  # type: ignore[operator]
            except anyio.ClosedResourceError:
                outcomes.append("closed")

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait, lambda: sem.wait_value(3))
                tg.start_soon(wait, lambda: timeline.wait_value(3))
                await anyio.sleep(0.05)
                woke = time.monotonic()
                sem.close()
                timeline.close()
                while len(outcomes) < 2:
                    await anyio.sleep(0.001)
                woke = time.monotonic() - woke
                # Their GPU waits are still enqueued: satisfy them, so that the semaphore's
                # destruction and the page's release can finish.
                vk_sem.signal(3)
                twin.signal(3)
        assert outcomes == ["closed", "closed"]
        assert woke < 0.1, woke
    finally:
        timeline.close()
        await twin.aclose()
        vk_sem.close()


async def test_host_timeline_abandon_on_the_gpu(cuda: acs.Driver) -> None:
    with anyio.fail_after(20):
        t = acs.create_host_timeline(driver=cuda)
        done = acs.create_host_timeline(driver=cuda)
        async with t, done, acs.open_stream(driver=cuda) as s:
            with anyio.move_on_after(0.1):
                async with s.handoff(acs.Wait(t, 10), acs.Signal(done, 11)):
                    pass
            t.abandon()
            with pytest.raises(acs.AbandonedError):
                await t.wait_value(12)
            await s.wait_complete()
            assert t.value == acs.HostTimeline.MAX
            assert done.value == 11
