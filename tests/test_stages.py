"""Host stages on the simulated device: a coroutine runs in a stream's order
(``Stream.enqueue_host()``), after the work before it and before the work behind it; its result
and its exception reach ``await stage``; a failed or cancelled stage releases the stream and
abandons the stages behind it; the end of the event loop and closing the stream release what is
pending; and nothing is left behind."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import threading
import time
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem import HostStage
from aiocudasem._notifier import _loops, current_notifier
from aiocudasem._stages import MAX_PENDING
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, workloads

pytestmark = pytest.mark.anyio


def registered(sim: SimDriver) -> int:
    """How many pages of host memory ``sim`` has registered (host timelines' pages)."""
    with sim._lock:
        return len(sim._words)


def until(predicate: Any, timeout: float = 10.0) -> bool:
    """Whether ``predicate()`` holds within ``timeout`` seconds (polled from this thread)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


class Log:
    """What ran, in order, with when: kernels of the simulated device write here from their
    thread, stages from the loop's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, float]] = []

    def add(self, what: str) -> None:
        with self.lock:
            self.items.append((what, time.perf_counter()))

    def kernel(self, sim: SimDriver, stream: acs.Stream, what: str, seconds: float = 0) -> None:
        def run() -> None:
            if seconds:
                time.sleep(seconds)
            self.add(what)

        sim.launch(stream.handle, run)

    @property
    def names(self) -> list[str]:
        with self.lock:
            return [w for w, _ in self.items]

    def at(self, what: str) -> float:
        with self.lock:
            return next(t for w, t in self.items if w == what)


# ---------------------------------------------------------------------- order


async def test_the_stage_runs_between_the_work_before_and_the_work_behind(sim: SimDriver) -> None:
    log = Log()

    async def stage(x: int) -> int:
        log.add("stage start")
        await anyio.sleep(0.05)  # network I/O, say
        log.add("stage end")
        return x + 1

    async with acs.open_stream(driver=sim) as s:
        log.kernel(sim, s, "before", seconds=0.05)
        st = s.enqueue_host(stage, 41)
        log.kernel(sim, s, "behind")
        with anyio.fail_after(10):
            assert await st == 42
            await s.wait_complete()
        assert log.names == ["before", "stage start", "stage end", "behind"]
        assert log.at("stage start") >= log.at("before")
        assert log.at("behind") >= log.at("stage end")
        assert st.done()


async def test_the_stage_sees_what_the_stream_wrote_before_it(sim: SimDriver) -> None:
    """A GPU signal before the stage has landed when the coroutine starts, and the stream's
    signal behind it waits for the coroutine's return."""
    seen: list[int] = []
    async with acs.create_host_timeline(driver=sim) as t, acs.open_stream(driver=sim) as s:
        gate = hold(s)
        s.enqueue_signal(acs.Signal(t, 1))

        async def stage() -> None:
            seen.append(t.value)
            await anyio.sleep(0.05)
            seen.append(t.value)

        st = s.enqueue_host(stage)
        s.enqueue_signal(acs.Signal(t, 2))
        await anyio.sleep(0.05)
        assert seen == [] and not st.done()  # held: the work before it has not completed
        gate.set()
        with anyio.fail_after(10):
            await t.wait_value(2)
        assert seen == [1, 1]
        assert st.done()


async def test_a_stage_nobody_awaits_still_runs(sim: SimDriver) -> None:
    ran = anyio.Event()

    async def stage() -> None:
        ran.set()

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        s.enqueue_host(stage)  # nobody keeps it, nobody awaits it
        gc.collect()
        gate.set()
        with anyio.fail_after(10):
            await s.wait_complete()  # the stream waited for the stage
        assert ran.is_set()


async def test_many_stages_in_a_row_keep_the_streams_order(sim: SimDriver) -> None:
    log = Log()

    async def stage(i: int) -> int:
        log.add(f"stage {i}")
        if i % 3 == 0:
            await anyio.sleep(0.001)
        return i

    async with acs.open_stream(driver=sim) as s:
        stages = []
        for i in range(MAX_PENDING):
            log.kernel(sim, s, f"kernel {i}")
            stages.append(s.enqueue_host(stage, i))
        log.kernel(sim, s, "last")
        with anyio.fail_after(30):
            await s.wait_complete()
        assert all(st.done() for st in stages)
        assert [await st for st in stages] == list(range(MAX_PENDING))
    expected = [f"{k} {i}" for i in range(MAX_PENDING) for k in ("kernel", "stage")] + ["last"]
    assert log.names == expected


async def test_1000_stages(sim: SimDriver) -> None:
    async def stage(i: int) -> int:
        return i * i

    async with acs.open_stream(driver=sim) as s:
        with anyio.fail_after(60):
            window: deque[HostStage[int]] = deque()
            results = []
            for i in range(1000):
                if len(window) == MAX_PENDING:
                    results.append(await window.popleft())
                window.append(s.enqueue_host(stage, i))
            results += [await st for st in window]
            assert results == [i * i for i in range(1000)]
            await s.wait_complete()
        assert s._stages is not None and s._stages.pending == {}
    assert statistics().armed == 0


async def test_a_stream_takes_at_most_max_pending_stages(sim: SimDriver) -> None:
    """Past the bound ``enqueue_host`` raises ``anyio.WouldBlock`` and enqueues nothing: on a
    GPU a full queue of commands would block the loop that must run the stages."""
    ran: list[int] = []

    async def stage(i: int) -> int:
        ran.append(i)
        return i

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        stages = [s.enqueue_host(stage, i) for i in range(MAX_PENDING)]
        with pytest.raises(anyio.WouldBlock, match="await an earlier stage"):
            s.enqueue_host(stage, -1)
        assert s._stages is not None and s._stages.issued == MAX_PENDING
        gate.set()
        with anyio.fail_after(30):
            assert await stages[0] == 0
            more = s.enqueue_host(stage, MAX_PENDING)  # room again
            assert await more == MAX_PENDING
    assert ran == [*range(MAX_PENDING), MAX_PENDING]


async def test_a_wait_behind_a_stage_that_parks_first_does_not_hold_the_stage_up(
    sim: SimDriver, parked: None
) -> None:
    """A wait on the stream enqueued behind the stage, which parks before the stage's task has
    even run: its host function waits for work that waits for the stage, and the stage's turn
    must not queue behind it (nor join its chain without a host function of its own)."""
    ran = []

    async def stage() -> None:
        ran.append(1)

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        st = s.enqueue_host(stage)
        behind = s.record()
        current_notifier()._arm(behind._point)  # as a wait on it that parked at once
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            tg.start_soon(behind.wait)
            await anyio.wait_all_tasks_blocked()
            gate.set()
            with anyio.fail_after(10):
                await st
        assert ran == [1]
        behind.close()


async def test_a_stage_can_await_another_streams_work(sim: SimDriver) -> None:
    """``Stream.wait_complete`` is a coroutine function too: a stage made of it holds one
    stream until another's work has completed."""
    log = Log()
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        log.kernel(sim, b, "b's work", seconds=0.05)
        st = a.enqueue_host(b.wait_complete)
        log.kernel(sim, a, "a behind")
        with anyio.fail_after(10):
            await a.wait_complete()
        assert await st is None
        assert log.names == ["b's work", "a behind"]


async def test_keyword_arguments_through_partial(sim: SimDriver) -> None:
    async def stage(x: int, *, scale: int) -> int:
        return x * scale

    async with acs.open_stream(driver=sim) as s:
        with anyio.fail_after(10):
            assert await s.enqueue_host(functools.partial(stage, 3, scale=5)) == 15


# ---------------------------------------------------------------------- results and errors


async def test_await_returns_the_value_each_time_and_is_a_checkpoint(sim: SimDriver) -> None:
    async def stage() -> list[int]:
        return [1, 2]

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        assert not st.done()
        with anyio.fail_after(10):
            first = await st
        assert first == [1, 2] and await st is first
        with anyio.CancelScope() as scope:
            scope.cancel()
            await st  # done already, and still a checkpoint
        assert scope.cancelled_caught
        assert "done" in repr(st) and "stage (stage 1)" in repr(st)


async def test_an_exception_releases_the_stream_and_abandons_the_stages_behind(
    sim: SimDriver,
) -> None:
    log = Log()

    async def fails() -> None:
        log.add("fails")
        raise ValueError("the peer went away")

    async def stage(name: str) -> str:
        log.add(name)
        return name

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        bad = s.enqueue_host(fails)
        log.kernel(sim, s, "kernel behind")
        behind = [s.enqueue_host(stage, "behind 1"), s.enqueue_host(stage, "behind 2")]
        gate.set()
        with anyio.fail_after(10), pytest.raises(ValueError, match="the peer went away"):
            await bad
        later = s.enqueue_host(stage, "later")  # enqueued after the failure: runs
        with anyio.fail_after(10):
            for st in behind:
                with pytest.raises(acs.AbandonedError, match="did not run") as info:
                    await st
                assert isinstance(info.value.__cause__, ValueError)
                assert not isinstance(info.value, acs.StageCancelledError)
            assert await later == "later"
            await s.wait_complete()  # reports progress only: no error
        assert log.names == ["fails", "kernel behind", "later"]
        assert s._stages is not None and s._stages.failure is None  # nothing left to abandon


async def test_a_base_exception_stays_in_the_stage_and_the_loop_goes_on(
    sim: SimDriver,
) -> None:
    """On trio an exception out of a system task would end the run: the stage keeps
    everything, a BaseException included, for its ``await``."""

    class Stop(BaseException):
        pass

    async def stage() -> None:
        raise Stop

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        with anyio.fail_after(10):
            await s.wait_complete()
            await anyio.sleep(0.01)  # the loop goes on
        with pytest.raises(Stop):
            await st


async def test_a_failed_stage_that_nobody_awaits_is_logged(
    sim: SimDriver, caplog: pytest.LogCaptureFixture
) -> None:
    async def stage() -> None:
        raise KeyError("lost")

    async def quiet() -> None:
        raise acs.AbandonedError("reported elsewhere")

    async with acs.open_stream(driver=sim) as s:
        s.enqueue_host(stage)
        s.enqueue_host(quiet)
        with anyio.fail_after(10):
            await s.wait_complete()
        await anyio.lowlevel.checkpoint()
        with caplog.at_level(logging.ERROR, logger="aiocudasem"):
            gc.collect()
    records = [r for r in caplog.records if "nobody awaited it" in r.getMessage()]
    assert len(records) == 1
    assert "stage (stage 1)" in records[0].getMessage()
    assert records[0].exc_info is not None and records[0].exc_info[0] is KeyError


async def test_a_function_that_returns_no_coroutine_fails_at_its_stage(sim: SimDriver) -> None:
    async def real() -> int:
        return 1

    def fake() -> int:
        return 2

    fake._is_coroutine = True  # type: ignore[attr-defined]  # marked, yet no coroutine
    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(fake)  # type: ignore[arg-type]
        with anyio.fail_after(10), pytest.raises(TypeError, match="not a coroutine"):
            await st
        assert await s.enqueue_host(real) == 1


# ---------------------------------------------------------------------- cancellation


async def test_cancel_before_its_turn_keeps_its_place_and_never_runs(sim: SimDriver) -> None:
    log = Log()

    async def stage(name: str) -> None:
        log.add(name)

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        st = s.enqueue_host(stage, "cancelled")
        log.kernel(sim, s, "behind")
        after = s.enqueue_host(stage, "after")
        assert st.cancel() is True
        await anyio.sleep(0.05)
        assert not st.done() and log.names == []  # the work before it still runs
        gate.set()
        with anyio.fail_after(10):
            with pytest.raises(acs.StageCancelledError, match="before its coroutine ran"):
                await st
            with pytest.raises(acs.AbandonedError) as info:
                await after
            assert isinstance(info.value.__cause__, acs.StageCancelledError)
            await s.wait_complete()
        assert log.names == ["behind"]
        assert st.cancel() is False  # done


async def test_cancel_while_running_releases_the_stream(sim: SimDriver) -> None:
    log = Log()
    started = anyio.Event()

    async def stage() -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            log.add("left")

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        log.kernel(sim, s, "behind")
        with anyio.fail_after(10):
            await started.wait()
            assert "running" in repr(st)
            assert st.cancel() is True
            with pytest.raises(acs.StageCancelledError, match="while its coroutine ran") as info:
                await st
            assert isinstance(info.value, acs.AbandonedError)
            await s.wait_complete()
        assert log.names == ["left", "behind"]


async def test_cancel_from_another_thread(sim: SimDriver) -> None:
    started = anyio.Event()

    async def stage() -> None:
        started.set()
        await anyio.sleep_forever()

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        with anyio.fail_after(10):
            await started.wait()
            assert await anyio.to_thread.run_sync(st.cancel) is True
            with pytest.raises(acs.StageCancelledError):
                await st


async def test_cancelling_the_await_leaves_the_stage_running(sim: SimDriver) -> None:
    release = anyio.Event()

    async def stage() -> str:
        await release.wait()
        return "done"

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        with anyio.move_on_after(0.05) as scope:
            await st
        assert scope.cancelled_caught and not st.done()
        release.set()
        with anyio.fail_after(10):
            assert await st == "done"


async def test_a_stage_that_swallows_its_cancellation_returns_its_value(sim: SimDriver) -> None:
    started = anyio.Event()

    async def stage() -> str:
        started.set()
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.05)
        return "finished anyway"

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        with anyio.fail_after(10):
            await started.wait()
            st.cancel()
            assert await st == "finished anyway"


