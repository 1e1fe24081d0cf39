"""What a hand-off section and ``wait_external_semaphores`` take: their errors say which forms
of entries they take and when a wait and a signal were swapped, and an empty list of waits or
of signals is a section that hands off in one direction only."""

from __future__ import annotations

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore

pytestmark = pytest.mark.anyio

ONE = "one list or tuple of them"


# ---------------------------------------------------------------- the messages


async def test_a_semaphore_given_as_an_entry_says_what_handoff_takes(sim: SimDriver) -> None:
    a, pa = import_sim_semaphore(sim)
    async with a, acs.open_stream(driver=sim) as s:
        with pytest.raises(TypeError) as info:
            s.handoff(a, a)  # type: ignore[arg-type]
        message = str(info.value)
        assert message.startswith(
            "handoff() waits takes aiocudasem.Wait entries: one Wait or one list or tuple of "
            "them; got ExternalSemaphore: make an entry of it, aiocudasem.Wait(sem, value)"
        )
        # handoff(waits, signals) cannot take entries as separate arguments: not offered.
        assert "separate" not in message
        with pytest.raises(TypeError) as info:
            s.handoff(acs.Wait(a, 1), [a])  # type: ignore[list-item]
        assert str(info.value).startswith(
            "handoff() signals takes aiocudasem.Signal entries: one Signal or one list or "
            "tuple of them; got ExternalSemaphore: make an entry of it, "
            "aiocudasem.Signal(sem, value)"
        )
        async with acs.create_host_timeline(driver=sim) as timeline:
            with pytest.raises(TypeError, match=r"aiocudasem\.Wait\(timeline, value\)"):
                s.handoff(timeline, [])  # type: ignore[arg-type]
        assert pa.value == 0


async def test_swapped_waits_and_signals_are_named(sim: SimDriver) -> None:
    a, pa = import_sim_semaphore(sim)
    b, pb = import_sim_semaphore(sim)
    async with a, b, acs.open_stream(driver=sim) as s:
        swapped = [
            (
                lambda: s.handoff(acs.Signal(b, 1), acs.Wait(a, 1)),  # type: ignore[arg-type]
                "handoff() waits takes aiocudasem.Wait entries: one Wait or one list or tuple "
                "of them; a Signal was given as a wait: handoff(waits, signals) takes the "
                "waits first",
            ),
            (
                lambda: s.handoff([acs.Wait(a, 1)], [acs.Wait(b, 1)]),  # type: ignore[list-item]
                "handoff() signals takes aiocudasem.Signal entries: one Signal or one list or "
                "tuple of them; a Wait was given as a signal: handoff(waits, signals) takes "
                "the waits first",
            ),
            (
                lambda: s.handoff([acs.Wait(a, 1), acs.Signal(b, 1)], []),  # type: ignore[list-item]
                "a Signal was given as a wait: handoff(waits, signals) takes the waits first",
            ),
            (
                # The other calls name the swap too, without the hand-off's order.
                lambda: s.enqueue_wait(acs.Signal(a, 1)),  # type: ignore[call-overload]
                "enqueue_wait() takes aiocudasem.Wait entries: one Wait or one list or tuple "
                "of them; a Signal was given as a wait",
            ),
            (
                lambda: s.enqueue_signal(acs.Signal(a, 1), acs.Wait(b, 1)),  # type: ignore[call-overload]
                "enqueue_signal() takes aiocudasem.Signal entries: one Signal, several as "
                "separate arguments, or one list or tuple of them; a Wait was given as a signal",
            ),
        ]
        for call, expected in swapped:
            with pytest.raises(TypeError) as info:
                call()
            assert expected in str(info.value)
            assert str(info.value).endswith(expected.rsplit("; ", 1)[-1])
        with pytest.raises(TypeError) as info:
            await acs.wait_external_semaphores(acs.Signal(a, 1), s)  # type: ignore[arg-type]
        assert str(info.value) == (
            "wait_external_semaphores() waits takes aiocudasem.Wait entries: one Wait or "
            f"{ONE}; a Signal was given as a wait: wait_external_semaphores() only waits: "
            "enqueue signals with stream.enqueue_signal(), or use a hand-off section"
        )
        with pytest.raises(TypeError, match=r"got int$"):
            await acs.wait_external_semaphores([1], s)  # type: ignore[list-item]
        # Nothing was enqueued by the refused calls.
        with anyio.fail_after(5):
            await s.wait_complete()
        assert pa.value == pb.value == 0


async def test_a_graph_node_names_a_swapped_entry(sim: SimDriver) -> None:
    a, _ = import_sim_semaphore(sim)
    graph = sim.graph_create()
    async with a:
        with pytest.raises(TypeError, match=r"a Signal was given as a wait$"):
            acs.add_wait_node(graph, [acs.Signal(a, 1)])  # type: ignore[list-item]
    sim.graph_destroy(graph)


