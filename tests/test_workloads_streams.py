"""The kernels of the tests and the workloads take a stream as the library's objects give it: an
``aiocudasem.Stream``, another object with ``__cuda_stream__``, or the raw handle; their errors
name the call that refused it."""

from __future__ import annotations

import ctypes

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import SEEN, SimDriver, frame_words, workloads

pytestmark = pytest.mark.anyio


class Foreign:
    """A stream of another library, as the CUDA stream protocol shows it."""

    def __init__(self, handle: int, version: int = 0) -> None:
        self.handle, self.version = handle, version

    def __cuda_stream__(self) -> tuple[int, int]:
        return (self.version, self.handle)


async def test_sim_launch_takes_a_stream_a_foreign_stream_or_a_handle(sim: SimDriver) -> None:
    ran: list[str] = []
    async with acs.open_stream(driver=sim) as s:
        sim.launch(s, lambda: ran.append("stream"))
        sim.launch(Foreign(s.handle), lambda: ran.append("protocol"))
        sim.launch(s.handle, lambda: ran.append("handle"))
        with anyio.fail_after(5):
            await s.wait_complete()
    assert ran == ["stream", "protocol", "handle"]


async def test_sim_launch_names_itself_when_it_refuses_a_stream(sim: SimDriver) -> None:
    other = SimDriver(devices=1)
    async with acs.open_stream(driver=sim) as s, acs.open_stream(driver=other) as elsewhere:
        with pytest.raises(TypeError) as info:
            sim.launch("stream", lambda: None)  # type: ignore[arg-type]
        assert str(info.value) == (
            "SimDriver.launch() takes a stream: an aiocudasem.Stream, another object with "
            "__cuda_stream__, or a stream handle (an int), not str"
        )
        with pytest.raises(TypeError, match=r"launch\(\) takes a stream.*not bool"):
            sim.launch(True, lambda: None)
        # The protocol is checked as Stream.adopt() checks it: the same types and messages.
        with pytest.raises(ValueError, match=r"launch\(\): .*returned protocol version 1"):
            sim.launch(Foreign(4, version=1), lambda: None)
        with pytest.raises(ValueError, match=r"launch\(\): .*a CUstream handle is an int in"):
            sim.launch(Foreign(-1), lambda: None)
        with pytest.raises(ValueError, match=r"launch\(\): the stream handle -1 is out of"):
            sim.launch(-1, lambda: None)
        with pytest.raises(TypeError, match=r"launch\(\): .*not a \(version, handle\) pair"):
            sim.launch(Foreign("4"), lambda: None)  # type: ignore[arg-type]
        for bad in (Foreign(4, version=1), Foreign(-1), Foreign("4")):  # type: ignore[arg-type]
            with pytest.raises((TypeError, ValueError)) as adopted:
                acs.Stream.adopt(bad, driver=sim)
            with pytest.raises(type(adopted.value)) as launched:
                sim.launch(bad, lambda: None)
            assert str(launched.value) == f"SimDriver.launch(): {adopted.value}"
        # Two simulated machines number their streams alike: the handle would be another one.
        with pytest.raises(acs.DeviceMismatchError, match=r"SimDriver\.launch\(\)"):
            sim.launch(elsewhere, lambda: None)
        with pytest.raises(TypeError, match="fn must be a callable"):
            sim.launch(s, None)  # type: ignore[arg-type]
    with pytest.raises(anyio.ClosedResourceError):
        sim.launch(s, lambda: None)


async def test_workloads_take_a_stream(sim: SimDriver) -> None:
    work = workloads(sim)
    words = 64
    src, out = work.alloc_pinned(4 * words), work.alloc_pinned(4 * 2)
    try:
        ctypes.memmove(src, frame_words(1, words).ctypes.data, 4 * words)
        ctypes.memset(out, 0, 8)
        async with acs.open_stream(driver=sim) as s:
            work.launch_spin(s, 1_000_000)
            work.launch_check_frame(s, src, words, 1, out)
            work.launch_check_frame(Foreign(s.handle), src, words, 0, out)
            with anyio.fail_after(5):
                await s.wait_complete()
            assert ctypes.c_uint32.from_address(out + 4).value == SEEN  # frame 1, intact
            assert ctypes.c_uint32.from_address(out).value == SEEN + words  # all wrong for 0
    finally:
        work.free_pinned(src)
        work.free_pinned(out)


async def test_a_trap_on_a_stream_faults_its_device(sim: SimDriver) -> None:
    s = acs.open_stream(driver=sim)
    workloads(sim).launch_trap(s)
    with anyio.fail_after(5), pytest.raises(acs.DeviceFaultError):
        await s.wait_complete()
    s.close()


async def test_workloads_name_the_call_that_refused_a_stream(sim: SimDriver) -> None:
    other = SimDriver(devices=1)
    work = workloads(sim)
    async with acs.open_stream(driver=other) as elsewhere:
        for call, name in (
            (lambda stream: work.launch_spin(stream, 1), "launch_spin()"),
            (lambda stream: work.launch_check_frame(stream, 0, 1, 0, 0), "launch_check_frame()"),
            (lambda stream: work.launch_trap(stream), "launch_trap()"),
        ):
            with pytest.raises(TypeError) as info:
                call(1.5)
            assert str(info.value) == (
                f"{name} takes a stream: an aiocudasem.Stream, another object with "
                "__cuda_stream__, or a stream handle (an int), not float"
            )
            with pytest.raises(acs.DeviceMismatchError, match=r"use workloads\(stream\.driver\)"):
                call(elsewhere)
            with pytest.raises(ValueError, match=rf"{name[:-2]}\(\): __cuda_stream__ of Foreign"):
                call(Foreign(3, version=2))
