from __future__ import annotations

import resource
from collections.abc import Iterator

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold
from tests.conftest import open_fds

pytestmark = pytest.mark.anyio


@pytest.fixture
def fd_limit_1024() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_ten_thousand_awaits_under_a_1024_fd_limit(
    sim: SimDriver, fd_limit_1024: None
) -> None:
    before = open_fds()
    streams = [acs.open_stream(driver=sim) for _ in range(64)]
    gates = [hold(s) for s in streams]
    woke = 0

    async def waiter(s: acs.Stream) -> None:
        nonlocal woke
        await s.wait_complete()
        woke += 1

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(10_000):
                tg.start_soon(waiter, streams[i % 64])
            await anyio.wait_all_tasks_blocked()
            # One fd for the loop's notifier, however many waiters are parked.
            assert len(open_fds() - before) <= 1
            assert statistics().parked > 9000
            for g in gates:
                g.set()
    assert woke == 10_000
    for s in streams:
        await s.aclose()
