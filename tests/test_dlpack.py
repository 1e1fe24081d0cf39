"""ready(): readiness of anything that speaks DLPack, on the simulated device. The producer
below does what a GPU library's ``__dlpack__(stream=...)`` does: it makes the consumer's stream
wait for an event recorded after its own pending work. numpy's arrays are the CPU case. The GPU
suite repeats it with PyTorch, CuPy and cuda.core."""

from __future__ import annotations

import time
from typing import Any

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold

pytestmark = pytest.mark.anyio


class Producer:
    """An array whose data a simulated kernel on ``stream`` is still writing."""

    def __init__(self, sim: SimDriver, stream: acs.Stream, device: int = 0) -> None:
        self.sim, self.stream, self.device = sim, stream, device
        self.exports: list[int | None] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
        self.exports.append(stream)
        if stream is not None and stream != -1:
            ev = self.sim.event_create(self.device)
            self.sim.event_record(ev, self.stream.handle)
            self.sim.stream_wait_event(stream, ev)
            self.sim.event_destroy(ev)
        return object()  # stands for the capsule


async def test_ready_waits_for_the_producers_pending_work(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as theirs:
        gate = hold(theirs)
        x = Producer(sim, theirs)
        woke: list[float] = []

        async def consumer() -> None:
            await acs.ready(x, driver=sim)
            woke.append(time.perf_counter())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer)
                await anyio.sleep(0.05)
                assert not woke, "ready() returned before the producer's work completed"
                released = time.perf_counter()
                gate.set()
        assert woke[0] >= released
        stream = x.exports[0]
        assert isinstance(stream, int) and stream not in (0, 1, 2)  # a private stream


async def test_the_private_stream_is_reused_and_an_abandoned_one_once_idle(
    sim: SimDriver,
) -> None:
    async with acs.open_stream(driver=sim) as theirs:
        x = Producer(sim, theirs)
        await acs.ready(x, driver=sim)
        await acs.ready(x, driver=sim)
        assert x.exports[0] == x.exports[1]  # taken back after a completed wait
        gate = hold(theirs)
        with anyio.move_on_after(0.05) as scope:
            await acs.ready(x, driver=sim)
        assert scope.cancelled_caught
        more = hold(theirs)  # more pending work: the abandoned stream is still blocked
        with anyio.move_on_after(0.05):
            await acs.ready(x, driver=sim)
        assert x.exports[3] != x.exports[2]  # not handed out while blocked
        gate.set()
        more.set()  # the work completes; the abandoned streams' waits pass
        while not all(sim.stream_query(s) for s in x.exports[2:4]):  # type: ignore[arg-type]
            await anyio.sleep(0.01)
        await acs.ready(x, driver=sim)
        assert x.exports[4] in x.exports[2:4]  # an abandoned stream, reused once idle
    assert statistics().parked == 0


async def test_a_cpu_array_is_ready_at_once() -> None:
    with anyio.fail_after(5):
        await acs.ready(np.arange(10))  # numpy: kDLCPU, no driver needed


async def test_bad_input(sim: SimDriver) -> None:
    class NoStream(Producer):
        def __dlpack__(self) -> object:  # type: ignore[override]
            return object()

    class Rocm(Producer):
        def __dlpack_device__(self) -> tuple[int, int]:
            return (10, 0)  # kDLROCM

    class Odd(Producer):
        def __dlpack_device__(self) -> Any:
            return "cuda:0"

    class Buffer(Producer):
        """Stands for cuda.core's Buffer, whose __dlpack__ ignores the stream."""

    Buffer.__module__ = "cuda.core._memory._buffer"

    async with acs.open_stream(driver=sim) as theirs:
        with pytest.raises(TypeError, match="does not implement DLPack"):
            await acs.ready(theirs, driver=sim)
        with pytest.raises(TypeError, match="does not implement DLPack"):
            await acs.ready([1, 2, 3], driver=sim)
        with pytest.raises(TypeError, match="takes no stream"):
            await acs.ready(NoStream(sim, theirs), driver=sim)
        with pytest.raises(ValueError, match="neither the CPU nor CUDA"):
            await acs.ready(Rocm(sim, theirs), driver=sim)
        with pytest.raises(TypeError, match="not \\(type, ordinal\\)"):
            await acs.ready(Odd(sim, theirs), driver=sim)
        with pytest.raises(ValueError, match="does not exist here"):
            await acs.ready(Producer(sim, theirs, device=7), driver=sim)
        buffer = Buffer(sim, theirs)
        with pytest.raises(TypeError, match="ignores the stream passed to __dlpack__"):
            await acs.ready(buffer, driver=sim)
        assert buffer.exports == []  # refused before exporting anything


