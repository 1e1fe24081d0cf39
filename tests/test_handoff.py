from __future__ import annotations

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore

pytestmark = pytest.mark.anyio


async def test_handoff_orders_wait_body_signal(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    seen: list[int] = []
    async with acs.open_stream(driver=sim) as s:
        async with anyio.create_task_group() as tg:

            async def consumer() -> None:
                async with s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)) as stream:
                    assert stream is s
                    sim.launch(s.handle, lambda: seen.append(producer.value))
                seen.append(-1)  # the coroutine resumes only after the signal fired

            tg.start_soon(consumer)
            await anyio.wait_all_tasks_blocked()
            assert observer.value == 0
            producer.signal(1)
        assert seen == [1, -1]
        assert observer.value == 1
    await ready.aclose()
    await done.aclose()


async def test_handoff_error_in_body_still_signals(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    producer.signal(1)
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(ZeroDivisionError):
            async with s.handoff([acs.Wait(ready, 1)], [acs.Signal(done, 1)]):
                1 / 0  # noqa: B018
        with anyio.fail_after(5):
            await s.wait_complete()
        assert observer.value == 1  # the peer is not left waiting
    await ready.aclose()
    await done.aclose()


async def test_handoff_cancelled_at_exit_keeps_stream_usable(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    async with acs.open_stream(driver=sim) as s:
        with anyio.move_on_after(0.02) as scope:
            async with s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                pass
        assert scope.cancelled_caught  # the exit's await was abandoned
        assert observer.value == 0
        producer.signal(1)  # the enqueued signal still fires
        with anyio.fail_after(5):
            await s.wait_complete()
        assert observer.value == 1
    await ready.aclose()
    await done.aclose()


async def test_handoff_bad_input(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(TypeError):
            s.handoff(acs.Signal(sem, 1), acs.Signal(sem, 1))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            s.handoff(acs.Wait(sem, 1), 3)  # type: ignore[arg-type]
        # No waits is a signal-only section (tests/test_handoff_entries.py), not an error.
        assert isinstance(s.handoff([], acs.Signal(sem, 1)), acs.HandOff)
        gate = hold(s)
        gate.set()
    await sem.aclose()


async def test_a_handoff_is_entered_once(sim: SimDriver) -> None:
    ready, producer = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    calls: list[str] = []
    waits, signals = sim.enqueue_semaphore_waits, sim.enqueue_semaphore_signals
    sim.enqueue_semaphore_waits = lambda ops, h: (calls.append("wait"), waits(ops, h))[1]  # type: ignore[method-assign]
    sim.enqueue_semaphore_signals = lambda ops, h: (calls.append("signal"), signals(ops, h))[1]  # type: ignore[method-assign]
    try:
        async with acs.open_stream(driver=sim) as s:
            section = s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1))
            producer.signal(1)
            with anyio.fail_after(5):
                async with section:
                    pass
            assert calls == ["wait", "signal"]
            # Entering it again re-enqueued every wait and signal.
            with pytest.raises(anyio.ClosedResourceError, match="entered once"):
                async with section:
                    pytest.fail("entered a spent hand-off section")  # pragma: no cover
            assert calls == ["wait", "signal"]
            with anyio.fail_after(5):
                async with s.handoff(acs.Wait(ready, 1), acs.Signal(done, 2)):
                    pass
            assert observer.value == 2
    finally:
        del sim.enqueue_semaphore_waits, sim.enqueue_semaphore_signals
    await ready.aclose()
    await done.aclose()


async def test_a_handoff_refuses_closed_objects(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    done, _ = import_sim_semaphore(sim)
    s = acs.open_stream(driver=sim)
    section = s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1))
    await s.aclose()
    with pytest.raises(anyio.ClosedResourceError, match="stream is closed"):
        async with section:
            pytest.fail("entered a section of a closed stream")  # pragma: no cover
    with pytest.raises(anyio.ClosedResourceError, match="stream is closed"):
        s.handoff(acs.Wait(ready, 1), acs.Signal(done, 1))
    await ready.aclose()
    async with acs.open_stream(driver=sim) as s2:
        with pytest.raises(anyio.ClosedResourceError, match="closed external semaphore"):
            s2.handoff(acs.Wait(ready, 1), acs.Signal(done, 1))
    await done.aclose()


async def test_a_handoff_used_with_sync_with_or_await_says_how_to_use_it(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    async with sem, acs.open_stream(driver=sim) as stream:
        section = stream.handoff(acs.Wait(sem, 1), [])
        with pytest.raises(TypeError, match=r"async with stream\.handoff"), section:
            pass
        with pytest.raises(TypeError, match=r"async with stream\.handoff"):
            await section  # type: ignore[misc]
