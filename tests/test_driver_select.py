from __future__ import annotations

import pytest

import aiocudasem as acs
from aiocudasem._driver import _drivers
from aiocudasem.testing import SimDriver


def test_sim_by_name_and_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(acs.get_driver("sim"), SimDriver)
    assert acs.get_driver("sim") is acs.get_driver("sim")  # process-wide
    monkeypatch.setenv(acs.DRIVER_ENV, "sim")
    assert acs.get_driver() is acs.get_driver("sim")


def test_default_is_cuda_never_sim_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(acs.DRIVER_ENV, raising=False)
    try:
        drv = acs.get_driver()
    except acs.DriverUnavailableError as exc:
        msg = str(exc)
        assert "driver='sim'" in msg
        assert acs.DRIVER_ENV in msg
        assert exc.reason and exc.reason in msg
    else:  # a machine with a GPU
        assert drv.name == "cuda"
        assert not drv.simulated


def test_open_stream_without_a_gpu_names_the_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(acs.DRIVER_ENV, raising=False)
    if "cuda" in _drivers:
        pytest.skip("a real GPU is present")
    with pytest.raises(acs.DriverUnavailableError, match="sim"):
        acs.open_stream()


@pytest.mark.parametrize(("name", "exc"), [("opencl", ValueError), (3, TypeError)])
def test_bad_driver_names(name: object, exc: type) -> None:
    with pytest.raises(exc):
        acs.get_driver(name)  # type: ignore[arg-type]


def test_an_unknown_name_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"^unknown driver 'gpu': use 'cuda' or 'sim'$"):
        acs.get_driver("gpu")


@pytest.mark.parametrize("value", ["gpu", "SIM", "cuda sim"])
def test_an_invalid_environment_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(acs.DRIVER_ENV, value)
    with pytest.raises(ValueError) as info:
        acs.get_driver()
    assert str(info.value) == (
        f"AIOCUDASEM_DRIVER={value!r} names no driver: set it to 'cuda' or 'sim', or unset it "
        "(then 'cuda' is used), or pass driver= explicitly"
    )
    assert acs.get_driver("sim") is acs.get_driver("sim")  # an explicit name ignores it


def test_sim_driver_arguments() -> None:
    with pytest.raises(ValueError):
        SimDriver(devices=0)
    sim = SimDriver(devices=1)
    assert sim.device_count() == 1
    assert len(sim.device_uuid(0)) == 16
    assert isinstance(sim, acs.Driver)