# ---------------------------------------------------------------- one direction only


async def test_a_wait_only_section_waits_for_the_producer_and_signals_nothing(
    sim: SimDriver,
) -> None:
    ready, producer = import_sim_semaphore(sim)
    seen: list[int] = []
    async with ready, acs.open_stream(driver=sim) as s:
        async with anyio.create_task_group() as tg:

            async def consumer() -> None:
                async with s.handoff(acs.Wait(ready, 1), []):
                    sim.launch(s.handle, lambda: seen.append(producer.value))
                seen.append(-1)  # resumes after the body's work

            with anyio.fail_after(5):
                tg.start_soon(consumer)
                await anyio.wait_all_tasks_blocked()
                assert seen == []
                producer.signal(1)
        assert seen == [1, -1]


async def test_a_signal_only_section_signals_after_the_body_and_waits_for_it(
    sim: SimDriver,
) -> None:
    done, observer = import_sim_semaphore(sim)
    async with done, acs.open_stream(driver=sim) as s:
        finished = anyio.Event()
        gates = []
        async with anyio.create_task_group() as tg:

            async def producer() -> None:
                async with s.handoff((), acs.Signal(done, 1)):
                    gates.append(hold(s))  # the body's GPU work, still running
                finished.set()

            with anyio.fail_after(5):
                tg.start_soon(producer)
                await anyio.wait_all_tasks_blocked()
                assert observer.value == 0  # the signal waits for the body's work
                assert not finished.is_set()
                gates[0].set()
        assert observer.value == 1


async def test_a_section_with_neither_awaits_its_body(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        with anyio.move_on_after(0.05) as scope:
            async with s.handoff([], []):
                pass
        assert scope.cancelled_caught  # the exit waited for the stream
        gate.set()
        with anyio.fail_after(5):
            async with s.handoff([], []):
                pass


async def test_an_empty_section_on_a_closed_stream_raises(sim: SimDriver) -> None:
    done, observer = import_sim_semaphore(sim)
    async with done:
        s = acs.open_stream(driver=sim)
        section = s.handoff([], [])
        await s.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            async with section:
                pass
        with pytest.raises(anyio.ClosedResourceError):
            s.handoff([], [])
        s = acs.open_stream(driver=sim)
        with pytest.raises(anyio.ClosedResourceError):
            async with s.handoff([], []):
                s.close()
        s = acs.open_stream(driver=sim)
        with pytest.raises(ZeroDivisionError):  # the body's exception, not the closed stream's
            async with s.handoff([], acs.Signal(done, 1)):
                s.close()
                1 / 0  # noqa: B018
        assert observer.value == 0


async def test_a_one_way_section_is_captured_as_one_node(sim: SimDriver) -> None:
    ready, _ = import_sim_semaphore(sim)
    done, _ = import_sim_semaphore(sim)
    async with ready, done, acs.open_stream(driver=sim) as stream:
        for waits, signals, nodes in (
            ([acs.Wait(ready, 1)], [], (1, 0)),
            ([], acs.Signal(done, 1), (0, 1)),
            ([], [], (0, 0)),
        ):
            sim.begin_capture(stream.handle)
            async with stream.handoff(waits, signals):
                pass
            graph = sim.end_capture(stream.handle)
            assert (
                len(acs.wait_nodes(graph, driver=sim)),
                len(acs.signal_nodes(graph, driver=sim)),
            ) == nodes
            sim.graph_destroy(graph)


async def test_waiting_for_no_semaphores_waits_for_the_stream(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with acs.open_stream(driver=sim) as s:
        gate = hold(s)
        with anyio.move_on_after(0.05) as scope:
            await acs.wait_external_semaphores([], s)
        assert scope.cancelled_caught
        gate.set()
        with anyio.fail_after(5):
            await acs.wait_external_semaphores((), s)
    # A foreign stream and no semaphore to name a driver: the default one.
    monkeypatch.setenv("AIOCUDASEM_DRIVER", "sim")
    async with acs.open_stream(driver="sim") as shared:
        gate = hold(shared)
        with anyio.move_on_after(0.05) as scope:
            await acs.wait_external_semaphores([], shared.handle)
        assert scope.cancelled_caught
        gate.set()
        with anyio.fail_after(5):
            await acs.wait_external_semaphores([], shared.handle)


async def test_enqueue_calls_still_need_an_entry(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as s:
        with pytest.raises(ValueError, match=r"enqueue_wait\(\) needs at least one"):
            s.enqueue_wait([])
