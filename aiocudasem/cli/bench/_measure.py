"""The measurements: latency, throughput, CPU while parked, work-stream stall, crowds."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import resource
import statistics
import time
from collections.abc import Iterator
from typing import Any, Final

import anyio
import anyio.lowlevel

import aiocudasem as acs
from aiocudasem import configure
from aiocudasem.testing import workloads

from ._approaches import Aiocudasem, Approach
from ._common import (
    KERNEL_NS,
    US,
    balanced,
    gc_window,
    paired_ratios,
    pct,
    say,
    spread,
    thread_cpu,
)

#: How long each throughput figure counts awaits, per round: some 30,000 awaits on an H200; the
#: rounds give the spread.
THROUGHPUT_S: Final = 0.6

#: Paired throughput: every round measures each of these approaches for PAIRED_S, one after
#: the other, in the order of a balanced Latin square (``_common.latin_row``). A ratio of two
#: approaches in one round is a paired figure: the machine's drift over seconds and minutes
#: (clocks, other tenants), which spreads the rounds of the main table, falls on both alike.
PAIRED_APPROACHES: Final = ("poll0", "checkpoint", "aiocudasem")
PAIRED_S: Final = 0.2

#: The kernels of the parked crowd: long enough that all 10,000 coroutines are waiting before
#: they end (starting them takes about half a second on an H200 host).
PARKED_KERNEL_NS: Final = 1_500_000_000

# ---------------------------------------------------------------- the measurements


class Bench:
    def __init__(self, drv: acs.Driver, quick: bool, devices: int = 1) -> None:
        self.drv = drv
        self.work = workloads(drv)  # before any wait: its kernel loads first
        self.quick = quick
        self.devices = devices
        #: The crowds' size and the parked crowd's kernel; the parked-CPU test's kernel, its
        #: settling time and its window. A smoke run (``--quick``, the simulated device) takes
        #: smaller ones: its figures are for checking, not for reading.
        self.crowd = 2_000 if quick else 10_000
        self.parked_kernel_ns = 500_000_000 if quick else PARKED_KERNEL_NS
        self.cpu_kernel_ns, self.cpu_settle_s, self.cpu_window_s = (
            (1_000_000_000, 0.2, 0.3) if quick else (3_000_000_000, 0.5, 1.0)
        )
        self.streams = [drv.stream_create(0, True, 0) for _ in range(64)]
        # With several devices: 8 more streams, dealt round-robin over them.
        self.split = (
            [drv.stream_create(i % devices, True, 0) for i in range(8)] if devices > 1 else []
        )
        #: The main rounds: asyncio's approaches by name, and those of every other loop under
        #: its name ("uvloop", "trio").
        self.results: dict[str, Any] = {}
        #: Paired throughput, by loop ("asyncio", "uvloop", "trio"), then stream count ("1",
        #: "8"), then approach: awaits/s per round (see paired_throughput()).
        self.paired: dict[str, dict[str, dict[str, list[float]]]] = {}
        self.cpu_threads: dict[str, dict[str, float]] = {}  # approach -> thread name -> seconds

    def launch(self, h: int, ns: int) -> None:
        self.work.launch_spin(h, ns)

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
        (process CPU time, all threads, the driver's and the fault watchdog's included). A
        smoke run takes a 1 s kernel and a 0.3 s window."""
        hs = self.streams[:16]
        for h in hs:
            self.launch(h, self.cpu_kernel_ns)

        async with anyio.create_task_group() as tg:
            for i in range(waiters):
                tg.start_soon(ap.wait, hs[i % len(hs)])
            await anyio.sleep(self.cpu_settle_s)  # all started, spun and parked
            t0 = thread_cpu()
            c0, w0 = time.process_time(), time.perf_counter()
            await anyio.sleep(self.cpu_window_s)
            cores = (time.process_time() - c0) / (time.perf_counter() - w0)
            t1 = thread_cpu()
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
            wait = ap.waiter(h)
            while time.perf_counter() < deadline:
                self.launch(h, 0)
                await wait()
                count += 1

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for h in hs:
                tg.start_soon(loop, h)
        return count / (time.perf_counter() - t0)

    async def stall(self, ap: Approach, busy_s: float = 0.3) -> float:
        """GPU time of 100 x (50 us kernel + notification) on one stream while the loop
        thread runs pure Python (holding the GIL), timed by CUDA events on that stream.

        Approaches that notify through a host function of their own launch it behind each
        kernel. aiocudasem's waits (``Event.wait()``, spinning off) start once all kernels are
        enqueued and park while the kernels still run; as in any crowd on one stream, only the
        oldest has a host function (on the side stream), and the chain advances once the loop
        is free again."""
        drv, h = self.drv, self.streams[1]
        start, end = drv.event_create(0, timing=True), drv.event_create(0, timing=True)
        events: list[acs.Event] = []
        pending: list[Any] = []
        saved = configure()
        if isinstance(ap, Aiocudasem):
            configure(spin_limit=0)  # every await parks: its notification is armed
        try:
            drv.stream_synchronize(h)
            drv.event_record(start, h)
            enqueue = getattr(ap, "enqueue", None)
            for _ in range(100):
                self.launch(h, 50_000)
                if enqueue is not None:
                    p = enqueue(h)
                    (events if isinstance(p, acs.Event) else pending).append(p)
            drv.event_record(end, h)
            async with anyio.create_task_group() as tg:
                for ev in events:
                    tg.start_soon(ev.wait)
                for _ in range(10):  # let them park (each arms at its first turn)
                    await anyio.lowlevel.checkpoint()
                t_end = time.perf_counter() + busy_s
                x = 0
                while time.perf_counter() < t_end:  # the loop is busy in Python
                    x += 1
                while pending:
                    await pending.pop(0)
            drv.stream_synchronize(h)
            return drv.event_elapsed_ms(start, end) * 1e3
        finally:
            for p in pending:  # not awaited after a failure: no "never awaited" warning
                if inspect.iscoroutine(p):
                    p.close()
            configure(spin_limit=saved.spin_limit)
            for ev in events:
                ev.close()
            drv.event_destroy(start)
            drv.event_destroy(end)

    async def many(
        self,
        ap: Approach,
        waiters: int = 10_000,
        nstreams: int = 64,
        kernel_ns: int = 20_000_000,
        collect: bool = False,
    ) -> dict[str, Any]:
        """``waiters`` coroutines await ``nstreams`` streams, each running one kernel of
        ``kernel_ns`` (one thread each: they run side by side and end together). Latency is
        taken from before the launches (``p50_us``, ``p99_us``) and from the kernels' end
        (``after_end_*``: the same less ``kernel_ns``; the spin kernel reads the GPU's
        nanosecond timer, and its launch adds microseconds). ``started_before_end`` counts the
        coroutines that were waiting before the kernels ended: with kernels long enough, all of
        them, and the figures measure how a crowd of parked coroutines is woken.

        Nothing else is enqueued on the streams: a timing event behind each kernel would be a
        dependent command, and with more busy streams than the GPU's hardware queues
        (``CUDA_DEVICE_MAX_CONNECTIONS``, 8 by default) it would hold back the commands of the
        other streams that share its queue until its own kernel ended.

        A full garbage collection runs before the launches, outside the figures, so that
        the collections during the crowd are the crowd's own.

        ``collect``: once every coroutine has started, and if the kernels are still running,
        run a full garbage collection (``collected_before_end`` says whether it ended in time).
        Starting 10,000 tasks makes one due, and without this it lands in whichever approach
        allocates first once the kernels end: in one run of five rounds it took a parked
        crowd's p50 from 23 ms to 295-318 ms in two of them. Every approach gets the same."""
        hs = self.streams[:nstreams]
        fds0 = len(os.listdir("/proc/self/fd"))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        lat: list[float] = []
        early = 0
        woke = 0
        started = 0
        all_started = anyio.Event()
        peak_fds = fds0
        kernel_s = kernel_ns / 1e9
        collected = False

        async def one(h: int, t0: float) -> None:
            nonlocal woke, early, started
            if time.perf_counter() - t0 < kernel_s:
                early += 1
            started += 1
            if started == waiters:
                all_started.set()
            await ap.wait(h)
            lat.append(time.perf_counter() - t0)
            woke += 1

        async def watch() -> None:
            nonlocal peak_fds
            while woke < waiters:
                peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
                await anyio.sleep(0.002)

        pauses = GcPauses()
        # Every crowd starts with the collector's debt paid, for every approach alike: what
        # the approach's earlier measurements left (the parked-CPU and stall tests run for
        # some approaches and not for others) would otherwise bring a full collection
        # forward into its crowd (one more full collection in every round: 44-259 ms each
        # on the H200 hosts of runs J to M).
        gc.collect()
        t0 = time.perf_counter()
        for h in hs:
            self.launch(h, kernel_ns)
        with pauses, anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                for i in range(waiters):
                    tg.start_soon(one, hs[i % nstreams], t0)
                if collect:
                    await all_started.wait()
                    with pauses.ignored():
                        gc.collect()
                    collected = time.perf_counter() - t0 < kernel_s
        from_t0 = [t / US for t in lat]
        after_end = [(t - kernel_s) / US for t in lat]
        return {
            "woke": woke,
            "waiters": waiters,
            "kernel_ms": kernel_ns / 1e6,
            "started_before_end": early,
            "collected_before_end": collected,
            "collected_before_launch": True,
            "extra_fds_peak": peak_fds - fds0,
            "rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
            "p50_us": statistics.median(from_t0),
            "p99_us": pct(from_t0, 99),
            "after_end_p50_us": statistics.median(after_end),
            "after_end_p99_us": pct(after_end, 99),
            # The garbage collector's own pauses in the crowd's time (the explicit collection
            # of ``collect`` left out): full collections and milliseconds, of all generations.
            "gc_full": pauses.full,
            "gc_full_ms": pauses.full_s * 1e3,
            "gc_ms": pauses.all_s * 1e3,
        }


