"""The reliability scenarios of tests/scenarios.py on the simulated device: in-process on
asyncio, asyncio+uvloop and trio (anyio's pytest plugin), and under plain ``anyio.run`` in a
fresh process per backend. Scaled to run in well under a minute on two cores;
``AIOCUDASEM_STORM_CYCLES=100000`` runs the full-size storm (scripts/device.sh does)."""

from __future__ import annotations

import os

import pytest

from tests import scenarios as sc

SCALE = sc.sim_scale()
BACKENDS = list(sc.BACKENDS)
# The fresh-process storm runs half the cycles, unless $AIOCUDASEM_STORM_CYCLES sets the size.
SUBPROCESS_CYCLES = (
    SCALE.storm_cycles if os.environ.get(sc.STORM_CYCLES_ENV) else SCALE.storm_cycles // 2
)


@pytest.mark.anyio
async def test_pingpong() -> None:
    async with sc.SimRig() as rig:
        await sc.pingpong(rig, SCALE.pingpong_iterations)


@pytest.mark.anyio
async def test_completion_order() -> None:
    async with sc.SimRig() as rig:
        await sc.order(rig, SCALE.order_rounds, SCALE.order_lateness_s)


@pytest.mark.anyio
async def test_crowd_with_cancellations() -> None:
    async with sc.SimRig() as rig:
        await sc.crowd(rig, SCALE.crowd_seconds)


@pytest.mark.anyio
async def test_cancellation_storm() -> None:
    async with sc.SimRig() as rig:
        await sc.storm(rig, SCALE.storm_cycles, SCALE.storm_floor, SCALE.storm_plain_limit_s)


@pytest.mark.parametrize("backend", BACKENDS)
def test_storm_and_order_under_plain_anyio_run(backend: str) -> None:
    """trio.run / asyncio.run / uvloop outside pytest's long-lived test loop."""
    rounds = max(1, SCALE.order_rounds // 2)
    budget = 60 + SUBPROCESS_CYCLES / SCALE.storm_floor + rounds * 0.5
    results = sc.run_in_subprocess(
        "sim",
        backend,
        ["storm", "order"],
        timeout=budget,
        extra=["--cycles", str(SUBPROCESS_CYCLES), "--rounds", str(rounds)],
    )
    assert all(r["backend"] == backend and not r["problems"] for r in results), results


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigint_ends_a_process_with_parked_waits(backend: str) -> None:
    result = sc.run_sigint("sim", backend)
    print(f"sigint {backend}: exited {result['exit_s']} s after SIGINT")