# ---------------------------------------------------------------------- closing


async def test_aclose_waits_for_a_pending_stage(sim: SimDriver) -> None:
    log = Log()

    async def stage() -> str:
        await anyio.sleep(0.05)
        log.add("stage")
        return "sent"

    s = acs.open_stream(driver=sim)
    gate = hold(s)
    st = s.enqueue_host(stage)
    gate.set()
    with anyio.fail_after(10):
        await s.aclose()
    assert log.names == ["stage"] and s.closed
    assert await st == "sent"


async def test_close_cancels_pending_stages_and_never_hangs(sim: SimDriver) -> None:
    started = anyio.Event()
    before = registered(sim)

    async def stuck() -> None:
        started.set()
        await anyio.sleep_forever()

    async def never() -> None:
        raise AssertionError("ran after its stream was closed")

    s = acs.open_stream(driver=sim)
    running = s.enqueue_host(stuck)
    pending = s.enqueue_host(never)
    assert registered(sim) == before + 1  # the stages' timeline
    with anyio.fail_after(10):
        await started.wait()
        s.close()
        for st in (running, pending):
            with pytest.raises(acs.StageCancelledError, match="stream was closed"):
                await st
    assert until(lambda: registered(sim) == before)  # the timeline went with the stream


async def test_leaving_async_with_by_an_exception_cancels_the_stage(sim: SimDriver) -> None:
    gate: threading.Event | None = None

    async def stage() -> None:
        raise AssertionError("the stream was closed before its turn")

    with pytest.raises(RuntimeError, match="body failed"):
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            st = s.enqueue_host(stage)
            raise RuntimeError("body failed")
    assert gate is not None
    with anyio.fail_after(10), pytest.raises(acs.StageCancelledError):
        await st
    gate.set()


