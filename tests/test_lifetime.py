"""One lifetime for every owned object: Stream, Event and ExternalSemaphore behave alike."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import SemOp
from aiocudasem.testing import SimDriver, hold, import_sim_semaphore
from tests.conftest import until_parked

pytestmark = pytest.mark.anyio

Make = Callable[[SimDriver, acs.Stream], Any]


@pytest.fixture
async def work(sim: SimDriver) -> AsyncIterator[acs.Stream]:
    async with acs.open_stream(driver=sim) as s:
        yield s


def _stream(sim: SimDriver, work: acs.Stream) -> acs.Stream:
    return acs.open_stream(driver=sim)


def _event(sim: SimDriver, work: acs.Stream) -> acs.Event:
    return work.record()


def _semaphore(sim: SimDriver, work: acs.Stream) -> acs.ExternalSemaphore:
    return import_sim_semaphore(sim)[0]


OWNED = [
    pytest.param(_stream, id="Stream"),
    pytest.param(_event, id="Event"),
    pytest.param(_semaphore, id="ExternalSemaphore"),
]


@pytest.mark.parametrize("cls", [acs.Stream, acs.Event, acs.ExternalSemaphore])
def test_no_public_constructor(cls: type) -> None:
    with pytest.raises(TypeError, match="use "):
        cls()


@pytest.mark.parametrize("make", OWNED)
async def test_close_is_idempotent_and_closes(sim: SimDriver, work: acs.Stream, make: Make) -> None:
    obj = make(sim, work)
    assert not obj.closed
    obj.close()
    obj.close()
    assert obj.closed
    with pytest.raises(anyio.ClosedResourceError, match="is closed"):
        obj.handle  # noqa: B018
    await obj.aclose()  # closing a closed object is fine, and a checkpoint
    assert obj.closed


@pytest.mark.parametrize("make", OWNED)
async def test_async_with_closes_and_refuses_a_closed_object(
    sim: SimDriver, work: acs.Stream, make: Make
) -> None:
    obj = make(sim, work)
    async with obj as entered:
        assert entered is obj
    assert obj.closed
    with pytest.raises(anyio.ClosedResourceError):
        async with obj:
            pytest.fail("entered a closed object")  # pragma: no cover


async def test_a_semaphore_aclose_cancelled_at_once_still_destroys_it(
    sim: SimDriver, work: acs.Stream
) -> None:
    sem, _ = import_sim_semaphore(sim)
    handle = sem.handle
    with anyio.CancelScope() as scope:
        scope.cancel()
        await sem.aclose()  # cancelled before its worker thread could start
    assert sem.closed
    with anyio.fail_after(5):
        while True:  # destroyed all the same, by a worker thread
            try:
                _signal(sim, handle, work)
            except acs.CudaError:
                break
            await anyio.sleep(0.001)


@pytest.mark.parametrize("make", OWNED)
async def test_aclose_is_a_checkpoint(sim: SimDriver, work: acs.Stream, make: Make) -> None:
    obj = make(sim, work)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await obj.aclose()
    # Cancelled at the checkpoint, but released all the same.
    assert obj.closed


def _signal(sim: SimDriver, sem: int, work: acs.Stream) -> None:
    sim.enqueue_semaphore_signals([SemOp(sem, value=1)], work.handle)


@pytest.mark.parametrize(
    ("make", "use"),
    [
        (_stream, lambda sim, h, work: sim.stream_query(h)),
        (_event, lambda sim, h, work: sim.event_query(h)),
        (_semaphore, _signal),
    ],
    ids=["Stream", "Event", "ExternalSemaphore"],
)
async def test_detach_hands_the_handle_over_without_releasing_it(
    sim: SimDriver,
    work: acs.Stream,
    make: Make,
    use: Callable[[SimDriver, int, acs.Stream], object],
) -> None:
    obj = make(sim, work)
    handle = obj.handle
    assert obj.detach() == handle
    assert obj.closed
    del obj
    gc.collect()  # no ResourceWarning (warnings are errors here)...
    async with acs.open_stream(driver=sim):  # ...and the next use releases nothing
        pass
    use(sim, handle, work)  # the driver still has it: it is the caller's now


def test_closing_a_stream_does_not_wait_for_its_work(sim: SimDriver) -> None:
    s = acs.open_stream(driver=sim)
    gate = hold(s)
    done = threading.Event()
    closer = threading.Thread(target=lambda: (s.close(), done.set()), daemon=True)
    closer.start()
    try:
        assert done.wait(5), "close() waited for the stream's work"
        assert s.closed
    finally:
        gate.set()  # the gated work still completes on the device


async def test_closing_a_semaphore_destroys_it_off_the_calling_thread(
    sim: SimDriver, work: acs.Stream
) -> None:
    sem, _ = import_sim_semaphore(sim)
    handle = sem.handle
    sem.close()
    with anyio.fail_after(5):
        while True:  # destroyed by a worker thread, soon
            try:
                _signal(sim, handle, work)
            except acs.CudaError:
                break
            await anyio.sleep(0.001)


@pytest.mark.parametrize("make", [p for p in OWNED if p.id != "Event"])
async def test_a_forgotten_object_warns_with_its_name(
    sim: SimDriver, work: acs.Stream, make: Make
) -> None:
    obj = make(sim, work)
    name = type(obj).__name__
    with pytest.warns(ResourceWarning, match=rf"aiocudasem\.{name} 0x[0-9a-f]+.*collected"):
        del obj
        gc.collect()


async def test_an_event_may_be_left_to_the_collector_without_a_warning(
    sim: SimDriver, work: acs.Stream
) -> None:
    ev = _event(sim, work)
    del ev
    gc.collect()  # warnings are errors in this suite


_DEV_MODE = """
import gc, warnings
import aiocudasem as acs
from aiocudasem.testing import SimDriver

