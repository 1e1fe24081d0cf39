"""Side-by-side benchmarks: how fast does async Python learn that GPU work is done?

    python -m aiocudasem bench [--driver cuda|sim] [--out DIR] [--quick]

Every approach waits on the same raw CUDA streams (created through the driver seam), with the
same ``%globaltimer`` spin kernel, in one process and one run. Peer libraries (CuPy, PyTorch,
numba-cuda) wrap those streams as external streams, so they wait on exactly the same work.
On the simulated device everything runs too, and every figure is labelled as simulated.

Writes ``results.json``, ``performance.md`` and ``latency.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as _dt
import gc
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

import anyio

import aiocudasem as acs
from aiocudasem import _notify
from aiocudasem._notifier import Point, current_notifier, event_pool, take_event

US = 1e-6
KERNEL_NS = 100_000  # the 100 us kernel of the latency benchmark


def _thread_cpu() -> dict[int, tuple[str, int]]:
    """Nanoseconds on a CPU of every thread of this process (/proc/self/task/*/schedstat)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        # Python threads by name; the others are the driver's (or a library's) own.
        name = names.get(int(tid), "not Python's (driver)")
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = (name, int(f.read().split()[0]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def say(msg: str) -> None:
    print(msg, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


# ---------------------------------------------------------------- approaches
#
# Each approach waits for "everything enqueued so far on stream handle h" from a coroutine.
# `asyncio_only` ones use asyncio primitives directly, as their users would.


class Approach:
    name = ""
    label = ""
    asyncio_only = True
    available = True
    why_unavailable = ""

    def __init__(self, drv: acs.Driver) -> None:
        self.drv = drv

    async def wait(self, h: int) -> None:
        raise NotImplementedError

    def setup(self) -> None:
        """Called once before this approach's measurements."""

    def teardown(self) -> None:
        """Called once after them."""


class BlockingSync(Approach):
    name, label = "sync", "blocking cuStreamSynchronize (floor; freezes the loop)"
    asyncio_only = False

    async def wait(self, h: int) -> None:
        self.drv.stream_synchronize(h)


class ToThread(Approach):
    name, label = "to_thread", "asyncio.to_thread(synchronize)"

    async def wait(self, h: int) -> None:
        await asyncio.to_thread(self.drv.stream_synchronize, h)


class PollSleep0(Approach):
    name, label = "poll0", "poll cuStreamQuery + sleep(0)"

    async def wait(self, h: int) -> None:
        q = self.drv.stream_query
        while not q(h):
            await asyncio.sleep(0)


class PollSleep1ms(Approach):
    name, label = "poll1ms", "poll cuStreamQuery + sleep(0.001)"

    async def wait(self, h: int) -> None:
        q = self.drv.stream_query
        while not q(h):
            await asyncio.sleep(0.001)


_PYCB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class PythonCallback(Approach):
    """numba-style: a Python host callback (it takes the GIL on the driver's thread) that
    resolves a future with call_soon_threadsafe."""

    name, label = "pycallback", "Python host callback, GIL (numba style)"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.futures: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        self.next = 1

        def cb(key: int | None) -> None:
            loop, fut = self.futures.pop(key or 0)
            loop.call_soon_threadsafe(fut.set_result, None)

        self.cfunc = _PYCB(cb)
        self.addr = ctypes.cast(self.cfunc, ctypes.c_void_p).value or 0

    def enqueue(self, h: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        key = self.next
        self.next += 1
        self.futures[key] = (loop, fut)
        self.drv.launch_host_func(h, self.addr, key)
        return fut

    async def wait(self, h: int) -> None:
        await self.enqueue(h)


class CHostFnOnWorkStream(Approach):
    """Our C host function and eventfd, but launched on the work stream itself (no side
    stream): the variant the design rejected, kept to show what the side stream buys."""

    name, label = "c_workstream", "C host function on the work stream (no side stream)"
    asyncio_only = False

    def enqueue(self, h: int) -> Point:
        n = current_notifier()
        pool = event_pool.free_list(self.drv, 0)
        ev = take_event(self.drv, 0, pool)
        self.drv.event_record(ev, h)
        point = Point(self.drv, 0, h, ev, pool)
        token = next(n._tokens)
        user = n._c.arm(token)
        self.drv.launch_host_func(h, _notify.HOST_FN, user)
        point.token = token
        n._armed[token] = point
        return point

    async def wait(self, h: int) -> None:
        await current_notifier().wait(self.enqueue(h))


class Aiocudasem(Approach):
    name, label = "aiocudasem", "aiocudasem (await stream.wait_complete())"
    asyncio_only = False

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.streams: dict[int, acs.Stream] = {}

    def stream(self, h: int) -> acs.Stream:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = acs.Stream.adopt(h, driver=self.drv)
        return s

    async def wait(self, h: int) -> None:
        await self.stream(h).wait_complete()

    def enqueue(self, h: int) -> Point:
        """Record and arm the notification at once (the parked path), for the stall test."""
        pool = event_pool.free_list(self.drv, 0)
        ev = take_event(self.drv, 0, pool)
        self.drv.event_record(ev, h)
        point = Point(self.drv, 0, h, ev, pool)
        current_notifier()._arm(point)
        return point


class AiocudasemParked(Aiocudasem):
    name, label = "aiocudasem_parked", "aiocudasem, spinning off (host function only)"

    def setup(self) -> None:
        # Once for the whole approach: saving and restoring around each of 1,000 concurrent
        # waits would interleave and leave the setting wrong.
        acs.configure(spin_limit=0)

    def teardown(self) -> None:
        acs.configure(spin_limit=acs.Tuning().spin_limit)


class CupyHostFunc(Approach):
    name, label = "cupy", "CuPy launch_host_func + call_soon_threadsafe"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            import cupy
            import cupy.cuda

            self.cp = cupy
            self.streams: dict[int, Any] = {}
            self.version = cupy.__version__
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    def enqueue(self, h: int) -> asyncio.Future[None]:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.cp.cuda.ExternalStream(h)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        s.launch_host_func(lambda _arg: loop.call_soon_threadsafe(fut.set_result, None), None)
        return fut

    async def wait(self, h: int) -> None:
        await self.enqueue(h)


class _Torch(Approach):
    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda is not available")
            self.torch = torch
            self.streams: dict[int, Any] = {}
            self.version = torch.__version__
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    def record(self, h: int) -> Any:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.torch.cuda.ExternalStream(h)
        ev = self.torch.cuda.Event()
        ev.record(s)
        return ev


class TorchQuery1ms(_Torch):
    name, label = "torch_query", "PyTorch Event.query() + sleep(1 ms)"

    async def wait(self, h: int) -> None:
        ev = self.record(h)
        while not ev.query():
            await asyncio.sleep(0.001)


class TorchToThread(_Torch):
    name, label = "torch_to_thread", "PyTorch to_thread(Event.synchronize)"

    async def wait(self, h: int) -> None:
        ev = self.record(h)
        await asyncio.to_thread(ev.synchronize)


class NumbaAsyncDone(Approach):
    name, label = "numba", "numba-cuda Stream.async_done()"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            from numba import cuda

            self.cuda = cuda
            self.streams: dict[int, Any] = {}
            self.version = importlib.metadata.version("numba-cuda")
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    async def wait(self, h: int) -> None:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.cuda.external_stream(h)
        await s.async_done()


ALL = [
    BlockingSync,
    ToThread,
    PollSleep0,
    PollSleep1ms,
    PythonCallback,
    CupyHostFunc,
    TorchQuery1ms,
    TorchToThread,
    NumbaAsyncDone,
    CHostFnOnWorkStream,
    AiocudasemParked,
    Aiocudasem,
]


# ---------------------------------------------------------------- the measurements


class Bench:
    def __init__(self, drv: acs.Driver, quick: bool, devices: int = 1) -> None:
        self.drv = drv
        self.quick = quick
        self.devices = devices
        self.streams = [drv.stream_create(0, True, 0) for _ in range(64)]
        # With several devices: 8 more streams, dealt round-robin over them.
        self.split = (
            [drv.stream_create(i % devices, True, 0) for i in range(8)] if devices > 1 else []
        )
        self.results: dict[str, Any] = {}
        self.cpu_threads: dict[str, dict[str, float]] = {}  # approach -> thread name -> seconds

    def launch(self, h: int, ns: int) -> None:
        self.drv.launch_spin(h, ns)

    async def probe(self, ap: Approach) -> str | None:
        """Try the approach once; return the error text if it does not work."""
        h = self.streams[0]
        try:
            self.launch(h, 10_000)
            with anyio.fail_after(10):
                await ap.wait(h)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    async def latency(self, ap: Approach, kernel_ns: int, n: int) -> list[float]:
        h = self.streams[0]
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            if kernel_ns:
                self.launch(h, kernel_ns)
            await ap.wait(h)
            out.append((time.perf_counter() - t0) / US)
        return out

    async def cpu_parked(self, ap: Approach, waiters: int = 1000) -> float:
        """CPU cores used while `waiters` coroutines are parked on long kernels: one 3 s kernel
        on each of 16 streams, the CPU read over a 1 s window once every coroutine is waiting
        (process CPU time, all threads, the driver's and the fault watchdog's included)."""
        hs = self.streams[:16]
        for h in hs:
            self.launch(h, 3_000_000_000)

        async with anyio.create_task_group() as tg:
            for i in range(waiters):
                tg.start_soon(ap.wait, hs[i % len(hs)])
            await anyio.sleep(0.5)  # all started, spun and parked
            t0 = _thread_cpu()
            c0, w0 = time.process_time(), time.perf_counter()
            await anyio.sleep(1.0)
            cores = (time.process_time() - c0) / (time.perf_counter() - w0)
            t1 = _thread_cpu()
        # Which threads spent it: the loop's, the watchdog's, the driver's.
        by_thread: dict[str, float] = {}
        for tid, (name, ticks) in t1.items():
            spent = ticks - t0.get(tid, (name, 0))[1]
            if spent:
                by_thread[name] = round(by_thread.get(name, 0.0) + spent / 1e9, 6)
        self.cpu_threads[ap.name] = by_thread
        return cores

    async def throughput(
        self, ap: Approach, nstreams: int, seconds: float, hs: list[int] | None = None
    ) -> float:
        """Awaits per second: one task per stream, each launching an empty kernel and awaiting
        it, over the first ``nstreams`` streams of device 0, or over ``hs``."""
        if hs is None:
            hs = self.streams[:nstreams]
        count = 0
        deadline = time.perf_counter() + seconds

        async def loop(h: int) -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                self.launch(h, 0)
                await ap.wait(h)
                count += 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for h in hs:
                tg.start_soon(loop, h)
        return count / (time.perf_counter() - t0)

    async def stall(self, ap: Approach, busy_s: float = 0.3) -> float:
        """GPU time of 100 x (50 us kernel + notification) on one stream while the loop
        thread runs pure Python (holding the GIL), timed by CUDA events on that stream."""
        drv, h = self.drv, self.streams[1]
        start, end = drv.event_create(0, timing=True), drv.event_create(0, timing=True)
        try:
            drv.stream_synchronize(h)
            pending: list[Any] = []
            drv.event_record(start, h)
            for _ in range(100):
                self.launch(h, 50_000)
                enqueue = getattr(ap, "enqueue", None)
                if enqueue is not None:
                    pending.append(enqueue(h))
            drv.event_record(end, h)
            t_end = time.perf_counter() + busy_s
            x = 0
            while time.perf_counter() < t_end:  # the loop is busy in Python
                x += 1
            for p in pending:
                if isinstance(p, Point):
                    await current_notifier().wait(p)
                else:
                    await p
            drv.stream_synchronize(h)
            return drv.event_elapsed_ms(start, end) * 1e3
        finally:
            drv.event_destroy(start)
            drv.event_destroy(end)

    async def many(self, ap: Approach, waiters: int = 10_000, nstreams: int = 64) -> dict[str, Any]:
        hs = self.streams[:nstreams]
        fds0 = len(os.listdir("/proc/self/fd"))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        lat: list[float] = []
        woke = 0
        peak_fds = fds0

        async def one(h: int, t0: float) -> None:
            nonlocal woke
            await ap.wait(h)
            lat.append((time.perf_counter() - t0) / US)
            woke += 1

        async def watch() -> None:
            nonlocal peak_fds
            while woke < waiters:
                peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
                await anyio.sleep(0.002)

        t0 = time.perf_counter()
        for h in hs:
            self.launch(h, 20_000_000)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                for i in range(waiters):
                    tg.start_soon(one, hs[i % nstreams], t0)
        return {
            "woke": woke,
            "waiters": waiters,
            "extra_fds_peak": peak_fds - fds0,
            "rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
            "p50_us": statistics.median(lat),
            "p99_us": pct(lat, 99),
        }


#: The approaches measured on streams of several devices (``--devices``): those that take any
#: stream handle as it is (the others bind a library stream object to the current device).
SPLIT_APPROACHES: Final = ("sync", "poll0", "pycallback", "aiocudasem_parked", "aiocudasem")


async def run_asyncio(b: Bench, approaches: list[Approach]) -> None:
    res = b.results
    n = 60 if b.quick else 300
    tput_s = 0.3 if b.quick else 1.0
    for ap in approaches:
        entry = res.setdefault(ap.name, {"label": ap.label})
        if not ap.available:
            entry["error"] = ap.why_unavailable
            say(f"  {ap.name:<18} not available: {ap.why_unavailable}")
            continue
        ap.setup()
        try:
            await measure(b, ap, entry, n, tput_s)
        finally:
            ap.teardown()


async def measure(b: Bench, ap: Approach, entry: dict[str, Any], n: int, tput_s: float) -> None:
    err = await b.probe(ap)
    if err is not None:
        entry["error"] = err
        say(f"  {ap.name:<18} FAILS: {err}")
        return
    say(f"  {ap.name:<18} latency ...")
    await b.latency(ap, KERNEL_NS, 20)  # warm-up
    entry["latency_100us"] = await b.latency(ap, KERNEL_NS, n)
    entry["latency_empty"] = await b.latency(ap, 0, n)
    say(f"  {ap.name:<18} throughput ...")
    entry["awaits_per_s_1"] = await b.throughput(ap, 1, tput_s)
    entry["awaits_per_s_8"] = await b.throughput(ap, 8, tput_s)
    if b.split and ap.name in SPLIT_APPROACHES:
        say(f"  {ap.name:<18} throughput, 8 streams over {b.devices} devices ...")
        entry["awaits_per_s_8_split"] = await b.throughput(ap, 8, tput_s, b.split)
    if ap.name not in ("sync", "torch_to_thread", "to_thread"):
        say(f"  {ap.name:<18} CPU while parked ...")
        entry["cpu_parked"] = await b.cpu_parked(ap)
        entry["cpu_parked_threads"] = b.cpu_threads.get(ap.name, {})
        by = entry["cpu_parked_threads"]
        say(f"  {ap.name:<18} CPU while parked: {entry['cpu_parked']:.4f} cores; threads (s): {by}")
    if hasattr(ap, "enqueue") or ap.name == "sync":
        say(f"  {ap.name:<18} work-stream GPU time with the loop busy ...")
        entry["stall_us"] = await b.stall(ap)
    if ap.name in ("aiocudasem", "poll0", "pycallback"):
        say(f"  {ap.name:<18} 10,000 awaiters on 64 streams ...")
        entry["many"] = await b.many(ap)
    med = statistics.median(entry["latency_100us"])
    say(f"  {ap.name:<18} median wake latency {med:.1f} us")


async def run_trio(b: Bench) -> None:
    """Wake latency on trio: aiocudasem and the trio-native alternatives."""
    import trio

    class TrioPoll0(Approach):
        name, label = "poll0", "poll + trio.sleep(0)"

        async def wait(self, h: int) -> None:
            while not self.drv.stream_query(h):
                await trio.lowlevel.checkpoint()

    class TrioToThread(Approach):
        name, label = "to_thread", "trio.to_thread.run_sync(synchronize)"

        async def wait(self, h: int) -> None:
            await trio.to_thread.run_sync(self.drv.stream_synchronize, h)

    n = 60 if b.quick else 300
    out = b.results.setdefault("trio", {})
    for ap in (BlockingSync(b.drv), TrioPoll0(b.drv), TrioToThread(b.drv), Aiocudasem(b.drv)):
        await b.latency(ap, KERNEL_NS, 20)
        out[ap.name] = {"label": ap.label, "latency_100us": await b.latency(ap, KERNEL_NS, n)}
        say(
            f"  trio {ap.name:<13} median {statistics.median(out[ap.name]['latency_100us']):.1f} us"
        )


# ---------------------------------------------------------------- report


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "aiocudasem",
        "cuda-bindings",
        "anyio",
        "trio",
        "uvloop",
        "numpy",
        "cupy-cuda13x",
        "torch",
        "numba-cuda",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[dist] = importlib.metadata.version(dist)
    return out


def gpu_info(drv: acs.Driver) -> dict[str, str]:
    info = {"device": drv.device_name(0), "driver": drv.name}
    if not drv.simulated:
        with contextlib.suppress(Exception):
            import subprocess

            info["nvidia-smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
    return info


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    sim = meta["simulated"]
    tag = " (SIMULATED device: not GPU figures)" if sim else ""
    sync_med = statistics.median(results["sync"]["latency_100us"])
    sync_empty = statistics.median(results["sync"]["latency_empty"])
    lines = [
        f"# Performance{tag}",
        "",
        f"Measured {meta['date']} on {meta['gpu'].get('nvidia-smi') or meta['gpu']['device']}, "
        f"host {meta['host']}. Packages: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + ".",
        "",
        "One process, one run, the same streams and the same `%globaltimer` spin kernel for "
        "every approach (`benchmarks/run.py`). Latency = from enqueuing the kernel to the "
        'coroutine resuming; "+" is the median above blocking sync.',
        "",
        "| approach | wake latency, 100 us kernel: median (+ over sync) / p99 | empty stream: "
        "median / p99 | CPU while 1,000 coroutines are parked on 3 s kernels (cores) | awaits/s, "
        "1 stream | awaits/s, 8 streams | work-stream GPU time, 100 x (50 us kernel + notify),"
        " loop busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in results.items():
        if name == "trio":
            continue
        if "error" in e:
            lines.append(f"| {e['label']} | fails: `{e['error'][:120]}` | | | | | |")
            continue
        lat, emp = e["latency_100us"], e["latency_empty"]
        med = statistics.median(lat)
        lines.append(
            f"| {e['label']} | {med:.1f} (+{med - sync_med:.1f}) / {pct(lat, 99):.0f} us "
            f"| {statistics.median(emp):.1f} (+{statistics.median(emp) - sync_empty:.1f}) / "
            f"{pct(emp, 99):.0f} us "
            f"| {fmt(e.get('cpu_parked'), '.3f')} | {fmt(e.get('awaits_per_s_1'))} "
            f"| {fmt(e.get('awaits_per_s_8'))} "
            f"| {fmt(e.get('stall_us') and e['stall_us'] / 1e3, '.2f')} ms |"
        )
    lines += [
        "",
        "## 10,000 awaiters on 64 streams (20 ms kernels)",
        "",
        "| approach | woke | extra fds (peak) | RSS growth | p50 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for e in results.values():
        m = e.get("many") if isinstance(e, dict) else None
        if m:
            lines.append(
                f"| {e['label']} | {m['woke']}/{m['waiters']} | {m['extra_fds_peak']} | "
                f"{m['rss_growth_mib']:.1f} MiB | {m['p50_us'] / 1e3:.1f} ms "
                f"| {m['p99_us'] / 1e3:.1f} ms |"
            )
    split = {
        n: e for n, e in results.items() if isinstance(e, dict) and "awaits_per_s_8_split" in e
    }
    if split:
        lines += [
            "",
            f"## Throughput on 8 streams dealt over {meta.get('devices', 2)} devices",
            "",
            "| approach | awaits/s, 8 streams of device 0 | awaits/s, 8 streams over the devices |",
            "|---|---|---|",
        ]
        for e in split.values():
            one, dealt = fmt(e.get("awaits_per_s_8")), fmt(e["awaits_per_s_8_split"])
            lines.append(f"| {e['label']} | {one} | {dealt} |")
    if "trio" in results:
        tsync = statistics.median(results["trio"]["sync"]["latency_100us"])
        lines += [
            "",
            "## Wake latency on trio (100 us kernel)",
            "",
            "| approach | median (+ over sync) | p99 |",
            "|---|---|---|",
        ]
        for e in results["trio"].values():
            med = statistics.median(e["latency_100us"])
            p99 = pct(e["latency_100us"], 99)
            lines.append(f"| {e['label']} | {med:.1f} (+{med - tsync:.1f}) us | {p99:.0f} us |")
    lines += ["", "![latency distributions](latency.png)", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path, sim: bool) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    names = [n for n, e in results.items() if n != "trio" and "latency_100us" in e]
    data = [results[n]["latency_100us"] for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) + 1.5))
    ax.boxplot(data, vert=False, showfliers=False, whis=(1, 99))
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_xscale("log")
    ax.set_xlabel("wake latency for a 100 us kernel, us (box: quartiles, whiskers: p1-p99)")
    ax.set_title("Wake latency per approach" + (" (SIMULATED device)" if sim else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--driver", choices=["cuda", "sim"], default=None)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.add_argument("--only", default="", help="comma-separated approach names")
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="also measure 8-stream throughput with the streams dealt over this many devices",
    )
    ns = p.parse_args(argv)
    drv = acs.get_driver(ns.driver)
    if not 1 <= ns.devices <= drv.device_count():
        p.error(f"--devices must be in [1, {drv.device_count()}] on this machine")
    sim = drv.simulated
    say(
        f"benchmarks on {'the SIMULATED device' if sim else drv.device_name(0)} (driver {drv.name})"
    )
    b = Bench(drv, ns.quick or sim, ns.devices)
    only = {x for x in ns.only.split(",") if x}
    aps = [cls(drv) for cls in ALL if not only or cls.name in only]

    async def go_asyncio() -> None:
        await run_asyncio(b, aps)

    say("asyncio:")
    anyio.run(go_asyncio, backend="asyncio")
    gc.collect()
    say("trio:")
    anyio.run(run_trio, b, backend="trio")
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "simulated": sim,
        "gpu": gpu_info(drv),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "devices": ns.devices,
        "versions": versions(),
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "results.json").write_text(json.dumps({"meta": meta, "results": b.results}))
    (ns.out / "performance.md").write_text(markdown(b.results, meta))
    plotted = plot(b.results, ns.out / "latency.png", sim)
    say(f"wrote {ns.out / 'results.json'}, performance.md" + (", latency.png" if plotted else ""))
    say(markdown(b.results, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
