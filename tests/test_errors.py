"""The library's errors behave like Python errors: copyable and picklable with every field, and
each waiter of a failed point gets its own exception with the same type, fields and cause."""

from __future__ import annotations

import copy
import pickle

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import AiocudasemError
from aiocudasem.testing import SimDriver, hold

pytestmark = pytest.mark.anyio

ERRORS = [
    acs.AiocudasemError("plain", None),
    acs.AiocudasemError("with a status", 3),
    acs.CudaError("cuEventQuery failed", 400, "CUDA_ERROR_INVALID_HANDLE"),
    acs.DeviceFaultError("cuEventQuery failed", 719, "CUDA_ERROR_LAUNCH_FAILED"),
    acs.DriverUnavailableError("no driver; pass driver='sim'", 100, reason="no driver"),
    acs.DeviceMismatchError("device 0 and device 1"),
    acs.UnsupportedHandleTypeError("Win32 handles need Windows", 801),
    acs.VulkanError("vkCreateInstance failed", -9, "VK_ERROR_INCOMPATIBLE_DRIVER"),
    acs.VulkanUnavailableError("no Vulkan loader"),
]


def fields(err: BaseException) -> tuple[object, ...]:
    return (type(err), str(err), err.args, dict(vars(err)))


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_pickle_and_copy_with_every_field(err: AiocudasemError) -> None:
    for twin in (
        pickle.loads(pickle.dumps(err)),
        copy.copy(err),
        copy.deepcopy(err),
    ):
        assert twin is not err
        assert fields(twin) == fields(err)
    if isinstance(err, acs.CudaError):
        assert pickle.loads(pickle.dumps(err)).name == err.name
    if isinstance(err, acs.DriverUnavailableError):
        assert pickle.loads(pickle.dumps(err)).reason == "no driver"
    assert isinstance(pickle.loads(pickle.dumps(acs.DeviceMismatchError("x"))), ValueError)


def test_a_copy_for_a_waiter_keeps_the_cause_and_gets_its_own_traceback() -> None:
    try:
        try:
            raise OSError("the producer's fd is gone")
        except OSError as cause:
            raise acs.CudaError("cuImportExternalSemaphore failed", 1, "X") from cause
    except acs.CudaError as exc:
        original = exc
    fresh = original._for_waiter()
    assert fields(fresh) == fields(original)
    assert fresh.__cause__ is original.__cause__
    assert fresh.__suppress_context__
    assert fresh.__traceback__ is None and original.__traceback__ is not None


async def test_every_waiter_of_a_faulted_stream_gets_the_whole_error(sim: SimDriver) -> None:
    acs.configure(spin_limit=0)
    try:
        s = acs.open_stream(driver=sim)
        hold(s)
        caught: list[acs.DeviceFaultError] = []

        async def wait() -> None:
            try:
                await s.wait_complete()
            except acs.DeviceFaultError as exc:
                caught.append(exc)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(wait)
                await anyio.wait_all_tasks_blocked()
                sim.inject_fault(0, status=716)
        assert len(caught) == 3
        assert len({id(e) for e in caught}) == 3
        assert {(type(e), e.status, e.name, str(e)) for e in caught} == {
            (
                acs.DeviceFaultError,
                716,
                "CUDA_ERROR_MISALIGNED_ADDRESS",
                str(caught[0]),
            )
        }
        with pytest.raises(acs.DeviceFaultError):
            await s.aclose()
    finally:
        acs.configure(spin_limit=acs.Tuning().spin_limit)
