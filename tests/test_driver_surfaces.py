"""The declared surfaces of the drivers: each driver has every member of each protocol it is
used through, with the protocol's parameters. The library uses a driver only through
``Driver`` (and, for the fork hook, ``TrackedDriver``); the workloads only through
``CudaWorkloadDriver`` and ``SimWorkloadDriver``."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

import pytest

from aiocudasem._driver import Driver, TrackedDriver
from aiocudasem._driver._cuda import CudaDriver
from aiocudasem._driver._sim import SimDriver
from aiocudasem._workloads._cuda import CudaWorkloadDriver
from aiocudasem._workloads._sim import SimWorkloadDriver

PACKAGE = Path(__file__).resolve().parents[1] / "aiocudasem"


def _members(protocol: type) -> set[str]:
    attrs = getattr(protocol, "__protocol_attrs__", None)  # Python 3.12 and later
    if attrs is None:
        attrs = typing._get_protocol_attrs(protocol)  # type: ignore[attr-defined]
    return set(attrs)


def _sim() -> SimDriver:
    return SimDriver()


def _cuda() -> CudaDriver:
    return object.__new__(CudaDriver)  # its attributes, without a GPU


SURFACES = [
    (Driver, SimDriver, _sim),
    (Driver, CudaDriver, _cuda),
    (TrackedDriver, SimDriver, _sim),
    (TrackedDriver, CudaDriver, _cuda),
    (SimWorkloadDriver, SimDriver, _sim),
    (CudaWorkloadDriver, CudaDriver, _cuda),
]


@pytest.mark.parametrize(
    ("protocol", "cls", "make"),
    SURFACES,
    ids=[f"{p.__name__}-{c.__name__}" for p, c, _ in SURFACES],
)
def test_a_driver_has_every_member_of_its_protocols(
    protocol: type, cls: type, make: typing.Callable[[], object]
) -> None:
    driver = make()
    members = _members(protocol)
    assert members, protocol
    for name in sorted(members):
        declared = inspect.getattr_static(protocol, name, None)
        if not callable(declared):  # a data member: ``name``, ``simulated``
            assert hasattr(driver, name), (cls.__name__, name)
            continue
        impl = inspect.getattr_static(cls, name, None)
        assert callable(impl), (cls.__name__, name)
        want = list(inspect.signature(declared).parameters)
        assert list(inspect.signature(impl).parameters) == want, (cls.__name__, name)


def test_the_workload_protocols_extend_the_driver_protocol() -> None:
    for protocol in (TrackedDriver, CudaWorkloadDriver, SimWorkloadDriver):
        assert _members(Driver) < _members(protocol), protocol.__name__


def test_the_workloads_use_no_private_member_of_a_driver() -> None:
    """Everything the workloads call on a driver is declared in their protocols."""
    import re

    for path in sorted((PACKAGE / "_workloads").glob("*.py")):
        source = path.read_text()
        used = set(re.findall(r"(?:\bdrv|\bdriver|self\._driver)\.(_\w+)", source))
        assert not used, (path.name, used)
