"""``doctor`` on a machine without a GPU: the module loading mode line, from a stand-in driver."""

from __future__ import annotations

import pytest

import aiocudasem as acs
from aiocudasem import DRIVER_ENV, VulkanUnavailableError
from aiocudasem.cli import doctor
from aiocudasem.cli.doctor import LAZY_LOADING_HINT
from aiocudasem.vulkan import VulkanDevice


class _FakeCuda:
    """What doctor asks of the real driver, with a loading mode that a test picks."""

    name = "cuda"
    simulated = False

    def __init__(self, mode: str | Exception) -> None:
        self.mode = mode

    def device_count(self) -> int:
        return 1

    def device_uuid(self, ordinal: int) -> bytes:
        return bytes(range(16))

    def device_name(self, ordinal: int) -> str:
        return "Fake GPU"

    def module_loading_mode(self) -> str:
        if isinstance(self.mode, Exception):
            raise self.mode
        return self.mode


def _doctor_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], drv: object
) -> str:
    out, err = _doctor(monkeypatch, capsys, drv)
    assert err == ""
    return out


def _doctor(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    drv: object,
    status: int = 0,
) -> tuple[str, str]:
    """doctor's standard output and error, with ``drv`` as the CUDA driver (an exception:
    get_driver raises it) and no Vulkan."""

    def no_vulkan(cls: type[VulkanDevice], uuid: bytes | None = None) -> VulkanDevice:
        raise VulkanUnavailableError("no Vulkan in this test")

    def get_driver(name: str) -> object:
        if isinstance(drv, Exception):
            raise drv
        return drv

    monkeypatch.setattr(doctor, "get_driver", get_driver)
    monkeypatch.setattr(VulkanDevice, "open", classmethod(no_vulkan))
    assert doctor.main() == status
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_lazy_mode_is_reported_with_the_hand_off_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    out = _doctor_output(monkeypatch, capsys, _FakeCuda("lazy"))
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("module loading:"))
    assert lines[i].strip() == "module loading: lazy (CUDA's default)"
    assert lines[i + 1].strip() == LAZY_LOADING_HINT
    assert "CUDA_MODULE_LOADING=EAGER" in LAZY_LOADING_HINT
    assert "docs/lazy-loading.md" in LAZY_LOADING_HINT


def test_eager_mode_names_its_setting_and_gives_no_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    out = _doctor_output(monkeypatch, capsys, _FakeCuda("eager"))
    assert "module loading: eager (CUDA_MODULE_LOADING=EAGER)" in out
    assert LAZY_LOADING_HINT not in out


def test_a_failed_query_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiocudasem import CudaError

    failure = CudaError("cuModuleGetLoadingMode failed", 3, "CUDA_ERROR_NOT_INITIALIZED")
    out = _doctor_output(monkeypatch, capsys, _FakeCuda(failure))
    assert "module loading: unknown: cuModuleGetLoadingMode failed" in out
    assert "device 0: Fake GPU" in out


def test_a_driver_without_a_loading_mode_prints_no_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Simulated(_FakeCuda):
        module_loading_mode = None  # type: ignore[assignment]

    out = _doctor_output(monkeypatch, capsys, Simulated("lazy"))
    assert "module loading" not in out
    assert "vulkan: unavailable: no Vulkan in this test" in out


def test_no_gpu_is_reported_in_command_line_terms_and_is_no_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiocudasem._driver import unavailable

    monkeypatch.delenv(DRIVER_ENV, raising=False)
    out = _doctor_output(monkeypatch, capsys, unavailable("no CUDA device is present"))
    assert "cuda: unavailable: no CUDA device is present\n" in out
    assert (
        "default: cuda ($AIOCUDASEM_DRIVER is not set); the simulated device is --driver sim" in out
    )
    assert "PROBLEM" not in out


def test_a_valid_driver_variable_is_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DRIVER_ENV, "sim")
    out = _doctor_output(monkeypatch, capsys, _FakeCuda("eager"))
    assert "default: sim (AIOCUDASEM_DRIVER=sim)" in out


@pytest.mark.parametrize("value", ["gpu", "Sim"])
def test_an_invalid_driver_variable_is_a_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv(DRIVER_ENV, value)
    out, err = _doctor(monkeypatch, capsys, _FakeCuda("eager"), status=1)
    problem = (
        f"AIOCUDASEM_DRIVER={value!r} names no driver: set it to cuda or sim, or unset it. "
        "Until then, library calls without driver= fail"
    )
    assert f"default: PROBLEM: {problem}\n" in out
    assert err == f"aiocudasem doctor: problem: {problem}\n"
    assert "device 0: Fake GPU" in out  # the rest of the report is still there


def test_the_self_check_waits_through_the_notifier_and_prints_statistics_and_logging(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _doctor_output(monkeypatch, capsys, _FakeCuda("eager"))
    lines = {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
        for line in out.splitlines()
        if ":" in line
    }
    # A stand-in CUDA driver is no Driver: the check runs on a simulated machine of its own.
    assert lines["self-check"].startswith("a wait on the sim driver completed in ")
    assert "completed 1, faulted 0" in lines["statistics"]
    assert "faults seen" in lines["statistics"] and "leaked" in lines["statistics"]
    assert lines["logging"].startswith("logger 'aiocudasem', level")


def test_log_records_during_the_self_check_are_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiocudasem import _log

    real_open_stream = doctor.open_stream

    def leaky_open_stream(**kwargs: object) -> object:
        _log.leaked("aiocudasem.Stream 0x1 on device 0 was collected without close()")
        return real_open_stream(**kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(doctor, "open_stream", leaky_open_stream)
    out = _doctor_output(monkeypatch, capsys, _FakeCuda("eager"))
    assert "log: WARNING: aiocudasem.Stream 0x1 on device 0 was collected" in " ".join(out.split())


def test_a_failing_self_check_is_a_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(**kwargs: object) -> object:
        raise acs.CudaError("cuStreamCreate failed", 2, "CUDA_ERROR_OUT_OF_MEMORY")

    monkeypatch.setattr(doctor, "open_stream", broken)
    out, err = _doctor(monkeypatch, capsys, _FakeCuda("eager"), status=1)
    assert "self-check: PROBLEM: a wait on the sim driver failed" in out
    assert "aiocudasem doctor: problem: a wait on the sim driver failed" in err


def test_host_timeline_support_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiocudasem.testing import SimDriver

    out = _doctor_output(monkeypatch, capsys, SimDriver())
    assert "host timeline: supported on device 0 (64-bit stream memory operations" in out
    out = _doctor_output(monkeypatch, capsys, SimDriver(stream_mem_ops=False))
    line = next(x for x in out.splitlines() if x.strip().startswith("host timeline:"))
    assert "unavailable on device 0:" in line
    assert "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0" in line
    # A stand-in that is not a whole driver prints no line.
    assert "host timeline" not in _doctor_output(monkeypatch, capsys, _FakeCuda("lazy"))
