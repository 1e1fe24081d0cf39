"""Foreign streams from the libraries people use: cuda.core, CuPy and PyTorch."""

from __future__ import annotations

import time

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import workloads

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


def _handle_of(stream: object) -> object:
    # Use the protocol where the library has it; a raw handle otherwise.
    if hasattr(stream, "__cuda_stream__"):
        return stream
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise AssertionError(f"no handle on {stream!r}")


async def test_pytorch_stream(cuda: acs.Driver) -> None:
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    a = torch.rand(4096, 4096, device="cuda")
    torch.cuda.synchronize()  # the allocations above synchronise; keep them out of the way
    with torch.cuda.stream(s):
        for _ in range(60):  # tens of ms of PyTorch's own work on its own stream
            b = a @ a
    assert not s.query()
    t0 = time.perf_counter()
    with anyio.fail_after(30):
        await acs.wait_stream(_handle_of(s), driver=cuda)
    took = time.perf_counter() - t0
    assert s.query()  # PyTorch agrees that its stream is done
    assert took > 0.005, f"returned after {took * 1e3:.2f} ms"
    assert torch.isfinite(b).all()
    # The current stream in one line, as the README shows.
    with anyio.fail_after(30):
        await acs.wait_stream(_handle_of(torch.cuda.current_stream()), driver=cuda)


async def test_cupy_stream(cuda: acs.Driver) -> None:
    cp = pytest.importorskip("cupy")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.arange(1 << 22, dtype=cp.int64)
        total = a.sum()
    with anyio.fail_after(30):
        await acs.wait_stream(_handle_of(s), driver=cuda)
    assert s.done
    assert int(total) == (1 << 22) * ((1 << 22) - 1) // 2


async def test_cuda_core_stream(cuda: acs.Driver) -> None:
    core = pytest.importorskip("cuda.core")
    dev = core.Device(0)
    dev.set_current()
    s = dev.create_stream()
    adopted = acs.Stream.adopt(s, driver=cuda)
    assert adopted.handle == int(s.handle)
    assert not adopted.owned
    workloads(cuda).launch_spin(adopted.handle, 5_000_000)
    with anyio.fail_after(30):
        await adopted.wait_complete()
    await adopted.aclose()
    s.close()


async def test_our_stream_is_usable_by_cuda_core(cuda: acs.Driver) -> None:
    core = pytest.importorskip("cuda.core")
    async with acs.open_stream(driver=cuda) as ours:
        dev = core.Device(0)
        dev.set_current()
        theirs = dev.create_stream(ours)  # through __cuda_stream__
        assert int(theirs.handle) == ours.handle
        workloads(cuda).launch_spin(ours.handle, 1_000_000)
        theirs.sync()
        assert ours.query()


# ---------------------------------------------------------------- wait_event: foreign events


async def test_wait_event_on_a_raw_handle(cuda: acs.Driver) -> None:
    async with acs.open_stream(driver=cuda) as s:
        ev = cuda.event_create(0)
        try:
            workloads(cuda).launch_spin(s.handle, 20_000_000)  # 20 ms
            cuda.event_record(ev, s.handle)
            assert not cuda.event_query(ev)
            t0 = time.perf_counter()
            with anyio.fail_after(30):
                await acs.wait_event(ev, driver=cuda)
            took = time.perf_counter() - t0
            assert cuda.event_query(ev)
            assert took > 0.005, f"returned after {took * 1e3:.2f} ms"
            # A cancelled wait abandons the observation only; the next one completes.
            workloads(cuda).launch_spin(s.handle, 50_000_000)
            cuda.event_record(ev, s.handle)
            with anyio.move_on_after(0.005) as scope:
                await acs.wait_event(ev, driver=cuda)
            assert scope.cancelled_caught
            with anyio.fail_after(30):
                await acs.wait_event(ev, driver=cuda)
            assert cuda.event_query(ev)
        finally:
            await s.wait_complete()
            cuda.event_destroy(ev)


async def test_wait_event_on_a_pytorch_event(cuda: acs.Driver) -> None:
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    a = torch.rand(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    never_recorded = torch.cuda.Event()
    with anyio.fail_after(5):
        await acs.wait_event(never_recorded, driver=cuda)  # complete, as query() says
    ev = torch.cuda.Event()
    with torch.cuda.stream(s):
        for _ in range(60):  # tens of ms of PyTorch's own work on its own stream
            b = a @ a
        ev.record(s)
    assert not ev.query()
    with anyio.fail_after(30):
        await acs.wait_event(ev, driver=cuda)
    assert ev.query()  # PyTorch agrees that the work it captured is done
    assert torch.isfinite(b).all()


async def test_wait_event_on_a_cupy_event(cuda: acs.Driver) -> None:
    cp = pytest.importorskip("cupy")
    s = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event()
    with s:
        a = cp.arange(1 << 22, dtype=cp.int64)
        total = a.sum()
        ev.record(s)
    with anyio.fail_after(30):
        await acs.wait_event(ev, driver=cuda)
    assert ev.done
    assert int(total) == (1 << 22) * ((1 << 22) - 1) // 2


async def test_wait_event_on_a_cuda_core_event(cuda: acs.Driver) -> None:
    core = pytest.importorskip("cuda.core")
    dev = core.Device(0)
    dev.set_current()
    s = dev.create_stream()
    workloads(cuda).launch_spin(int(s.handle), 20_000_000)
    ev = s.record()
    assert not ev.is_done
    with anyio.fail_after(30):
        await acs.wait_event(ev, driver=cuda)
    assert ev.is_done
    ev.close()
    s.close()


# ---------------------------------------------------------------- ready(): DLPack producers


async def test_ready_on_a_pytorch_tensor(cuda: acs.Driver) -> None:
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    a = torch.rand(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):  # PyTorch orders the work of its current stream
        b = a
        for _ in range(60):
            b = b @ a
        after = torch.cuda.Event()
        after.record(s)
        assert not after.query()
        with anyio.fail_after(30):
            await acs.ready(b, driver=cuda)
    assert after.query()  # everything enqueued before the export had completed


async def test_ready_on_a_cupy_array(cuda: acs.Driver) -> None:
    cp = pytest.importorskip("cupy")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.arange(1 << 24, dtype=cp.float64)
        total = cp.sqrt(a).sum()
        after = cp.cuda.Event()
        after.record(s)
        with anyio.fail_after(30):
            await acs.ready(total, driver=cuda)
    assert after.done
    assert float(total) > 0


async def test_ready_on_a_cpu_array_needs_no_gpu_work() -> None:
    np = pytest.importorskip("numpy")
    with anyio.fail_after(5):
        await acs.ready(np.ones(3))
