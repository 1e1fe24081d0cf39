"""Await the progress of a kernel while it runs.

A persistent kernel works through its steps and, after each, publishes the number of steps
done into a host timeline's word with ``aiocudasem_publish()`` (``aiocudasem/progress.cuh``,
found with ``aiocudasem.lowlevel.include_dir()``). The host awaits each step with
``timeline.wait_value(step)``: the GPU watches the word, no host thread polls it, and the event
loop stays free. Here the kernel is the test workload ``launch_progress``, which does just
that, on the GPU or on the simulated device; docs/progress.md shows a kernel of your own.

``--trap-at N`` makes the kernel trap instead of publishing step N: the wait for it raises
``DeviceFaultError`` rather than hang.

    python examples/kernel_progress.py --driver sim
    python examples/kernel_progress.py --driver sim --backend trio --steps 500 --trap-at 300

Without ``--driver``, ``$AIOCUDASEM_DRIVER`` decides (default: ``cuda``).
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio

import aiocudasem as acs
from aiocudasem.testing import workloads


async def main(driver_name: str | None, steps: int, seconds: float, trap_at: int | None) -> int:
    driver = acs.get_driver(driver_name)  # None: $AIOCUDASEM_DRIVER, else the real GPU
    work = workloads(driver)  # on a GPU, load the kernels before the first wait
    async with acs.create_host_timeline(driver=driver) as progress:
        stream = acs.open_stream(driver=driver)
        await stream.wait_complete()  # the loop's notifier, before the clock starts
        cpu, start = time.process_time(), time.perf_counter()
        # The kernel gets the word's device address and publishes 1, 2, ..., steps.
        work.launch_progress(stream, progress.handle, steps, int(seconds * 1e9), trap_at=trap_at)
        try:
            for step in range(1, steps + 1):
                await progress.wait_value(step)  # returns once the kernel has published it
                if step % max(steps // 10, 1) == 0:
                    took = time.perf_counter() - start
                    print(f"step {step}/{steps} ({100 * step // steps}%) after {took:.2f} s")
            await stream.wait_complete()
        except acs.DeviceFaultError as exc:
            print(f"the kernel faulted after step {progress.value}: {exc}")
            try:
                await stream.aclose()
            except acs.DeviceFaultError:
                pass  # released all the same
            return 1
        await stream.aclose()
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"{steps} steps awaited in {took:.2f} s on driver '{driver.name}', "
        f"the process using {100 * cpu / took:.0f}% of a core"
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Await a kernel's progress while it runs.")
    parser.add_argument("--driver", choices=["sim", "cuda"], default=None)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=1.0, help="the kernel's run time")
    parser.add_argument("--trap-at", type=int, default=None, help="trap instead of this step")
    args = parser.parse_args()
    if args.steps < 1 or args.seconds < 0:
        parser.error("need --steps >= 1 and --seconds >= 0")
    if args.trap_at is not None and not 1 <= args.trap_at <= args.steps:
        parser.error("need 1 <= --trap-at <= --steps")
    try:
        code = anyio.run(
            main, args.driver, args.steps, args.seconds, args.trap_at, backend=args.backend
        )
    except acs.DriverUnavailableError as exc:
        sys.exit(
            f"failed: the CUDA driver cannot be used: {exc.reason} (--driver sim runs it "
            "on the simulated device)"
        )
    sys.exit(code)
