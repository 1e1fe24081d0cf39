"""Host stages on the real GPU: the stream waits with cuStreamWaitValue64 on its stages'
host timeline, the notifier's host function on the work stream reports each stage's turn, and
the loop's host store releases the stream; kernels before and behind the stages check the
order."""

from __future__ import annotations

import ctypes
import time
from typing import Any

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem._stages import MAX_PENDING
from aiocudasem.testing import SEEN, frame_words, workloads
from tests.gpu.conftest import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MS = 1_000_000  # ns


class Pinned:
    """A pinned ring of frame slots and a pinned array of the check kernel's verdicts."""

    def __init__(self, cuda: acs.Driver, frames: int, ring: int, words: int) -> None:
        self.work = workloads(cuda)
        self.ring, self.words = ring, words
        self.buf = self.work.alloc_pinned(ring * words * 4)
        self.out = self.work.alloc_pinned((frames + 2) * 4)
        slots = np.ctypeslib.as_array((ctypes.c_uint32 * (ring * words)).from_address(self.buf))
        self.slots = slots.reshape(ring, words)
        self.res = np.ctypeslib.as_array((ctypes.c_uint32 * (frames + 2)).from_address(self.out))
        self.res[:] = 0

    def slot(self, n: int) -> int:
        return self.buf + (n % self.ring) * self.words * 4

    def free(self) -> None:
        self.work.free_pinned(self.buf)
        self.work.free_pinned(self.out)


async def test_stages_fill_1000_frames_that_the_kernels_behind_them_check(
    cuda: acs.Driver,
) -> None:
    """Stage n writes frame n into a ring slot; the kernel behind it checks every word. The
    stage reuses a slot with no other care: it runs after the kernel of the frame before in
    that slot, which is ahead of it on the stream. Up to ``MAX_PENDING`` are pending at once
    (more would fill the driver's queue of commands behind the first, and block the loop)."""
    frames, ring, words = 1000, 4, 1024
    p = Pinned(cuda, frames, ring, words)

    async def fill(n: int) -> None:
        p.slots[n % ring] = frame_words(n, words)

    try:
        async with acs.open_stream(driver=cuda) as s:
            stages = []
            with anyio.fail_after(60):
                for n in range(1, frames + 1):
                    if n > MAX_PENDING:
                        await stages[n - 1 - MAX_PENDING]
                    stages.append(s.enqueue_host(fill, n))
                    p.work.launch_check_frame(s.handle, p.slot(n), words, n, p.out)
                await s.wait_complete()
            assert all(st.done() for st in stages)
            bad = [n for n in range(1, frames + 1) if p.res[n] != SEEN]
            assert bad == []

            # A frame that is wrong is caught: the kernels really read what the stages wrote.
            async def spoil(n: int) -> None:
                p.slots[n % ring] = frame_words(n, words)
                p.slots[n % ring][7] ^= 1

            s.enqueue_host(spoil, frames + 1)
            p.work.launch_check_frame(s.handle, p.slot(frames + 1), words, frames + 1, p.out)
            with anyio.fail_after(10):
                await s.wait_complete()
            assert p.res[frames + 1] == SEEN + 1
    finally:
        p.free()
    cuda.check_health(0)


async def test_the_stage_runs_after_the_work_before_and_holds_the_work_behind(
    cuda: acs.Driver,
) -> None:
    seen: list[int] = []
    async with acs.create_host_timeline(driver=cuda) as t, acs.open_stream(driver=cuda) as s:
        work = workloads(cuda)
        work.launch_spin(s.handle, 50 * MS)
        s.enqueue_signal(acs.Signal(t, 1))
        t0 = time.perf_counter()

        async def stage() -> float:
            started = time.perf_counter() - t0
            seen.append(t.value)
            await anyio.sleep(0.05)
            seen.append(t.value)  # the signal behind the stage has not been written
            return started

        st = s.enqueue_host(stage)
        s.enqueue_signal(acs.Signal(t, 2))
        with anyio.fail_after(10):
            started = await st
            await t.wait_value(2)
        assert started > 0.03  # not before the kernel ended
        assert seen == [1, 1]
        assert time.perf_counter() - t0 > 0.08  # the signal waited for the stage's sleep
    cuda.check_health(0)


async def test_a_wait_parked_behind_a_stage_does_not_hold_it_up(cuda: acs.Driver) -> None:
    """``wait_complete()`` right after ``enqueue_host()`` parks before the stage's task runs;
    its host function waits for work that waits for the stage."""
    acs.configure(spin_limit=0)
    try:
        async with acs.open_stream(driver=cuda) as s:
            work = workloads(cuda)
            ran = []

            async def stage() -> None:
                ran.append(1)

            for _ in range(20):
                work.launch_spin(s.handle, 2 * MS)
                s.enqueue_host(stage)
                work.launch_spin(s.handle, 1 * MS)
                with anyio.fail_after(10):
                    await s.wait_complete()
            assert len(ran) == 20
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)
    cuda.check_health(0)