async def test_a_cancelled_aclose_cancels_the_stage(sim: SimDriver) -> None:
    async def stage() -> None:
        await anyio.sleep_forever()

    s = acs.open_stream(driver=sim)
    st = s.enqueue_host(stage)
    with anyio.move_on_after(0.1) as scope:
        await s.aclose()
    assert scope.cancelled_caught and s.closed
    with anyio.fail_after(10), pytest.raises(acs.StageCancelledError):
        await st


async def test_a_slow_aclose_names_the_stage(
    sim: SimDriver, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiocudasem import _log

    monkeypatch.setattr(_log, "CLOSE_WARNING_S", 0.05)
    release = anyio.Event()

    async def slow_upload() -> None:
        await release.wait()

    s = acs.open_stream(driver=sim)
    st = s.enqueue_host(slow_upload)
    with caplog.at_level(logging.WARNING, logger="aiocudasem"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.aclose)
            await anyio.sleep(0.2)
            release.set()
    assert s.closed and st.done()
    [record] = [r for r in caplog.records if "goes on waiting" in r.getMessage()]
    assert "slow_upload (stage 1)" in record.getMessage()
    assert "cancel() it" in record.getMessage()


async def test_detach_releases_the_stages(sim: SimDriver) -> None:
    async def stage() -> None:
        await anyio.sleep_forever()

    s = acs.open_stream(driver=sim)
    st = s.enqueue_host(stage)
    handle = s.detach()
    with anyio.fail_after(10), pytest.raises(acs.StageCancelledError, match="stream was closed"):
        await st
    async with acs.Stream.adopt(handle, driver=sim) as again:
        with anyio.fail_after(10):
            await again.wait_complete()  # not left blocked
    sim.stream_destroy(handle)


async def test_a_stage_may_enqueue_a_stage_behind_itself(sim: SimDriver) -> None:
    log = Log()

    async with acs.open_stream(driver=sim) as s:

        async def second() -> str:
            log.add("second")
            return "second"

        async def first() -> acs.HostStage[str]:
            log.add("first")
            return s.enqueue_host(second)  # behind this stage: runs once this one returns

        log.kernel(sim, s, "kernel")
        with anyio.fail_after(10):
            inner = await s.enqueue_host(first)
            assert await inner == "second"
        assert log.names == ["kernel", "first", "second"]


async def test_a_borrowed_stream_s_aclose_waits_for_its_stages(sim: SimDriver) -> None:
    ran = []

    async def stage() -> None:
        await anyio.sleep(0.02)
        ran.append(1)

    async with acs.open_stream(driver=sim) as owner:
        borrowed = acs.Stream.adopt(owner.handle, driver=sim)
        st = borrowed.enqueue_host(stage)
        with anyio.fail_after(10):
            await borrowed.aclose()
        assert ran == [1] and st.done()
        assert not owner.closed


# ---------------------------------------------------------------------- the loop's end


def _run_inner(anyio_backend: Any, main: Any) -> None:
    name, options = anyio_backend
    anyio.run(main, backend=name, backend_options=options)


async def test_the_loop_ending_releases_a_stage_that_never_ran(
    sim: SimDriver, anyio_backend: Any
) -> None:
    """The loop ends right after enqueueing: asyncio cancels a task before its first step
    without running it, so the notifier's end releases the stage."""
    stages: list[acs.HostStage[None]] = []

    async def stage() -> None:
        raise AssertionError("ran after its loop ended")

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)

        async def main() -> None:
            stages.append(s.enqueue_host(stage))

        await anyio.to_thread.run_sync(_run_inner, anyio_backend, main)
        [st] = stages
        assert st.done()
        gate.set()
        with anyio.fail_after(10):
            await s.wait_complete()  # the stream is not left blocked
            with pytest.raises(acs.StageCancelledError, match="event loop"):
                await st


