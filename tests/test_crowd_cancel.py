"""Cancelling a crowd of parked waiters costs what the loop itself needs to cancel as many
tasks, not the square of their number: a coroutine that leaves the park while nobody drains
looks for an heir among the others in O(1) amortized, and the hand-off guarantee holds."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier import current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold

pytestmark = pytest.mark.anyio


async def _cancel_crowd(n: int, wait: Callable[[], Awaitable[Any]]) -> float:
    """Start ``n`` tasks that ``await wait()``, let them all block, and return how long
    cancelling them took, until the last one has left."""
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            t0 = time.perf_counter()
            tg.cancel_scope.cancel()
        return time.perf_counter() - t0


@pytest.mark.parametrize("n", [10_000])
async def test_cancelling_a_parked_crowd_costs_what_the_loop_needs(
    sim: SimDriver, parked: None, n: int
) -> None:
    """Compared with the same crowd parked in ``anyio.sleep_forever()``, measured in the same
    run. The target is 1.5x; the bound asserted leaves a loaded host room and still fails a
    quadratic cost (several times the baseline at 10,000)."""
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        baseline = await _cancel_crowd(n, anyio.sleep_forever)
        assert statistics().parked == 0
        crowd = await _cancel_crowd(n, s.wait_complete)
        assert statistics().parked == 0
        gate.set()
        with anyio.fail_after(5):
            await s.wait_complete()  # the stream and the notifier are still usable
    ratio = crowd / baseline
    print(f"cancelling {n} parked: {crowd * 1e3:.0f} ms, {ratio:.2f}x sleep_forever()'s")
    assert crowd <= 3 * baseline + 0.05, (crowd, baseline, ratio)


class _CountingSleeper:
    """A sleeper of the loop that counts how often anyone asks whether it is done: a scan."""

    __slots__ = ("_inner",)
    scans = 0

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def done(self) -> bool:
        _CountingSleeper.scans += 1
        return bool(self._inner.done())

    def set_result(self, result: None, /) -> None:
        self._inner.set_result(result)

    def cancel(self) -> bool:
        return bool(self._inner.cancel())

    def __await__(self) -> Generator[Any, Any, Any]:
        return self._inner.__await__()  # type: ignore[no-any-return]


@pytest.mark.parametrize("streams", [1, 7])
async def test_a_crowd_leaving_at_once_scans_each_sleeper_a_bounded_number_of_times(
    sim: SimDriver, parked: None, streams: int
) -> None:
    """Deterministic: the sleepers asked whether they are done, in all, while a crowd of
    2,000 parked waiters is cancelled, grow linearly with the crowd (they grew with its
    square: every leaver scanned all the sleepers left)."""
    notifier = current_notifier()
    real = notifier._new_sleeper
    notifier._new_sleeper = lambda: _CountingSleeper(real())  # type: ignore[assignment]
    n = 2000
    opened = [acs.open_stream(driver=sim) for _ in range(streams)]
    gates = [hold(s) for s in opened]
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(n):
                    tg.start_soon(opened[i % streams].wait_complete)
                await anyio.wait_all_tasks_blocked()
                assert statistics().parked == n
                _CountingSleeper.scans = 0
                tg.cancel_scope.cancel()
        scans = _CountingSleeper.scans
        print(f"{n} leavers asked {scans} sleepers")
        assert statistics().parked == 0
        assert scans <= 4 * n, scans
    finally:
        notifier._new_sleeper = real
        for g in gates:
            g.set()
        with anyio.fail_after(5):
            for s in opened:
                await s.aclose()


async def test_cancelling_most_of_a_crowd_in_turn_loses_no_wake_up(
    sim: SimDriver, parked: None
) -> None:
    """Waiters cancelled one at a time, the drainer first, while others stay parked: each
    leaver hands the drainer role on, and the survivors all wake when their work completes."""
    n = 300
    async with acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        gate_a, gate_b = hold(a), hold(b)
        scopes = [anyio.CancelScope() for _ in range(n)]
        woke = 0

        async def wait(stream: acs.Stream, scope: anyio.CancelScope) -> None:
            nonlocal woke
            with scope:
                await stream.wait_complete()
                woke += 1

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i, scope in enumerate(scopes):
                    tg.start_soon(wait, a if i % 2 else b, scope)
                await anyio.wait_all_tasks_blocked()
                for scope in scopes[: n - 10]:  # the drainer parked first: it goes first
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()
                await anyio.wait_all_tasks_blocked()
                assert statistics().parked == 10
                gate_b.set()
                gate_a.set()
        assert woke == 10
        assert statistics().parked == 0
