"""The public low-level layer: what aiocudasem.lowlevel offers, on the simulated device."""

from __future__ import annotations

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import lowlevel
from aiocudasem.testing import SimDriver, hold

pytestmark = pytest.mark.anyio


def test_all_names_exist_and_nothing_private_leaks() -> None:
    for name in lowlevel.__all__:
        assert hasattr(lowlevel, name), name
    public = {n for n in dir(lowlevel) if not n.startswith("_")}
    assert public - set(lowlevel.__all__) <= {"annotations", "TYPE_CHECKING"}


async def test_host_notifier_reports_tokens_in_stream_order(sim: SimDriver) -> None:
    with lowlevel.HostNotifier() as n:
        async with acs.open_stream(driver=sim) as s:
            gate = hold(s)
            n.launch(sim, s.handle, 7)
            n.launch(sim, s.handle, 2**64 - 1)
            assert n.drain() == []  # held back by the gated kernel
            gate.set()
            got: list[int] = []
            with anyio.fail_after(5):
                while len(got) < 2:
                    await anyio.wait_readable(n.fileno())
                    got += n.drain()
            assert got == [7, 2**64 - 1]
    assert n.closed


async def test_host_notifier_refused_launch_leaves_nothing_armed(sim: SimDriver) -> None:
    n = lowlevel.HostNotifier()
    s = acs.open_stream(driver=sim)
    handle = s.handle
    await s.aclose()
    with pytest.raises(acs.CudaError):
        n.launch(sim, handle, 1)  # a destroyed stream
    assert n._c.stats()["pending"] == 0
    with pytest.raises((OverflowError, ValueError)):
        n.launch(sim, handle, -1)
    n.close()
    n.close()


def test_host_notifier_refuses_bad_arguments_before_arming(sim: SimDriver) -> None:
    n = lowlevel.HostNotifier()
    try:
        s = sim.stream_create(0, True, 0)
        for token in (-1, 2**64):
            with pytest.raises(ValueError, match="token"):
                n.launch(sim, s, token)
        for token in (True, 1.0, "1"):
            with pytest.raises(TypeError, match="token"):
                n.launch(sim, s, token)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="driver"):
            n.launch(None, s, 1)  # type: ignore[arg-type]
        assert n._c.stats()["pending"] == 0  # nothing was armed
        assert n.drain() == []
        sim.stream_destroy(s)
    finally:
        n.close()


def test_host_function_address_is_the_notifiers() -> None:
    assert isinstance(lowlevel.HOST_FUNCTION, int)
    assert lowlevel.HOST_FUNCTION != 0
