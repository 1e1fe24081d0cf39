"""See what the library is doing: its statistics and its log records.

A monitor task prints ``statistics()`` while coroutines wait for GPU work; then a device fault
(injected, on the simulated device) shows up as one ERROR record on the ``aiocudasem`` logger
and in the ``faulted`` and ``faults_seen`` counts. Runs on the simulated device only, since it
injects a fault:

    python examples/observability.py
"""

from __future__ import annotations

import logging

import anyio

import aiocudasem as acs
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, hold, workloads


def show(when: str) -> None:
    s = statistics()
    print(
        f"{when}: parked {s.parked}, spinning {s.spinning}, completed {s.completed}, "
        f"faulted {s.faulted}, faults seen {s.faults_seen}, leaked {s.leaked}"
    )


async def main() -> None:
    # The library adds no handler of its own: configure logging to see its records.
    logging.basicConfig(level=logging.INFO, format="log: %(levelname)s %(name)s: %(message)s")
    sim = SimDriver(devices=2)
    async with acs.open_stream(0, driver=sim) as stream:
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                workloads(sim).launch_spin(stream.handle, 20_000_000)  # 20 ms each
                tg.start_soon(stream.record().wait)
            await anyio.sleep(0.01)
            show("while 8 coroutines wait")
        show("after they woke")

    doomed = acs.open_stream(1, driver=sim)
    hold(doomed)  # work that never ends by itself
    async with anyio.create_task_group() as tg:

        async def victim() -> None:
            try:
                await doomed.wait_complete()
            except acs.DeviceFaultError as exc:
                print(f"a waiter got DeviceFaultError: {exc}")

        tg.start_soon(victim)
        await anyio.sleep(0.05)
        sim.inject_fault(1)  # device 1's context is lost: logged once, as an ERROR
    try:
        await doomed.aclose()
    except acs.DeviceFaultError:
        pass  # released all the same
    show("after the fault")


if __name__ == "__main__":
    anyio.run(main)
