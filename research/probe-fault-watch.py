#!/usr/bin/env python3
"""Probe what the fault watchdog relies on: a thread blocked in ``cuEventSynchronize`` on an
event created with ``CU_EVENT_BLOCKING_SYNC`` uses no CPU, and returns the sticky error as soon
as *another* stream of the context traps.

Each case runs in a fresh process (a trap ends the context). The event is recorded on a side
stream behind ``cuStreamWaitEvent`` on the parked work, as the watchdog records it. The parked
work is either a 4 s kernel (``kernel``) or a wait on a Vulkan timeline semaphore that nobody
signals (``semaphore``). A thread blocks on the event; its CPU and the process' CPU are read
over ``--window`` seconds from ``/proc/self/task/*/schedstat``; then a kernel traps on a third
stream while the main thread queries an event every 0.5 ms. The report compares when the
blocked thread returned with when the query loop first saw the fault. The ``spinning`` case
uses an event without the blocking flag, for contrast. On the GPU machine:

    bash scripts/device.sh --smoke research/probe-fault-watch.py

or, with the package importable, ``python3 research/probe-fault-watch.py [--runs 3]``. The
report goes to stdout and, when ``$OUT`` is set, to ``$OUT/fault-watch-probe.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

CASES = ("kernel", "semaphore", "spinning")
BLOCKING_SYNC, DISABLE_TIMING = 0x1, 0x2


def thread_cpu_ns() -> dict[int, int]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except OSError:
            pass
    return out


def child(case: str, window: float) -> dict[str, Any]:
    from cuda.bindings._v2 import driver as d

    from aiocudasem import get_driver
    from aiocudasem.lowlevel import SemaphoreDesc, SemOp
    from aiocudasem.testing import workloads

    drv = get_driver("cuda")
    parked, side, trapping = (drv.stream_create(0, True, 0) for _ in range(3))
    # The probe's kernels are loaded before anything waits.
    workloads(drv).launch_spin(trapping, 1_000)
    drv.stream_synchronize(trapping)
    keep: list[Any] = []
    if case == "semaphore":
        from aiocudasem.vulkan import VulkanDevice

        vk = VulkanDevice.open(drv.device_uuid(0))
        vsem = vk.create_timeline_semaphore(0)
        keep += [vk, vsem]
        sem = drv.import_semaphore(0, SemaphoreDesc(9, fd=vsem.export_fd()))
        drv.enqueue_semaphore_waits([SemOp(sem, 1)], parked)  # never signalled
    else:
        workloads(drv).launch_spin(parked, 4_000_000_000)
    point = drv.event_create(0)
    drv.event_record(point, parked)
    drv.stream_wait_event(side, point)
    flags = DISABLE_TIMING | (0 if case == "spinning" else BLOCKING_SYNC)
    watch = int(d.event_create(flags))
    d.event_record(watch, side)

    result: dict[str, Any] = {}

    def blocked() -> None:
        try:
            d.event_synchronize(watch)
            result["returned"] = "success"
        except Exception as exc:
            result["returned"] = f"{type(exc).__name__} ({getattr(exc, 'status', '?')})"
        result["t"] = time.perf_counter()

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    time.sleep(0.3)
    c0, p0, w0 = thread_cpu_ns(), time.process_time(), time.perf_counter()
    time.sleep(window)
    p1, w1, c1 = time.process_time(), time.perf_counter(), thread_cpu_ns()
    out: dict[str, Any] = {
        "case": case,
        "blocked_thread_cpu_ms_per_s": (
            c1.get(thread.native_id or 0, 0) - c0.get(thread.native_id or 0, 0)
        )
        / 1e6
        / (w1 - w0),
        "process_cores": round((p1 - p0) / (w1 - w0), 5),
        "still_blocked_before_trap": "t" not in result,
    }
    t_trap = time.perf_counter()
    workloads(drv).launch_trap(trapping)
    while True:
        try:
            drv.check_health(0)
        except Exception:
            out["query_loop_saw_fault_ms"] = round((time.perf_counter() - t_trap) * 1e3, 2)
            break
        time.sleep(0.0005)
    thread.join(5.0)
    out["blocked_thread_returned_ms"] = (
        None if "t" not in result else round((result["t"] - t_trap) * 1e3, 2)
    )
    out["blocked_thread_got"] = result.get("returned", "still blocked after 5 s")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each case")
    p.add_argument("--window", type=float, default=1.0, help="seconds of CPU measurement")
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.window)), flush=True)
        os._exit(0)  # the context is dead: skip teardown
    lines = []
    for run in range(args.runs):
        for case in CASES:
            print(f"run {run + 1}/{args.runs}: {case} ...", file=sys.stderr, flush=True)
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", case, "--window", str(args.window)],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                line = proc.stdout.strip() or json.dumps(
                    {"case": case, "error": proc.stderr.strip()[-600:]}
                )
            except subprocess.TimeoutExpired:
                line = json.dumps({"case": case, "error": "timed out after 60 s (a hang)"})
            print(line, flush=True)
            lines.append(line)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fault-watch-probe.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