class GcPauses:
    """Counts the garbage collector's pauses while in a ``with`` block (``gc.callbacks``):
    how many full (generation 2) collections ran, and how long they and all of them took.
    A collection begun inside ``ignored()`` is left out."""

    def __init__(self) -> None:
        self.full = 0
        self.full_s = self.all_s = 0.0
        self._began: float | None = None
        self._ignoring = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = None if self._ignoring else time.perf_counter()
        elif self._began is not None:
            took = time.perf_counter() - self._began
            self._began = None
            self.all_s += took
            if info["generation"] == 2:
                self.full += 1
                self.full_s += took

    @contextlib.contextmanager
    def ignored(self) -> Iterator[None]:
        self._ignoring = True
        try:
            yield
        finally:
            self._ignoring = False

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


#: The approaches measured on streams of several devices (``--devices``): those that take any
#: stream handle as it is (the others bind a library stream object to the current device).
SPLIT_APPROACHES: Final = ("sync", "poll0", "pycallback", "aiocudasem_parked", "aiocudasem")


#: The approaches whose crowds of 10,000 awaiters (2,000 in a smoke run) are measured.
CROWD_APPROACHES: Final = ("poll0", "checkpoint", "pycallback", "aiocudasem")


class Progress:
    """One line per step (an approach in a round, a kernel length), with the time so far and
    an estimate of what is left. ``cost``: each step's expected share of the time (the
    estimate weighs the steps done and left by it), where the steps differ; 1 each if not
    given."""

    def __init__(self, steps: int, cost: float | None = None) -> None:
        self.steps, self.done, self.t0 = steps, 0, time.perf_counter()
        self.total = float(steps) if cost is None else cost
        self.spent = 0.0

    def step(self, what: str, cost: float = 1.0) -> None:
        elapsed = time.perf_counter() - self.t0
        left = elapsed / self.spent * (self.total - self.spent) if self.spent > 0 else None
        eta = f", about {max(left, 0.0):.0f} s left" if left is not None else ""
        self.done += 1
        self.spent += cost
        say(f"[{self.done}/{self.steps}] {what} ({elapsed:.0f} s{eta})")


