"""The event-loop seam (aiocudasem/_notifier/_loops/): one adapter per kind of loop, picked in
one place, and the generic one serving a loop that no other adapter knows."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiocudasem as acs
from aiocudasem._notifier import LoopAdapter, _loops, current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore, workloads

pytestmark = pytest.mark.anyio


async def test_each_loop_gets_its_adapter(anyio_backend: Any) -> None:
    name, options = anyio_backend
    adapter = current_notifier().loop
    assert isinstance(adapter, LoopAdapter)
    if name == "trio":
        import trio

        assert adapter.name == "trio"
        assert adapter.checkpoint is trio.lowlevel.checkpoint
        assert adapter.bare_yield is False and adapter.ready_queue is None
    else:
        loop = asyncio.get_running_loop()
        assert adapter.name == "asyncio"
        assert adapter.bare_yield is True
        if options.get("use_uvloop"):
            assert type(loop).__module__.startswith("uvloop")
            assert adapter.ready_queue is None  # uvloop's queue is C: none read
        else:
            assert adapter.ready_queue is loop._ready  # type: ignore[attr-defined]
    assert adapter.serves_running_loop() is True
    assert current_notifier().serves_running_loop is adapter.serves_running_loop


def test_a_finished_loop_is_not_recognised_any_more() -> None:
    seen: list[Any] = []

    async def main() -> None:
        seen.append(current_notifier())

    anyio.run(main)
    n = seen[0]
    assert n.closed
    assert n.serves_running_loop() is False
    assert n.loop.serves_running_loop() is False


async def _exercise(sim: SimDriver) -> list[str]:
    """Short, parked and crowd waits, a cancelled parked wait and a host-side wait, on the
    running loop; returns the kinds of sleepers its notifier made."""
    notifier = current_notifier()
    kinds: list[str] = []
    real = notifier._new_sleeper

    def recording() -> Any:
        s = real()
        kinds.append(type(s).__name__)
        return s

    notifier._new_sleeper = recording
    work = workloads(sim)
    sem, producer = import_sim_semaphore(sim)
    async with sem, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(10):
            for _ in range(20):
                await stream.wait_complete()  # finished work
            work.launch_spin(stream.handle, 2_000_000)
            await stream.wait_complete()  # parked
            gate = hold(stream)
            with anyio.move_on_after(0.05):
                await stream.wait_complete()  # parked, then cancelled
            gate.set()
            await stream.wait_complete()
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(stream.wait_complete)
                stream.enqueue_wait(acs.Wait(sem, 1))
                await anyio.sleep(0.05)
                producer.signal(1)
            await sem.wait_value(1)
    assert statistics().parked == 0
    return kinds


async def test_an_unknown_loop_gets_the_generic_adapter(
    sim: SimDriver, anyio_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that neither asyncio's nor trio's adapter claims is served through anyio's
    public backend interface: its waits, parked ones and crowds included, work all the same,
    and current_notifier() finds its notifier through anyio each time."""
    monkeypatch.setattr(_loops, "current_library", lambda: None)
    name, options = anyio_backend

    def run() -> list[str]:
        async def main() -> list[str]:
            assert type(current_notifier().loop) is LoopAdapter
            assert current_notifier().serves_running_loop() is False
            first = current_notifier()
            assert current_notifier() is first  # found again, the long way
            return await _exercise(sim)

        return anyio.run(main, backend=name, backend_options=options)

    kinds = await anyio.to_thread.run_sync(run)
    assert kinds and set(kinds) == {"_EventSleeper"}