async def test_a_failed_stage_releases_the_stream_and_abandons_the_next(cuda: acs.Driver) -> None:
    async with acs.create_host_timeline(driver=cuda) as t, acs.open_stream(driver=cuda) as s:
        work = workloads(cuda)

        async def fails() -> None:
            raise ConnectionResetError("gone")

        async def after() -> None:
            raise AssertionError("ran behind a failed stage")

        work.launch_spin(s.handle, 10 * MS)
        bad = s.enqueue_host(fails)
        s.enqueue_signal(acs.Signal(t, 1))
        behind = s.enqueue_host(after)
        with anyio.fail_after(10):
            with pytest.raises(ConnectionResetError):
                await bad
            with pytest.raises(acs.AbandonedError):
                await behind
            await s.wait_complete()
        assert t.value == 1  # the work behind the failed stage ran
    cuda.check_health(0)


async def test_close_under_a_running_stage_releases_everything(cuda: acs.Driver) -> None:
    started = anyio.Event()

    async def stuck() -> None:
        started.set()
        await anyio.sleep_forever()

    s = acs.open_stream(driver=cuda)
    work = workloads(cuda)
    st = s.enqueue_host(stuck)
    work.launch_spin(s.handle, 1 * MS)
    pending = s.enqueue_host(stuck)
    with anyio.fail_after(10):
        await started.wait()
        s.close()  # releases both positions, then the timeline once the stream has passed
        for stage in (st, pending):
            with pytest.raises(acs.StageCancelledError):
                await stage
    async with acs.open_stream(driver=cuda) as other:  # the device goes on
        work.launch_spin(other.handle, 1 * MS)
        with anyio.fail_after(10):
            await other.wait_complete()
    cuda.check_health(0)


async def test_the_loop_ending_releases_a_pending_stage(
    cuda: acs.Driver, anyio_backend: Any
) -> None:
    stages: list[acs.HostStage[None]] = []

    async def stage() -> None:
        await anyio.sleep_forever()

    async with acs.open_stream(driver=cuda) as s:
        work = workloads(cuda)
        work.launch_spin(s.handle, 20 * MS)

        async def main() -> None:
            stages.append(s.enqueue_host(stage))  # ends before the spin: not its turn yet

        def run() -> None:
            name, options = anyio_backend
            anyio.run(main, backend=name, backend_options=options)

        await anyio.to_thread.run_sync(run)
        work.launch_spin(s.handle, 1 * MS)
        with anyio.fail_after(10):
            await s.wait_complete()  # not left blocked
        with pytest.raises(acs.StageCancelledError):
            await stages[0]
    cuda.check_health(0)


_MANY_STREAMS_WITH_STAGES = """
import sys
import anyio
import aiocudasem as acs
from aiocudasem.testing import workloads

backend, uvloop = sys.argv[1], sys.argv[2] == "uvloop"
MS = 1_000_000

async def main():
    drv = acs.get_driver("cuda")
    work = workloads(drv)
    streams = [acs.open_stream(driver=drv) for _ in range(64)]
    ran = 0

    async def stage():
        nonlocal ran
        await anyio.sleep(0.001)
        ran += 1

    woke = 0

    async def waiter(s):
        nonlocal woke
        await s.wait_complete()
        woke += 1

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for s in streams:  # each stream's first stage registers its timeline's page
                work.launch_spin(s.handle, 5 * MS)
                for _ in range(4):
                    s.enqueue_host(stage)
                    work.launch_spin(s.handle, MS // 10)
                for _ in range(4):
                    tg.start_soon(waiter, s)
        for s in streams:
            await s.aclose()
    assert ran == 256 and woke == 256, (ran, woke)
    print("ran", ran, "woke", woke)

anyio.run(main, backend=backend, backend_options={"use_uvloop": True} if uvloop else {})
"""


@pytest.mark.parametrize(
    ("backend", "uvloop"), [("asyncio", False), ("asyncio", True), ("trio", False)]
)
def test_64_streams_each_held_by_its_stages_with_waiters_parked_behind(
    backend: str, uvloop: bool
) -> None:
    """Streams blocked on their stages' timelines while waits park behind them, and each
    stream's first stage, which registers a page (cuMemHostRegister), enqueued while the
    others are blocked already. A fresh process: a hang fails by the timeout instead of
    holding the suite."""
    proc = run_script(
        _MANY_STREAMS_WITH_STAGES, backend, "uvloop" if uvloop else "plain", timeout=120
    )
    assert "ran 256 woke 256" in proc.stdout
