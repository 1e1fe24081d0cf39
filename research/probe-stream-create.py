#!/usr/bin/env python3
"""Which CUDA driver calls block while host functions are queued behind blocked work?

N streams wait for a host timeline that nobody signals yet. For each in turn, a side stream is
created (in a helper thread, with a time limit), made to wait for an event behind the blocked
work, and given the library's C host function: what the notifier does for the first parked
wait of each stream. The first cuStreamCreate that does not return within LIMIT seconds is
reported, and, while it is blocked, each of the other calls the wait path makes is tried from
yet another thread. Then the timeline is signalled and everything drains. Nothing here runs a
driver call on the main thread after the block, so the script always ends.

On the GPU machine: ``bash scripts/device.sh --smoke research/probe-stream-create.py``; or
``python3 research/probe-stream-create.py [N]`` with the package importable (N = 64 by
default). Needs a real GPU: the simulated device does not model this.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import aiocudasem as acs
from aiocudasem.lowlevel import HostNotifier

LIMIT = 3.0  # s: a call that takes longer is reported as blocked


def attempt(fn: Callable[[], object], limit: float = LIMIT) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a daemon thread; wait up to ``limit`` s for it."""
    box: dict = {}

    def run() -> None:
        t = time.perf_counter()
        try:
            box["result"] = fn()
        except Exception as exc:
            box["error"] = repr(exc)
        box["s"] = time.perf_counter() - t

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    return th, box


def took(th: threading.Thread, box: dict) -> str:
    if th.is_alive():
        return "BLOCKED"
    return f"{box['s'] * 1e6:.0f} us" + (f" ({box['error']})" if "error" in box else "")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    drv = acs.get_driver("cuda")
    timeline = acs.create_host_timeline(driver=drv)
    work = [drv.stream_create(0, True, 0) for _ in range(n)]
    for h in work:
        acs.Stream.adopt(h, driver=drv).enqueue_wait(acs.Wait(timeline, 1))
    queue = HostNotifier()
    idle = drv.stream_create(0, True, 0)
    probe_event = drv.event_create(0)
    sides: list[int] = []
    blocked: threading.Thread | None = None
    extra = 0
    print(f"{n} streams wait for a host timeline; one side stream and host function each:")
    for i, h in enumerate(work):
        th, box = attempt(lambda: drv.stream_create(0, True, 0))
        if th.is_alive():
            blocked = th
            print(f"  cuStreamCreate #{i + 1} BLOCKED, with {i} host functions queued")
            print("  meanwhile, from other threads:")
            for name, fn in [
                ("cuEventQuery", lambda: drv.event_query(probe_event)),
                ("cuStreamQuery", lambda: drv.stream_query(work[-1])),
                ("cuStreamWaitEvent", lambda: drv.stream_wait_event(sides[1], probe_event)),
                ("cuEventRecord", lambda: drv.event_record(probe_event, sides[2])),
                (
                    "cuLaunchHostFunc",
                    lambda: queue.launch(drv, sides[3], 10**6),
                ),
                ("cuEventCreate", lambda: drv.event_create(0)),
                ("cuStreamDestroy (an idle stream)", lambda: drv.stream_destroy(idle)),
            ]:
                th2, box2 = attempt(fn, 2.0)
                extra += name == "cuLaunchHostFunc"
                print(f"    {name:34} {took(th2, box2)}")
            break
        side = box["result"]
        sides.append(side)
        event = drv.event_create(0)
        drv.event_record(event, h)
        drv.stream_wait_event(side, event)
        queue.launch(drv, side, i + 1)
        if i < 2 or i % 16 == 15:
            print(f"  side stream #{i + 1}: cuStreamCreate took {took(th, box)}")
    if blocked is None:
        print("  no cuStreamCreate blocked")
    timeline.signal(1)
    t = time.perf_counter()
    if blocked is not None:
        blocked.join(30)
        print(
            f"after the signal, the blocked cuStreamCreate returned: {not blocked.is_alive()} "
            f"({(time.perf_counter() - t) * 1e3:.1f} ms)"
        )
    for h in work:
        drv.stream_synchronize(h)
    time.sleep(0.2)
    print(f"host functions that fired: {len(queue.drain())} of {len(sides) + extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