warnings.simplefilter("always")
sim = SimDriver()

def make_one():
    return acs.open_stream(driver=sim)  # the line the warning must name

s = make_one()
del s
gc.collect()
"""


@pytest.mark.parametrize("flag", [["-X", "dev"], ["-X", "tracemalloc"], []])
def test_dev_mode_names_where_a_forgotten_object_was_created(
    tmp_path: Path, flag: list[str]
) -> None:
    script = tmp_path / "forgot.py"
    script.write_text(textwrap.dedent(_DEV_MODE))
    proc = subprocess.run(
        [sys.executable, "-W", "always", *flag, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ResourceWarning" in proc.stderr
    line = _DEV_MODE.splitlines().index(
        "    return acs.open_stream(driver=sim)  # the line the warning must name"
    )
    site = f"created at {script}:{line + 1} in make_one"
    if flag:
        assert site in proc.stderr, proc.stderr
    else:
        assert "created at" not in proc.stderr, proc.stderr  # free outside development mode


async def test_detaching_a_stream_forgets_its_side_stream(sim: SimDriver) -> None:
    from aiocudasem import configure
    from aiocudasem.lowlevel import statistics

    saved = configure()
    configure(spin_limit=0)  # park, so that the wait uses the side stream
    try:
        before = statistics().side_streams
        s = acs.open_stream(driver=sim)
        assert statistics().side_streams == before + 1  # made with the stream
        gate = hold(s)
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.wait_complete)
            await until_parked()
            assert statistics().side_streams == before + 1  # the same one
            gate.set()
        handle = s.detach()
        assert statistics().side_streams == before
        sim.stream_destroy(handle)  # the caller's to destroy now
    finally:
        configure(spin_limit=saved.spin_limit)


def test_workloads_refuse_a_driver_they_do_not_know() -> None:
    from aiocudasem.testing import workloads

    with pytest.raises(TypeError, match="no workloads"):
        workloads(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no workloads"):
        workloads(1)  # type: ignore[arg-type]


def test_workloads_do_not_keep_their_driver_alive() -> None:
    import weakref

    from aiocudasem.testing import workloads

    drv = SimDriver()
    w = workloads(drv)
    ptr = w.alloc_pinned(64)
    w.free_pinned(ptr)
    ref = weakref.ref(drv)
    del drv, w
    gc.collect()
    assert ref() is None


def test_a_fork_while_workloads_are_being_made_does_not_hang_the_child() -> None:
    import os

    from aiocudasem import _workloads
    from aiocudasem.testing import workloads
    from tests.conftest import wait_for_child

    with _workloads._lock:  # another thread in the middle of workloads() at the fork
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                fresh = SimDriver()
                w = workloads(fresh)
                w.free_pinned(w.alloc_pinned(16))
                code = 0
            finally:
                os._exit(code)
    assert wait_for_child(pid, 30) == 0


async def test_detach_returns_the_handle_even_if_the_side_stream_cannot_be_dropped(
    sim: SimDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiocudasem._notifier import side_streams

    def faulted(driver: object, handle: int) -> None:
        raise acs.DeviceFaultError("gone", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")

    s = acs.open_stream(driver=sim)
    monkeypatch.setattr(side_streams, "drop", faulted)
    handle = s.detach()
    assert s.closed
    sim.stream_destroy(handle)  # it was returned, and is still the driver's stream
