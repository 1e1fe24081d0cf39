"""asyncio-only loop integration, through pytest-asyncio (strict mode): the notifier is per
loop, plays well with asyncio's own primitives, and survives loops coming and going."""

from __future__ import annotations

import asyncio

import pytest

import aiocudasem as acs
from aiocudasem._notifier import current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, workloads
from tests.conftest import open_fds


@pytest.mark.asyncio
async def test_gather_and_wait_for(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        ga, gb = hold(a), hold(b)
        task = asyncio.gather(a.wait_complete(), b.wait_complete())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 0.02)
        ga.set()
        gb.set()
        await asyncio.wait_for(task, 5)


@pytest.mark.asyncio
async def test_task_cancel_leaves_notifier_consistent(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        tasks = [asyncio.create_task(s.wait_complete()) for _ in range(10)]
        await asyncio.sleep(0.01)
        for t in tasks[::2]:
            t.cancel()
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert [isinstance(r, asyncio.CancelledError) for r in results] == [True, False] * 5
        assert statistics().parked == 0


def test_one_notifier_per_loop_and_no_fd_left_behind(sim: SimDriver) -> None:
    async def use() -> int:
        async with acs.open_stream(driver=sim) as s:
            hold(s).set()
            await s.wait_complete()
        n = current_notifier()
        assert current_notifier() is n  # one per loop
        return n.fileno()

    import gc

    before = open_fds()
    asyncio.run(use())
    asyncio.run(use())
    gc.collect()
    assert open_fds() == before  # each loop's notifier closed its fd when the loop went


def test_loops_in_two_threads_at_once(sim: SimDriver) -> None:
    import threading

    results: list[bool] = []

    def run() -> None:
        async def main() -> None:
            async with acs.open_stream(driver=sim) as s:
                for _ in range(50):
                    workloads(sim).launch_spin(s.handle, 100_000)
                    await s.wait_complete()
            results.append(True)

        asyncio.run(main())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True, True]
