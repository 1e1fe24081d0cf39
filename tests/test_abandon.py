"""A producer that dies or is given up on: ``abandon()``, closing under parked waiters, and
the warning of a close that waits for ever."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _log
from aiocudasem.testing import SimDriver, import_sim_semaphore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


async def test_giving_up_on_a_handoff_lets_the_stream_close(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    done, observer = import_sim_semaphore(sim)
    started = time.monotonic()
    with anyio.fail_after(5):
        async with ready, done, acs.open_stream(driver=sim) as stream:
            with anyio.move_on_after(0.1) as scope:
                async with stream.handoff(acs.Wait(ready, 3), acs.Signal(done, 3)):
                    pass
            assert scope.cancelled_caught  # the producer never came
            ready.abandon()
            assert ready.abandoned
    assert time.monotonic() - started < 1.5
    assert observer.value == 3  # the section's signal went out once its wait was released


async def test_handoff_exit_after_abandon_raises(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    done, _ = import_sim_semaphore(sim)
    async with ready, done, acs.open_stream(driver=sim) as stream:
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def section() -> None:
                try:
                    async with stream.handoff(acs.Wait(ready, 1), acs.Signal(done, 1)):
                        pass
                except acs.AbandonedError as exc:
                    errors.append(exc)

            tg.start_soon(section)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            ready.abandon()
        assert len(errors) == 1
        assert isinstance(errors[0], anyio.BrokenResourceError)
        # New entries, and new host waits, of an abandoned semaphore are refused.
        with pytest.raises(acs.AbandonedError):
            acs.Wait(ready, 2)
        with pytest.raises(acs.AbandonedError):
            acs.Signal(ready, 2)
        with pytest.raises(acs.AbandonedError):
            await ready.wait_value(1)


async def test_abandon_wakes_parked_host_waits(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim)
    timeline = acs.create_host_timeline(driver=sim)
    outcomes: list[str] = []

    async def wait(fn: object) -> None:
        try:
            await fn()  # type: ignore[operator]
        except acs.AbandonedError:
            outcomes.append("abandoned")
        else:
            outcomes.append("returned")

    with anyio.fail_after(5):
        async with sem, timeline, anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(wait, lambda: sem.wait_value(7))
                tg.start_soon(wait, lambda: timeline.wait_value(7))
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            sem.abandon()
            timeline.abandon()
            assert timeline.value == acs.HostTimeline.MAX
    assert outcomes == ["abandoned"] * 6


async def test_abandon_of_a_binary_semaphore_releases_each_wait(sim: SimDriver) -> None:
    sem, _ = import_sim_semaphore(sim, timeline=False)
    with anyio.fail_after(5):
        async with sem, acs.open_stream(driver=sim) as stream:
            stream.enqueue_wait(acs.Wait(sem))
            stream.enqueue_wait(acs.Wait(sem))
            assert not stream.query()
            sem.abandon()
            await stream.wait_complete()


async def test_abandon_signals_the_highest_value_waited_for(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    async with sem, acs.open_stream(driver=sim) as a, acs.open_stream(driver=sim) as b:
        a.enqueue_wait(acs.Wait(sem, 4))
        b.enqueue_wait(acs.Wait(sem, 9))
        sem.abandon()
        with anyio.fail_after(5):
            await a.wait_complete()
            await b.wait_complete()
        assert producer.value == 9
        sem.abandon()  # idempotent
        assert producer.value == 9


async def test_abandon_arguments(sim: SimDriver) -> None:
    timeline_sem, producer = import_sim_semaphore(sim)
    binary, _ = import_sim_semaphore(sim, timeline=False)
    host = acs.create_host_timeline(driver=sim)
    with pytest.raises(TypeError):
        timeline_sem.abandon("5")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        timeline_sem.abandon(1 << 64)
    with pytest.raises(ValueError, match="binary"):
        binary.abandon(1)
    with pytest.raises(ValueError):
        host.abandon(1 << 63)
    timeline_sem.abandon(12)
    assert producer.value == 12
    host.abandon(5)
    assert host.value == 5
    for obj in (timeline_sem, binary, host):
        await obj.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            obj.abandon()


@pytest.mark.parametrize("how", ["close", "aclose", "detach"])
async def test_closing_a_semaphore_wakes_its_parked_waiters(sim: SimDriver, how: str) -> None:
    sem, producer = import_sim_semaphore(sim)
    errors: list[BaseException] = []

    async def wait() -> None:
        try:
            await sem.wait_value(5)
        except anyio.ClosedResourceError as exc:
            errors.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            if how == "close":
                sem.close()
            elif how == "detach":
                sem.detach()
            else:
                # aclose() waits for the device, which waits for the producer; the waiters
                # wake at once all the same.
                async def close_it() -> None:
                    await sem.aclose()

                tg.start_soon(close_it)
                with anyio.fail_after(1):
                    while len(errors) < 4:
                        await anyio.sleep(0.005)
                producer.signal(5)  # lets the private streams' waits, and so aclose(), end
        assert len(errors) == 4
        assert "closed" in str(errors[0])


async def test_closing_a_host_timeline_wakes_waiters_for_good(sim: SimDriver) -> None:
    timeline = acs.create_host_timeline(driver=sim)
    twin = acs.open_host_timeline(timeline.export_fd(), driver=sim)
    outcomes: list[str] = []

    async def wait() -> None:
        try:
            await timeline.wait_value(5)
        except anyio.ClosedResourceError:
            outcomes.append("closed")
        else:
            outcomes.append("returned")

    with anyio.fail_after(5):
        async with twin, anyio.create_task_group() as tg:
            tg.start_soon(wait)
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            timeline.close()
            with anyio.fail_after(1):
                while len(outcomes) < 2:
                    await anyio.sleep(0.005)
            twin.signal(5)  # the same page reaches the value: the closed one's waiters left
    assert outcomes == ["closed", "closed"]


async def test_close_from_another_thread_wakes_waiters(sim: SimDriver) -> None:
    sem, producer = import_sim_semaphore(sim)
    errors: list[BaseException] = []

    async def wait() -> None:
        try:
            await sem.wait_value(5)
        except anyio.ClosedResourceError as exc:
            errors.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            await anyio.sleep(0.01)
            closer = threading.Thread(target=sem.close)
            closer.start()
            closer.join()
    assert len(errors) == 1
    producer.signal(5)


async def test_a_slow_close_logs_a_warning_naming_the_way_out(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_log, "CLOSE_WARNING_S", 0.05)
    ready, _ = import_sim_semaphore(sim)
    caplog.set_level(logging.WARNING, logger="aiocudasem")
    async with ready:
        stream = acs.open_stream(driver=sim)
        stream.enqueue_wait(acs.Wait(ready, 2))
        with anyio.move_on_after(0.5):
            await stream.aclose()
        assert stream.closed
        records = [r for r in caplog.records if "goes on waiting" in r.getMessage()]
        assert len(records) == 1
        message = records[0].getMessage()
        assert "ExternalSemaphore" in message and "for 2" in message
        assert "abandon()" in message
        ready.abandon()


async def test_a_slow_semaphore_close_logs_a_warning(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_log, "CLOSE_WARNING_S", 0.05)
    sem, producer = import_sim_semaphore(sim)
    caplog.set_level(logging.WARNING, logger="aiocudasem")
    async with acs.open_stream(driver=sim) as stream:
        stream.enqueue_wait(acs.Wait(sem, 2))
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sem.aclose)
                while not any("goes on waiting" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.01)
                producer.signal(2)
        message = next(r.getMessage() for r in caplog.records if "goes on" in r.getMessage())
        assert "abandon()" in message


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_consumer_whose_producer_is_gone_exits_within_a_second(backend: str) -> None:
    script = textwrap.dedent(
        f"""
        import time, anyio
        import aiocudasem as acs
        from aiocudasem.testing import SimDriver, import_sim_semaphore

        async def main():
            sim = SimDriver()
            ready, _ = import_sim_semaphore(sim)
            done, _ = import_sim_semaphore(sim)
            timeline = acs.create_host_timeline(driver=sim)
            async with ready, done, timeline, acs.open_stream(driver=sim) as stream:
                with anyio.move_on_after(0.2):
                    async with stream.handoff(
                        [acs.Wait(ready, 1), acs.Wait(timeline, 4)], acs.Signal(done, 1)
                    ):
                        pass
                with anyio.move_on_after(0.05):
                    await ready.wait_value(2)
                with anyio.move_on_after(0.05):
                    await timeline.wait_value(5)
                global gave_up
                gave_up = time.monotonic()
                ready.abandon()
                timeline.abandon()

        anyio.run(main, backend={backend!r})
        print(gave_up, flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    exited = time.monotonic()
    assert child.returncode == 0, child.stderr
    # CLOCK_MONOTONIC is the same clock in every process of the machine.
    after_giving_up = exited - float(child.stdout.strip().splitlines()[-1])
    assert after_giving_up < 1.0, (after_giving_up, exited - started)