async def run_main(b: Bench, loop: str, approaches: list[Approach], repeats: int) -> None:
    """Every approach ``repeats`` times on ``loop``, interleaved: round r measures them all, in
    the order of row r of a balanced Latin square (``_common.latin_row``). Each round's figures
    are one run, which records its round, so that figures of one round can be paired. The
    results go to ``b.results`` (asyncio) or ``b.results[loop]``; then the paired throughput
    rounds."""
    res = b.results if loop == "asyncio" else b.results.setdefault(loop, {})
    n = 60 if b.quick else 300
    tput_s = THROUGHPUT_S / 2 if b.quick else THROUGHPUT_S
    live = []
    for ap in approaches:
        entry = res.setdefault(ap.name, {"label": ap.label, "runs": []})
        if not ap.available:
            entry["error"] = ap.why_unavailable
            say(f"  {ap.name:<18} not available: {ap.why_unavailable}")
        else:
            live.append(ap)
    progress = Progress(repeats * len(live))
    for r in range(repeats):
        for ap in balanced(live, r):
            entry = res[ap.name]
            if "error" in entry:
                continue
            progress.step(f"{loop} round {r + 1}/{repeats}: {ap.name}")
            ap.setup()
            try:
                err = await b.probe(ap)
                if err is not None:
                    entry["error"] = err
                    say(f"  {ap.name:<18} FAILS: {err}")
                    continue
                run = await measure(b, ap, n, tput_s, loop)
            finally:
                ap.teardown()
            entry["runs"].append({"round": r, **run})
    for ap in live:
        ap.close()
    working = [ap for ap in live if "error" not in res[ap.name]]
    await paired_throughput(b, loop, working, paired_rounds(repeats))