async def test_a_fault_of_the_device_ends_the_wait(sim: SimDriver, fault_watchdog: float) -> None:
    theirs = acs.open_stream(1, driver=sim)
    hold(theirs)
    x = Producer(sim, theirs, device=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def consumer() -> None:
                with pytest.raises(acs.DeviceFaultError):
                    await acs.ready(x, driver=sim)

            tg.start_soon(consumer)
            await anyio.sleep(0.05)
            sim.inject_fault(1)
    with pytest.raises(acs.DeviceFaultError):
        await theirs.aclose()


# ---------------------------------------------------------------------------------------------
# Several arrays in one call.


async def test_ready_of_several_arrays_shares_one_private_stream(sim: SimDriver) -> None:
    """Arrays of one device, written on different streams of their producers: one private
    stream is passed to each, and awaited once, after the last of their work."""
    async with acs.open_stream(driver=sim) as one, acs.open_stream(driver=sim) as two:
        xs = [Producer(sim, one), Producer(sim, two), Producer(sim, one)]
        gate = hold(two)
        woke: list[float] = []

        async def consumer() -> None:
            await acs.ready(*xs, driver=sim)
            woke.append(time.perf_counter())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consumer)
                await anyio.sleep(0.05)
                assert not woke, "ready() returned before the second stream's work completed"
                released = time.perf_counter()
                gate.set()
        assert woke[0] >= released
        streams = {x.exports[0] for x in xs}
        assert len(streams) == 1 and all(len(x.exports) == 1 for x in xs)
        await acs.ready(xs[0], driver=sim)  # one array: the same call, the stream reused
        assert xs[0].exports[1] in streams


async def test_ready_of_arrays_on_two_devices_awaits_both(sim: SimDriver) -> None:
    """A private stream per device, awaited together; CPU arrays among them are ready."""
    async with acs.open_stream(driver=sim) as s0, acs.open_stream(1, driver=sim) as s1:
        a, b = Producer(sim, s0), Producer(sim, s1, device=1)
        gate = hold(s1)
        with anyio.move_on_after(0.1) as scope:
            await acs.ready(a, np.arange(3), b, driver=sim)
        assert scope.cancelled_caught  # device 1's work is still pending
        gate.set()
        with anyio.fail_after(10):
            await acs.ready(a, np.arange(3), b, driver=sim)
        assert a.exports[-1] != b.exports[-1]  # a stream of each device


async def test_ready_needs_an_array_and_checks_all_before_exporting(sim: SimDriver) -> None:
    with pytest.raises(TypeError, match="at least one array"):
        await acs.ready(driver=sim)
    async with acs.open_stream(driver=sim) as theirs:
        good = Producer(sim, theirs)
        with pytest.raises(TypeError, match="does not implement DLPack"):
            await acs.ready(good, [1, 2], driver=sim)
        with pytest.raises(ValueError, match="does not exist here"):
            await acs.ready(good, Producer(sim, theirs, device=7), driver=sim)
        assert good.exports == []  # refused before exporting anything
        with anyio.fail_after(5):
            await acs.ready(np.arange(3), np.arange(4))  # CPU arrays only: no driver needed


async def test_a_fault_during_ready_of_two_devices_raises_as_itself(
    sim: SimDriver, fault_watchdog: float
) -> None:
    """One device's fault ends the call with DeviceFaultError, not an exception group."""
    async with acs.open_stream(driver=sim) as s0:
        s1 = acs.open_stream(1, driver=sim)
        hold(s1)
        a, b = Producer(sim, s0), Producer(sim, s1, device=1)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def consumer() -> None:
                    with pytest.raises(acs.DeviceFaultError):
                        await acs.ready(a, b, driver=sim)

                tg.start_soon(consumer)
                await anyio.sleep(0.05)
                sim.inject_fault(1)
    with pytest.raises(acs.DeviceFaultError):
        await s1.aclose()


async def test_ready_checks_the_stream_parameter_before_exporting(sim: SimDriver) -> None:
    """A ``__dlpack__`` without ``stream`` is refused before any array is exported; a
    ``TypeError`` of the producer's own is the producer's, not taken for a missing stream."""

    class NoStream(Producer):
        def __dlpack__(self) -> object:  # type: ignore[override]
            return object()

    class Refuses(Producer):
        def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> object:
            raise TypeError("float8 cannot be exported through DLPack")

    async with acs.open_stream(driver=sim) as theirs:
        good = Producer(sim, theirs)
        with pytest.raises(TypeError, match="takes no stream"):
            await acs.ready(good, NoStream(sim, theirs), driver=sim)
        assert good.exports == []
        with pytest.raises(TypeError, match="float8"):
            await acs.ready(Refuses(sim, theirs), driver=sim)
