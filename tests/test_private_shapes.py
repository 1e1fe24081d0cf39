"""The private state of other libraries that aiocudasem reads, each in the adapter of its loop
(aiocudasem/_notifier/_loops/): each test fails, naming the attribute, when a new Python, trio
or anyio changes its shape, and the library is run on each fallback."""

from __future__ import annotations

import asyncio
import collections
import sys
import threading

import anyio
import pytest

import aiocudasem as acs
from aiocudasem._notifier._loops import _asyncio
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, import_sim_semaphore, workloads

pytestmark = pytest.mark.anyio


def test_asyncio_get_running_loop_shape() -> None:
    get = getattr(asyncio.events, "_get_running_loop", None)
    assert callable(get), (
        f"asyncio.events._get_running_loop is gone on Python {sys.version.split()[0]}: "
        "the loop check falls back to asyncio.get_running_loop()"
    )
    assert get() is None, "asyncio.events._get_running_loop() outside a loop is not None"

    async def inside() -> None:
        assert get() is asyncio.get_running_loop(), (
            "asyncio.events._get_running_loop() does not return the running loop"
        )

    asyncio.run(inside())
    assert _asyncio.running_loop_getter() is get


def test_asyncio_ready_queue_shape() -> None:
    async def inside() -> None:
        loop = asyncio.get_running_loop()
        assert type(getattr(loop, "_ready", None)) is collections.deque, (
            f"asyncio's BaseEventLoop._ready is no longer a deque on Python "
            f"{sys.version.split()[0]}: the spin falls back to yielding every time"
        )
        assert _asyncio.ready_queue_of(loop) is loop._ready  # type: ignore[attr-defined]

    asyncio.run(inside())
    assert _asyncio.ready_queue_of(object()) is None


def test_asyncio_task_fut_waiter_shape() -> None:
    """testing.wait_all_tasks_blocked() reads a task's ``_fut_waiter``, as anyio does."""

    async def inside() -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        task = loop.create_task(asyncio.wait_for(future, None))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert _asyncio.has_fut_waiter(task), (
            f"asyncio's Task._fut_waiter is gone on Python {sys.version.split()[0]}: "
            "testing.wait_all_tasks_blocked() falls back to anyio's, 0.1 s per look"
        )
        assert task._fut_waiter is not None  # type: ignore[attr-defined]
        future.set_result(None)
        await task
        assert task._fut_waiter is None  # type: ignore[attr-defined]

    asyncio.run(inside())


def test_asyncio_future_callbacks_shape() -> None:
    """_hotpath's crowd wake reads a future's ``_callbacks``: (callback, context) pairs."""

    async def inside() -> None:
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: None)
        cbs = getattr(fut, "_callbacks", None)
        assert isinstance(cbs, list) and len(cbs) == 1, (
            f"asyncio.Future._callbacks is {cbs!r} on Python {sys.version.split()[0]}: the "
            "crowd wake falls back to set_result()"
        )
        assert isinstance(cbs[0], tuple) and len(cbs[0]) == 2, (
            "asyncio.Future._callbacks no longer holds (callback, context) pairs"
        )
        fut.cancel()

    asyncio.run(inside())


def test_trio_run_context_shape() -> None:
    trio = pytest.importorskip("trio")
    from aiocudasem._notifier._loops import _trio

    async def inside() -> None:
        token = trio.lowlevel.current_trio_token()
        known = _trio.trio_run_context(token)
        assert known is not None, (
            f"trio._core._run.GLOBAL_RUN_CONTEXT has another shape in trio {trio.__version__}: "
            "the loop check falls back to trio.lowlevel.current_trio_token()"
        )
        context, runner = known
        assert isinstance(context, threading.local)
        assert runner.current_trio_token() is token  # type: ignore[attr-defined]
        assert _trio.trio_run_context(object()) is None

    trio.run(inside)


def test_coroutine_function_marker() -> None:
    import inspect

    assert inspect.iscoroutinefunction(acs.Stream.wait_complete) or sys.version_info < (3, 12)
    assert asyncio.iscoroutinefunction(acs.Stream.wait_complete), (
        "Stream.wait_complete is not marked as a coroutine function "
        "(inspect.markcoroutinefunction, or asyncio.coroutines._is_coroutine on 3.11)"
    )


async def _exercise(sim: SimDriver, fallbacks: bool = False) -> None:
    """Short and parked waits of every path, and a crowd, on the running loop."""
    if fallbacks:
        from aiocudasem._notifier import current_notifier

        assert current_notifier().ready_queue is None  # the fallback's: none read
    work = workloads(sim)
    sem, producer = import_sim_semaphore(sim)
    async with sem, acs.open_stream(driver=sim) as stream:
        with anyio.fail_after(10):
            for _ in range(20):
                await stream.wait_complete()  # finished work
            work.launch_spin(stream.handle, 2_000_000)
            await stream.wait_complete()  # parked
            async with anyio.create_task_group() as tg:
                for _ in range(50):
                    tg.start_soon(stream.wait_complete)
                stream.enqueue_wait(acs.Wait(sem, 1))
                await anyio.wait_all_tasks_blocked()
                producer.signal(1)
            await sem.wait_value(1)
    assert statistics().parked == 0


async def test_the_library_runs_on_every_fallback(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every private read replaced by its fallback, a fresh event loop (so a fresh
    notifier, which reads them once) runs short, parked and crowd waits."""
    from aiocudasem._notifier._loops import _trio

    monkeypatch.setattr(_asyncio, "running_loop_getter", lambda: _asyncio._running_loop_or_none)
    monkeypatch.setattr(_asyncio, "ready_queue_of", lambda loop: None)
    monkeypatch.setattr(_trio, "trio_run_context", lambda token: None)
    # The notifier that this test's loop found first was made with the real reads: run the
    # waits in a loop of their own, in a thread, so that its notifier reads the fallbacks.
    backend = anyio.lowlevel.current_token().backend_class.__module__.rsplit("_", 1)[-1]
    await anyio.to_thread.run_sync(lambda: anyio.run(_exercise, sim, True, backend=backend))


def test_mark_coroutine_function_without_a_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio.coroutines
    import inspect

    monkeypatch.delattr(inspect, "markcoroutinefunction", raising=False)
    monkeypatch.delattr(asyncio.coroutines, "_is_coroutine", raising=False)

    def fn() -> None:
        pass

    assert _asyncio.mark_coroutine_function(fn) is False
