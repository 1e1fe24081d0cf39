"""The reliability scenarios of tests/scenarios.py on the real GPU, with Vulkan timeline
semaphores as the producer: in-process on asyncio, asyncio+uvloop and trio (anyio's pytest
plugin), under plain ``anyio.run`` in a fresh process per backend, and SIGINT against a process
whose waits can never complete. Figures are printed, written into assertion messages, and
appended as JSON lines to ``$AIOCUDASEM_SCENARIO_LOG`` when it is set.

Run under the driver's default module loading mode (lazy since CUDA 12.2): the ping-pong
launches each kernel while the stream waits on the producer, which would deadlock on a kernel
that is loaded lazily."""

from __future__ import annotations

import pytest

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice
from tests import scenarios as sc

pytestmark = pytest.mark.gpu

SCALE = sc.GPU
BACKENDS = list(sc.BACKENDS)


@pytest.mark.anyio
async def test_pingpong(cuda: acs.Driver, vk: VulkanDevice) -> None:
    async with sc.VulkanRig(cuda, vk) as rig:
        result = await sc.pingpong(rig, SCALE.pingpong_iterations)
    assert result["queue_relays"] > 0, result  # Vulkan queue submissions took part


@pytest.mark.anyio
async def test_completion_order(cuda: acs.Driver, vk: VulkanDevice) -> None:
    async with sc.VulkanRig(cuda, vk) as rig:
        await sc.order(rig, SCALE.order_rounds, SCALE.order_lateness_s)


@pytest.mark.anyio
async def test_crowd_with_cancellations(cuda: acs.Driver, vk: VulkanDevice) -> None:
    async with sc.VulkanRig(cuda, vk) as rig:
        await sc.crowd(rig, SCALE.crowd_seconds)


@pytest.mark.anyio
async def test_cancellation_storm(cuda: acs.Driver, vk: VulkanDevice) -> None:
    async with sc.VulkanRig(cuda, vk) as rig:
        await sc.storm(rig, SCALE.storm_cycles, SCALE.storm_floor, SCALE.storm_plain_limit_s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scenarios_under_plain_anyio_run(backend: str) -> None:
    """Every scenario under trio.run / asyncio.run / uvloop in a fresh process (its own CUDA
    context and Vulkan device), outside pytest's long-lived test loop. A hang fails."""
    results = sc.run_in_subprocess("cuda", backend, sc.SCENARIOS, timeout=240)
    assert all(r["backend"] == backend and not r["problems"] for r in results), results


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigint_ends_a_process_with_parked_waits(backend: str) -> None:
    """Waits parked on a stream blocked on a Vulkan semaphore that is never signalled: SIGINT
    ends the process with KeyboardInterrupt within 1 s."""
    result = sc.run_sigint("cuda", backend)
    print(f"sigint {backend}: exited {result['exit_s']} s after SIGINT")