async def test_the_loop_ending_releases_a_running_stage(sim: SimDriver, anyio_backend: Any) -> None:
    stages: list[acs.HostStage[None]] = []
    left = threading.Event()

    async def stage() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            left.set()

    async with acs.open_stream(driver=sim) as s:

        async def main() -> None:
            stages.append(s.enqueue_host(stage))
            with anyio.fail_after(10):
                while not stages[0]._running:
                    await anyio.sleep(0.001)

        await anyio.to_thread.run_sync(_run_inner, anyio_backend, main)
        [st] = stages
        assert st.done() and left.is_set()
        with anyio.fail_after(10):
            await s.wait_complete()
            with pytest.raises(acs.StageCancelledError, match="while its coroutine ran"):
                await st


async def test_stages_pending_on_another_running_loop_are_busy(
    sim: SimDriver, anyio_backend: Any
) -> None:
    enqueued = threading.Event()
    finish = threading.Event()

    async def stage() -> None:
        pass

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)

        async def main() -> None:
            s.enqueue_host(stage)
            enqueued.set()
            await anyio.to_thread.run_sync(finish.wait)
            await s.wait_complete()

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, _run_inner, anyio_backend, main)
            await anyio.to_thread.run_sync(enqueued.wait)
            with pytest.raises(anyio.BusyResourceError, match="another event loop"):
                s.enqueue_host(stage)
            gate.set()
            finish.set()
        with anyio.fail_after(10):
            assert await s.enqueue_host(stage) is None  # that loop's stages are done


