"""Lifetimes derived from one statement: a class says how it is destroyed (``_destroy``) and
whether that blocks (``_destroy_blocks``); ``close()``, ``aclose()``, ``async with``, the
finalizer and ``detach()`` follow, alike for every object the library releases."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _lifetime, _log, _release
from aiocudasem.lowlevel import HostNotifier
from aiocudasem.testing import SimDriver, import_sim_semaphore

pytestmark = pytest.mark.anyio

Make = Callable[[SimDriver, acs.Stream], Any]


@pytest.fixture
async def work(sim: SimDriver) -> AsyncIterator[acs.Stream]:
    async with acs.open_stream(driver=sim) as s:
        yield s


EVERY = [
    pytest.param(lambda sim, work: acs.open_stream(driver=sim), id="Stream"),
    pytest.param(lambda sim, work: work.record(), id="Event"),
    pytest.param(lambda sim, work: import_sim_semaphore(sim)[0], id="ExternalSemaphore"),
    pytest.param(lambda sim, work: acs.create_host_timeline(driver=sim), id="HostTimeline"),
    pytest.param(lambda sim, work: acs.create_ipc_event(driver=sim), id="IpcEvent"),
    pytest.param(lambda sim, work: HostNotifier(), id="HostNotifier"),
]


@pytest.mark.parametrize("make", EVERY)
async def test_every_object_closes_alike(sim: SimDriver, work: acs.Stream, make: Make) -> None:
    obj = make(sim, work)
    assert isinstance(obj, _lifetime.Lifetime)
    assert not obj.closed
    obj.close()
    obj.close()
    assert obj.closed
    with anyio.CancelScope() as scope:
        scope.cancel()
        await obj.aclose()  # a closed object: a checkpoint, and nothing else
    assert scope.cancelled_caught


@pytest.mark.parametrize("make", EVERY)
async def test_every_object_closes_with_async_with_and_refuses_reentry(
    sim: SimDriver, work: acs.Stream, make: Make
) -> None:
    obj = make(sim, work)
    async with obj as entered:
        assert entered is obj
    assert obj.closed
    with pytest.raises(anyio.ClosedResourceError, match="is closed"):
        async with obj:
            pytest.fail("entered a closed object")  # pragma: no cover


@pytest.mark.parametrize("make", EVERY)
async def test_an_exception_leaving_async_with_closes_without_waiting(
    sim: SimDriver, work: acs.Stream, make: Make
) -> None:
    obj = make(sim, work)
    with pytest.raises(ZeroDivisionError):
        async with obj:
            1 / 0  # noqa: B018
    assert obj.closed


@pytest.mark.parametrize("make", [p for p in EVERY if p.id != "Event"])
async def test_a_forgotten_object_warns_with_its_name(
    sim: SimDriver, work: acs.Stream, make: Make
) -> None:
    obj = make(sim, work)
    name = type(obj).__name__
    with pytest.warns(ResourceWarning, match=rf"aiocudasem\.(lowlevel\.)?{name} .*collected"):
        del obj
        gc.collect()
    _release.flush()


def test_the_classes_state_their_release_once() -> None:
    """Each class gives ``_destroy`` and, where it blocks, ``_destroy_blocks``; none restates
    its release in ``close()``, ``aclose()`` or ``_release()``, except ``Stream``, whose
    ``aclose()`` first waits for its work."""
    assert not hasattr(_lifetime.Lifetime, "_destroy")  # no default: each class states it
    classes = (acs.ExternalSemaphore, acs.HostTimeline, acs.Event, acs.IpcEvent, HostNotifier)
    for cls in (*classes, acs.Stream):
        assert callable(cls._destroy), cls
        assert cls._release is _lifetime.Lifetime._release, cls
    for cls in classes:
        for name in ("aclose", "__aexit__"):
            assert getattr(cls, name) is getattr(_lifetime.Lifetime, name), (cls, name)
    # The two objects whose destruction blocks share one aclose().
    assert acs.ExternalSemaphore._destroy_blocks and acs.HostTimeline._destroy_blocks
    assert acs.ExternalSemaphore.aclose is acs.HostTimeline.aclose
    assert not acs.Event._destroy_blocks and not HostNotifier._destroy_blocks


def test_a_forgotten_host_notifier_closes_its_fd_at_once() -> None:
    n = HostNotifier()
    c = n._c
    with pytest.warns(ResourceWarning, match=r"HostNotifier \(fd \d+\).*it was released"):
        del n
        gc.collect()
    assert c.closed  # in the collector: closing it takes no lock that Python code holds
    _release.flush()  # logs the leak, and releases nothing twice
    assert _release.pending() == 0


def test_host_notifier_keeps_its_sync_with() -> None:
    with HostNotifier() as n:
        assert not n.closed
        n.drain()
    assert n.closed
    assert n._c.closed
    with pytest.raises(ValueError, match="closed"):
        n.fileno()


# ------------------------------------------------------------------ a class of its own


class _Toy(_lifetime.Lifetime):
    """A lifetime whose destroy blocks until ``gate`` is set, and records its thread."""

    __slots__ = ()
    _noun = "toy"
    _destroy_blocks = True
    gate: ClassVar[threading.Event]
    ran: ClassVar[list[str]]

    @staticmethod
    def _destroy(name: str) -> None:
        _Toy.gate.wait(10)
        _Toy.ran.append(f"{name} in {threading.current_thread().name}")

    def __init__(self, name: str) -> None:
        self._track(name)


@pytest.fixture
def toy() -> type[_Toy]:
    _Toy.gate = threading.Event()
    _Toy.ran = []
    return _Toy


def _until(done: Callable[[], bool]) -> None:
    for _ in range(1000):
        if done():
            return
        threading.Event().wait(0.005)
    pytest.fail("not released within 5 s")  # pragma: no cover


def test_a_blocking_destroy_leaves_close_to_a_thread(toy: type[_Toy]) -> None:
    obj = toy("a")
    obj.close()  # returns at once, although the destroy blocks
    assert obj.closed
    assert toy.ran == []
    toy.gate.set()
    _until(lambda: toy.ran == ["a in aiocudasem-release"])


async def test_a_blocking_destroy_is_awaited_off_the_loop(toy: type[_Toy]) -> None:
    obj = toy("b")
    toy.gate.set()
    await obj.aclose()
    assert toy.ran == ["b in aiocudasem-release"]
    await obj.aclose()  # idempotent
    assert toy.ran == ["b in aiocudasem-release"]


async def test_a_cancelled_aclose_still_destroys(toy: type[_Toy]) -> None:
    obj = toy("c")
    with anyio.move_on_after(0.05):
        await obj.aclose()
    assert obj.closed
    toy.gate.set()
    _until(lambda: toy.ran == ["c in aiocudasem-release"])


async def test_a_slow_blocking_destroy_is_logged(
    toy: type[_Toy], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_log, "CLOSE_WARNING_S", 0.05)
    obj = toy("d")
    with caplog.at_level(logging.WARNING, logger="aiocudasem"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(obj.aclose)
            with anyio.fail_after(5):
                while not caplog.records:
                    await anyio.sleep(0.01)
            toy.gate.set()
    assert "aiocudasem._Toy" in caplog.text  # named by _describe()


def test_a_forgotten_blocking_object_is_released_in_a_thread_at_the_next_use(
    toy: type[_Toy],
) -> None:
    obj = toy("e")
    with pytest.warns(ResourceWarning, match=r"aiocudasem\._Toy was collected.*next use"):
        del obj
        gc.collect()
    assert toy.ran == []
    toy.gate.set()
    _release.flush()
    _until(lambda: toy.ran == ["e in aiocudasem-release"])


class _Borrowed(_lifetime.Lifetime):
    __slots__ = ()
    _noun = "borrowed thing"

    def __init__(self) -> None:
        self._track()  # no state: nothing to release


def test_an_object_with_nothing_to_release_is_collected_quietly() -> None:
    obj = _Borrowed()
    del obj
    gc.collect()  # no ResourceWarning (warnings are errors here)
    assert _release.pending() == 0


class _Failing(_lifetime.Lifetime):
    __slots__ = ()
    _noun = "failing thing"
    _destroy_in_collector = True

    @staticmethod
    def _destroy(count: list[int]) -> None:
        count.append(1)
        raise acs.CudaError("refused", 1, "CUDA_ERROR_INVALID_VALUE")

    def __init__(self, count: list[int]) -> None:
        self._track(count)


def test_a_destroy_in_the_collector_that_fails_is_tried_again_and_reported() -> None:
    count: list[int] = []
    obj = _Failing(count)
    with pytest.warns(ResourceWarning, match="next use"):
        del obj
        gc.collect()
    assert count == [1]
    with pytest.warns(RuntimeWarning, match="refused"):
        _release.flush()
    assert count == [1, 1]


def test_close_raises_what_a_non_blocking_destroy_raises() -> None:
    count: list[int] = []
    obj = _Failing(count)
    with pytest.raises(acs.CudaError, match="refused"):
        obj.close()
    assert obj.closed
    obj.close()  # once
    assert count == [1]
