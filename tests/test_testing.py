"""The helpers of aiocudasem.testing."""

from __future__ import annotations

import anyio
import pytest

import aiocudasem as acs
from aiocudasem.testing import import_sim_semaphore

pytestmark = pytest.mark.anyio


async def test_import_sim_semaphore_takes_sim_like_every_driver_argument() -> None:
    # It raised AttributeError ('str' object has no attribute 'create_semaphore').
    sem, producer = import_sim_semaphore("sim")
    async with sem:
        assert sem.driver is acs.get_driver("sim")
        assert sem.is_timeline
        producer.signal(2)
        with anyio.fail_after(5):
            await sem.wait_value(2)
    binary, bproducer = import_sim_semaphore("sim", timeline=False, initial=1, device=1)
    async with binary:
        assert binary.device == 1
        assert not binary.is_timeline
        assert bproducer.value == 1


@pytest.mark.parametrize("driver", ["cuda", "opencl", None, 0])
async def test_import_sim_semaphore_refuses_other_drivers(driver: object) -> None:
    with pytest.raises(TypeError, match="needs the simulated driver: pass a SimDriver or 'sim'"):
        import_sim_semaphore(driver)  # type: ignore[arg-type]