# ---------------------------------------------------------------------- what is left


async def test_nothing_is_left_behind(sim: SimDriver) -> None:
    async def stage(i: int) -> int:
        await anyio.lowlevel.checkpoint()
        return i

    async with acs.open_stream(driver=sim) as warm:
        await warm.wait_complete()
    base = statistics()
    pages = registered(sim)
    for _ in range(3):
        async with acs.open_stream(driver=sim) as s:
            with anyio.fail_after(30):
                assert [await s.enqueue_host(stage, i) for i in range(20)] == list(range(20))
                failed = s.enqueue_host(functools.partial(stage, "x"))  # returns "x"
                assert await failed == "x"
    after = statistics()
    assert after.side_streams == base.side_streams  # none made for the stages
    assert after.pending == after.armed == after.chained == after.parked == 0
    assert after.pooled_events <= base.pooled_events + 2
    assert after.leaked == base.leaked
    assert until(lambda: registered(sim) == pages)  # each stream's timeline went with it


# ---------------------------------------------------------------------- bad input


async def test_bad_input(sim: SimDriver) -> None:
    async def stage() -> None:
        pass

    def sync() -> None:
        pass

    async with acs.open_stream(driver=sim) as s:
        for bad in (sync, 42, None, print, lambda: None):
            with pytest.raises(TypeError, match="coroutine function"):
                s.enqueue_host(bad)  # type: ignore[arg-type]
        coro = stage()
        with pytest.raises(TypeError, match=r"not enqueue_host\(fetch\(url\)\)"):
            s.enqueue_host(coro)  # type: ignore[arg-type]
        assert coro.cr_frame is None  # closed: no "never awaited" warning
        with pytest.raises(TypeError, match="enqueue_host"):
            acs.HostStage()
        assert s._stages is None  # nothing was made for refused calls
    with pytest.raises(anyio.ClosedResourceError):
        s.enqueue_host(stage)