async def paired_throughput(b: Bench, loop: str, approaches: list[Approach], rounds: int) -> None:
    """Throughput of ``approaches`` (those of :data:`PAIRED_APPROACHES` that work here) on 1
    and 8 streams, in ``rounds`` paired rounds of :data:`PAIRED_S` each (half that with
    ``--quick``), into ``b.paired[loop]``. Nothing if busy polling or all the others are
    missing: every ratio is to polling."""
    aps = [ap for ap in approaches if ap.name in PAIRED_APPROACHES]
    if len(aps) < 2 or "poll0" not in {ap.name for ap in aps}:
        return
    seconds = PAIRED_S / 2 if b.quick else PAIRED_S
    out = b.paired.setdefault(loop, {})
    progress = Progress(2 * rounds)
    for n in (1, 8):
        runs: dict[str, list[float]] = {ap.name: [] for ap in aps}
        for r in range(rounds):
            progress.step(f"{loop} paired round {r + 1}/{rounds}, {n} stream(s)")
            for ap in balanced(aps, r):
                ap.setup()
                try:
                    with gc_window(short=False):
                        runs[ap.name].append(await b.throughput(ap, n, seconds))
                finally:
                    ap.teardown()
        out[str(n)] = runs
        for name in runs:
            ratio = paired_ratios(runs, name) if name != "poll0" else None
            if ratio is not None:
                say(
                    f"  {loop} {n} stream(s), paired: {name} / poll0 per round: median "
                    f"{spread(ratio, '.2f')}"
                )


def paired_rounds(repeats: int) -> int:
    """The paired rounds of a run of ``repeats`` rounds: three times as many, as each is
    short."""
    return 3 * repeats


async def measure(
    b: Bench, ap: Approach, n: int, tput_s: float, loop: str = "asyncio"
) -> dict[str, Any]:
    """One run of every figure that applies to ``ap``. Each timed window is wrapped in
    ``gc_window``: a full collection before it, for every approach alike, and the collector
    off during the short ones (the latency samples, the stall test)."""
    run: dict[str, Any] = {}
    with gc_window(short=True):
        await b.latency(ap, KERNEL_NS, 20)  # warm-up
        run["latency_100us"] = await b.latency(ap, KERNEL_NS, n)
    with gc_window(short=True):
        run["latency_empty"] = await b.latency(ap, 0, n)
    with gc_window(short=False):
        run["awaits_per_s_1"] = await b.throughput(ap, 1, tput_s)
    with gc_window(short=False):
        run["awaits_per_s_8"] = await b.throughput(ap, 8, tput_s)
    if b.split and ap.name in SPLIT_APPROACHES:
        with gc_window(short=False):
            run["awaits_per_s_8_split"] = await b.throughput(ap, 8, tput_s, b.split)
    if ap.name not in ("sync", "torch_to_thread", "to_thread", "checkpoint"):
        with gc_window(short=False):
            run["cpu_parked"] = await b.cpu_parked(ap)
        run["cpu_parked_threads"] = b.cpu_threads.get(ap.name, {})
    if hasattr(ap, "enqueue") or ap.name == "sync":
        with gc_window(short=True):
            run["stall_us"] = await b.stall(ap)
    if ap.name in CROWD_APPROACHES:
        # The crowds run their own collections (see many()); the collector stays on.
        run["many"] = await b.many(ap, waiters=b.crowd)
        run["many_parked"] = await b.many(
            ap, waiters=b.crowd, kernel_ns=b.parked_kernel_ns, collect=True
        )
    say(
        f"  {(loop + ' ' if loop != 'asyncio' else '') + ap.name:<18} wake "
        f"{statistics.median(run['latency_100us']):.1f} us, "
        f"{run['awaits_per_s_1']:.0f} / {run['awaits_per_s_8']:.0f} awaits/s (1 / 8 streams)"
        + (f", parked CPU {run['cpu_parked']:.4f} cores" if "cpu_parked" in run else "")
    )
    return run
