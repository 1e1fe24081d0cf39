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