def test_outside_an_event_loop(sim: SimDriver) -> None:
    async def stage() -> None:
        pass

    s = acs.open_stream(driver=sim)
    try:
        with pytest.raises(RuntimeError, match="running asyncio, uvloop or trio"):
            s.enqueue_host(stage)
        assert s._stages is None
    finally:
        s.close()


async def test_a_device_without_host_timelines(anyio_backend: Any) -> None:
    async def stage() -> None:
        pass

    sim = SimDriver(stream_mem_ops=False)
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(acs.UnsupportedFeatureError):
            s.enqueue_host(stage)
        with anyio.fail_after(10):
            await s.wait_complete()


async def test_a_capturing_stream(sim: SimDriver) -> None:
    async def stage() -> None:
        pass

    async with acs.open_stream(driver=sim) as s:
        sim.begin_capture(s.handle)
        with pytest.raises(acs.UnsupportedFeatureError, match="captured"):
            s.enqueue_host(stage)
        sim.graph_destroy(sim.end_capture(s.handle))
        with anyio.fail_after(10):
            assert await s.enqueue_host(stage) is None


async def test_a_loop_that_offers_no_task_of_the_librarys(
    sim: SimDriver, anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generic adapter (a loop that neither asyncio's nor trio's claims) cannot start a
    task: the stage is refused, and the stream is not left blocked."""
    monkeypatch.setattr(_loops, "current_library", lambda: None)

    async def stage() -> None:
        raise AssertionError("never runs")

    async with acs.open_stream(driver=sim) as s:

        async def main() -> None:
            with pytest.raises(acs.UnsupportedFeatureError, match="asyncio"):
                s.enqueue_host(stage)
            with anyio.fail_after(10):
                await s.wait_complete()

        await anyio.to_thread.run_sync(_run_inner, anyio_backend, main)


async def test_a_device_fault_before_its_turn(fault_watchdog: float) -> None:
    sim = SimDriver()

    async def stage() -> None:
        raise AssertionError("ran on a faulted device")

    s = acs.open_stream(driver=sim)
    hold(s)
    st = s.enqueue_host(stage)
    await anyio.sleep(0.02)
    sim.inject_fault(0)
    with anyio.fail_after(10), pytest.raises(acs.DeviceFaultError):
        await st
    s.close()


async def test_awaiting_a_stage_from_another_event_loop_is_refused(sim: SimDriver) -> None:
    """The stage's end is announced on its own loop only: another loop's await raises at once
    (on trio, waking a task of another run from the stage's task would end the run)."""

    async def stage() -> str:
        return "done"

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        st = s.enqueue_host(stage)
        seen: list[BaseException] = []

        async def elsewhere() -> None:
            try:
                await st
            except RuntimeError as exc:
                seen.append(exc)

        await anyio.to_thread.run_sync(lambda: anyio.run(elsewhere))
        assert len(seen) == 1 and "event loop that enqueued it" in str(seen[0])
        gate.set()
        with anyio.fail_after(10):
            assert await st == "done"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio.Cancelled cannot be made
async def test_a_loop_cancellation_let_out_by_the_coroutine_is_chained(sim: SimDriver) -> None:
    """A cancellation that is not the stage's own (here one that the coroutine lets out: it
    awaits a future that someone else cancelled) ends it with StageCancelledError, the
    original as its cause."""
    cancelled = anyio.get_cancelled_exc_class()

    async def stage() -> None:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    async with acs.open_stream(driver=sim) as s:
        st = s.enqueue_host(stage)
        with anyio.fail_after(10), pytest.raises(acs.StageCancelledError) as info:
            await st
        assert isinstance(info.value.__cause__, cancelled)


async def test_max_pending_stages_with_a_kernel_each_fit_the_queue_of_commands(
    sim: SimDriver,
) -> None:
    """The bound on pending stages keeps a stream's queue of commands (which the simulated
    device models, 4,096 deep by default) from filling behind a stage: a full queue would block
    the loop that must run the stage, on a GPU as here."""

    async def stage(i: int) -> int:
        return i

    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        stages = []
        for i in range(MAX_PENDING):
            stages.append(s.enqueue_host(stage, i))
            workloads(sim).launch_spin(s, 1000)
        held = len(sim._streams[s.handle].ops)
        assert held <= sim.queue_depth // 4, held  # room to spare for the work between them
        gate.set()
        with anyio.fail_after(30):
            assert [await st for st in stages] == list(range(MAX_PENDING))
