#!/usr/bin/env python3
"""Probe what CUDA loads lazily, and which operations return while a stream waits on an external
semaphore that the host signals only after the operation returns.

Each experiment runs in a fresh process, because loading state is per process. The process
sets up a Vulkan timeline semaphore imported into CUDA and a stream S, enqueues on S a wait for
the semaphore (``BLOCKED``), runs the operation under test, and only when it returns signals the
semaphore from the host and synchronizes S. An operation that needs the context to go idle
therefore never returns. Such a hang cannot be interrupted (SIGINT waits for the driver call),
so the parent kills the child with SIGKILL after ``--timeout`` seconds without progress.

Children run with ``CUDA_MODULE_LOADING`` and ``CUDA_MODULE_DATA_LOADING`` removed unless the
experiment sets them, so "lazy" below is CUDA's default. The report goes to stdout and, when
``$OUT`` is set, to ``$OUT/lazy-probe.txt``. On the GPU machine:

    bash scripts/device.sh --smoke research/probe-lazy-loading.py

or, with the package importable, ``python3 research/probe-lazy-loading.py [--only a,b,g]``.
See docs/lazy-loading.md for what the results mean.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib.metadata
import os
import platform
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
_LOADING_VARS = ("CUDA_MODULE_LOADING", "CUDA_MODULE_DATA_LOADING")
_TIMELINE_FD = 9  # CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD

# =============================================================================================
# The child side: one experiment in this process.

_SRC = r"""
extern "C" __global__ void probe_mark(unsigned int *out, unsigned int k) { out[k] = k + 1u; }
extern "C" __global__ void probe_other(unsigned int *out, unsigned int k) { out[k] = k + 2u; }
"""


def _say(*words: object) -> None:
    # Flushed at once: after a SIGKILL the last marker says where the child hung.
    print(*words, flush=True)


class _Foreign:
    """A raw stream handle in cuda.core's stream protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


class Rig:
    """One child's setup: the library's CUDA driver, a Vulkan timeline semaphore imported into
    CUDA, stream S (the one that will wait), an idle stream T and pinned output words."""

    def __init__(self) -> None:
        from cuda.bindings._v2 import driver as d

        import aiocudasem as acs
        from aiocudasem.testing import workloads
        from aiocudasem.vulkan import VulkanDevice

        self.d: Any = d
        # The cuda driver; module_loading_mode() is its own, beside the Driver protocol.
        drv: Any = acs.get_driver("cuda")
        self.drv = drv
        _say("MODE", drv.module_loading_mode())
        self.vk = VulkanDevice.open(uuid=drv.device_uuid(0))  # the primary context is current
        self.vsem = self.vk.create_timeline_semaphore()
        self.sem = self.import_timeline(self.vsem)
        self.S = drv.stream_create(0, True, 0)
        self.T = drv.stream_create(0, True, 0)
        self.out = workloads(drv).alloc_pinned(4096)
        ctypes.memset(self.out, 0, 4096)
        self._core: dict[int, Any] = {}
        self._config: Any = None

    def import_timeline(self, vsem: Any) -> int:
        from aiocudasem.lowlevel import SemaphoreDesc

        return self.drv.import_semaphore(0, SemaphoreDesc(_TIMELINE_FD, fd=vsem.export_fd()))

    # ---- a user kernel, through cuda.core

    def compile(self) -> Any:
        """Compile the user kernels into a new cuda.core ObjectCode (a new CUlibrary on its
        first get_kernel)."""
        from cuda.core import Device, Program, ProgramOptions

        dev = Device(0)
        dev.set_current()
        cc = dev.compute_capability
        options = ProgramOptions(arch=f"sm_{cc.major}{cc.minor}")
        return Program(_SRC, code_type="c++", options=options).compile("cubin")

    def core(self, stream: int) -> Any:
        # Called before the wait, so that the operation under test is the launch alone.
        if stream not in self._core:
            from cuda.core import Device, LaunchConfig

            self._config = LaunchConfig(grid=1, block=1)
            self._core[stream] = Device(0).create_stream(_Foreign(stream))
        return self._core[stream]

    def launch(self, kernel: Any, stream: int, k: int) -> None:
        from cuda.core import launch

        launch(self.core(stream), self._config, kernel, self.out, np.uint32(k))

    def func(self, kernel: Any) -> int:
        """The kernel's CUfunction in the current context (cuKernelGetFunction)."""
        handle = kernel if isinstance(kernel, int) else int(kernel.handle)
        return int(self.d.kernel_get_function(handle))

    def state(self, func: int) -> str:
        value = int(self.d.func_is_loaded(func))
        return {0: "UNLOADED", 1: "LOADED"}.get(value, f"state {value}")

    def word(self, k: int) -> int:
        return int(ctypes.c_uint32.from_address(self.out + 4 * k).value)

    # ---- the experiment's skeleton

    def block(self, *more: int) -> None:
        from aiocudasem.lowlevel import SemOp

        for stream in (self.S, *more):
            self.drv.enqueue_semaphore_waits([SemOp(self.sem, value=1)], stream)
        _say("BLOCKED")

    def op(self, name: str, fn: Callable[[], object]) -> None:
        _say("OP", name)
        t0 = time.perf_counter()
        fn()
        _say("OPDONE", f"{time.perf_counter() - t0:.6f}", name)

    def release(self, *more: int) -> None:
        self.vsem.signal(1)
        _say("RELEASED")
        t0 = time.perf_counter()
        for stream in (self.S, *more):
            self.drv.stream_synchronize(stream)
        _say("COMPLETE", f"{time.perf_counter() - t0:.6f}")

    def note(self, *words: object) -> None:
        _say("NOTE", *words)


def _num_regs(kernel: Any) -> int:
    # A plain attribute query, cuda.core's nearest thing to "load it" (cuKernelGetAttribute);
    # a method taking the device in some cuda.core versions, a property in others.
    attr = kernel.attributes.num_regs
    return int(attr(0) if callable(attr) else attr)


@dataclass(frozen=True)
class Experiment:
    key: str
    title: str
    expect: str
    env: dict[str, str]
    run: Callable[[Rig, list[str]], None]


EXPERIMENTS: dict[str, Experiment] = {}


def experiment(
    key: str, title: str, expect: str, env: dict[str, str] | None = None
) -> Callable[[Callable[[Rig, list[str]], None]], Callable[[Rig, list[str]], None]]:
    def register(fn: Callable[[Rig, list[str]], None]) -> Callable[[Rig, list[str]], None]:
        EXPERIMENTS[key] = Experiment(key, title, expect, env or {}, fn)
        return fn

    return register


_EAGER = {"CUDA_MODULE_LOADING": "EAGER"}


@experiment("ctl", "control: S blocked, no operation, the host releases it", "completes")
def _control(rig: Rig, args: list[str]) -> None:
    rig.block()
    rig.op("nothing", lambda: None)
    rig.release()


def _first_launch_on_s(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of a user kernel on S", lambda: rig.launch(kernel, rig.S, 1))
    rig.release()
    rig.note("the kernel ran after the release:", rig.word(1) == 2)


experiment(
    "a",
    "(a) first launch of a freshly compiled user kernel on S, during the wait",
    "HANG (the hazard)",
)(_first_launch_on_s)
experiment("a-eager", "(a) again with CUDA_MODULE_LOADING=EAGER", "completes", env=_EAGER)(
    _first_launch_on_s
)
experiment(
    "i",
    "(i) (a) again with CUDA_MODULE_DATA_LOADING=EAGER, functions still lazy (the guide's "
    "second mitigation)",
    "? (guide: completes)",
    env={"CUDA_MODULE_DATA_LOADING": "EAGER"},
)(_first_launch_on_s)


@experiment(
    "a-idle",
    "(a') first launch of a user kernel on the idle stream T while S is blocked",
    "? (HANG means the hazard is context-wide, not per stream)",
)
def _first_launch_elsewhere(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    rig.core(rig.T)
    rig.block()
    rig.op("first launch of a user kernel on T", lambda: rig.launch(kernel, rig.T, 1))
    rig.release(rig.T)


@experiment("b", "(b) the same kernel launched once (and finished) before the wait", "completes")
def _launched_before(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    rig.launch(kernel, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    rig.core(rig.S)
    rig.block()
    rig.op("second launch, on S", lambda: rig.launch(kernel, rig.S, 2))
    rig.release()


@experiment(
    "b2",
    "(b2) only cuKernelGetFunction before the wait (module in the context, function not "
    "loaded), then the first launch on S",
    "? (tells whether module or function loading is what waits)",
)
def _function_handle_before(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    func = rig.func(kernel)
    rig.note("after cuKernelGetFunction:", rig.state(func))
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of a user kernel on S", lambda: rig.launch(kernel, rig.S, 1))
    rig.release()


@experiment(
    "b3",
    "(b3) cuKernelGetFunction + cuFuncLoad before the wait (the documented mitigation), "
    "then the first launch on S",
    "completes",
)
def _loaded_before(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    func = rig.func(kernel)
    rig.d.func_load(func)
    rig.note("after cuFuncLoad:", rig.state(func))
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of a user kernel on S", lambda: rig.launch(kernel, rig.S, 1))
    rig.release()


@experiment(
    "b4",
    "(b4) only a cuda.core attribute query (kernel.attributes.num_regs) before the wait, then "
    "the first launch on S",
    "? (completes if cuda.core's attribute query loads the kernel)",
)
def _attributes_before(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    rig.note("num_regs:", _num_regs(kernel))
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of a user kernel on S", lambda: rig.launch(kernel, rig.S, 1))
    rig.release()
    rig.note("after the launch:", rig.state(rig.func(kernel)))


@experiment(
    "c",
    "(c) library L1's kernel warm; the same source compiled again into a new library L2; "
    "first launch of L2's kernel on S",
    "? (HANG confirms: each new program is loaded lazily again)",
)
def _new_library(rig: Rig, args: list[str]) -> None:
    k1 = rig.compile().get_kernel("probe_mark")
    rig.launch(k1, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    k2 = rig.compile().get_kernel("probe_mark")
    rig.note("L2's kernel is a new CUkernel:", int(k1.handle) != int(k2.handle))
    rig.note("L2's kernel before its launch:", rig.state(rig.func(k2)))
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of L2's kernel on S", lambda: rig.launch(k2, rig.S, 2))
    rig.release()


@experiment(
    "c4",
    "(c4) as (c) without looking at L2 before the wait: L1's kernel warm and L1 alive; the same "
    "source compiled again into L2; first launch of L2's kernel on S",
    "? (HANG: every new library is loaded into the context again, however identical)",
)
def _new_library_untouched(rig: Rig, args: list[str]) -> None:
    k1 = rig.compile().get_kernel("probe_mark")
    rig.launch(k1, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    k2 = rig.compile().get_kernel("probe_mark")
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of L2's kernel on S", lambda: rig.launch(k2, rig.S, 2))
    rig.release()
    rig.note("k1 alive:", k1 is not None)


@experiment(
    "c5",
    "(c5) L1's kernel warm, then L1 dropped and collected (cuda.core unloads it); the same "
    "source compiled again; first launch on S",
    "? (HANG: a test that compiles its kernel per test reloads it after the last one's GC)",
)
def _library_dropped(rig: Rig, args: list[str]) -> None:
    import gc

    obj = rig.compile()
    k1 = obj.get_kernel("probe_mark")
    rig.launch(k1, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    del k1, obj
    gc.collect()
    k2 = rig.compile().get_kernel("probe_mark")
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of the recompiled kernel on S", lambda: rig.launch(k2, rig.S, 2))
    rig.release()


@experiment(
    "c3",
    "(c3) one kernel of a library warm; first launch of another kernel of the same library on S",
    "? (HANG means loading is per function, not per library)",
)
def _other_kernel_same_library(rig: Rig, args: list[str]) -> None:
    code = rig.compile()
    mark = code.get_kernel("probe_mark")
    rig.launch(mark, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    other = code.get_kernel("probe_other")
    rig.core(rig.S)
    rig.block()
    rig.op("first launch of probe_other on S", lambda: rig.launch(other, rig.S, 2))
    rig.release()


@experiment(
    "d",
    "(d) kernel warm from another thread; its first launch from the main thread on S",
    "completes (loading is per context, not per thread)",
)
def _other_thread(rig: Rig, args: list[str]) -> None:
    kernel = rig.compile().get_kernel("probe_mark")
    rig.core(rig.S)
    rig.core(rig.T)
    failure: list[BaseException] = []

    def warm() -> None:
        try:
            from cuda.core import Device

            Device(0).set_current()
            rig.launch(kernel, rig.T, 1)
            rig.drv.stream_synchronize(rig.T)
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=warm)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    rig.block()
    rig.op("first launch from the main thread, on S", lambda: rig.launch(kernel, rig.S, 2))
    rig.release()


@experiment("e", "(e) cuLibraryLoadData of a new cubin during the wait (no launch)", "?")
def _library_load(rig: Rig, args: list[str]) -> None:
    cubin = bytes(rig.compile().code)
    rig.block()
    rig.op("cuLibraryLoadData", lambda: rig.d.library_load_data(cubin, 0, 0, 0, 0, 0, 0))
    rig.release()


@experiment(
    "e2",
    "(e2) cuKernelGetFunction (the library's module into this context) during the wait",
    "?",
)
def _get_function(rig: Rig, args: list[str]) -> None:
    lib = rig.d.library_load_data(bytes(rig.compile().code), 0, 0, 0, 0, 0, 0)
    kernel = int(rig.d.library_get_kernel(lib, b"probe_mark"))
    rig.block()
    rig.op("cuKernelGetFunction", lambda: rig.func(kernel))
    rig.release()


@experiment(
    "e3",
    "(e3) cuFuncLoad during the wait (what the library's first workload launch does)",
    "?",
)
def _func_load(rig: Rig, args: list[str]) -> None:
    lib = rig.d.library_load_data(bytes(rig.compile().code), 0, 0, 0, 0, 0, 0)
    func = rig.func(int(rig.d.library_get_kernel(lib, b"probe_mark")))
    rig.note("before cuFuncLoad:", rig.state(func))
    rig.block()
    rig.op("cuFuncLoad", lambda: rig.d.func_load(func))
    rig.release()
    rig.note("after cuFuncLoad:", rig.state(func))


@experiment(
    "f", "(f) cuda.core Program compile + get_kernel during the wait (no launch)", "completes"
)
def _compile_during(rig: Rig, args: list[str]) -> None:
    rig.block()
    rig.op("Program.compile + get_kernel", lambda: rig.compile().get_kernel("probe_mark"))
    rig.release()


def _loading_states(rig: Rig, args: list[str]) -> None:
    code = rig.compile()
    mark = code.get_kernel("probe_mark")
    rig.note("probe_mark after get_kernel:", rig.state(rig.func(mark)))
    other = code.get_kernel("probe_other")
    _num_regs(other)
    rig.note("probe_other after a cuda.core attribute query:", rig.state(rig.func(other)))
    rig.launch(mark, rig.T, 1)
    rig.drv.stream_synchronize(rig.T)
    rig.note("probe_mark after its first launch:", rig.state(rig.func(mark)))
    rig.note("probe_other after probe_mark's launch:", rig.state(rig.func(other)))


experiment("h-lazy", "(h) cuFuncIsLoaded of user kernels, no wait, lazy", "UNLOADED until launch")(
    _loading_states
)
experiment(
    "h-eager", "(h) cuFuncIsLoaded of user kernels, no wait, eager", "LOADED throughout", _EAGER
)(_loading_states)


# The library's own operations, in the order a hand-off and its notification use them. Each
# one runs during the wait; after a hang the parent starts a new child with the ones after it.
G_OPS: dict[str, str] = {
    "stream_create": "stream_create",
    "event_create": "event_create",
    "event_record_S": "event_record on S, behind the wait",
    "event_record_idle": "event_record on an idle stream",
    "stream_wait_event": "stream_wait_event: a side stream waits for the event on S",
    "launch_host_func": "launch_host_func: the C notifier's host function on the side stream",
    "import_semaphore": "import_semaphore (a second Vulkan timeline)",
    "destroy_semaphore": "destroy_semaphore (an unused one)",
    "signal_semaphores": "signal_semaphores on S, behind the wait (a hand-off's exit)",
    "wait_semaphores": "wait_semaphores on the side stream",
    "queries": "stream_query and event_query",
    "check_health": "check_health (its first call creates an event)",
    "alloc_pinned": "alloc_pinned (cuMemAllocHost)",
    "free_pinned": "free_pinned (cuMemFreeHost)",
    "launch_spin": "launch_spin on S, first use: NVRTC, cuLibraryLoadData, cuFuncLoad, launch",
    "launch_check_frame": "launch_check_frame on S (its first use if launch_spin did not run)",
    "event_destroy": "event_destroy of the event recorded on S (pending)",
    "stream_destroy_idle": "stream_destroy of an idle stream",
    "stream_destroy_blocked": "stream_destroy of a second stream blocked on the same wait",
}


@experiment(
    "g",
    "(g) the library's own operations during the wait, in a fresh process",
    "all complete",
)
def _own_operations(rig: Rig, args: list[str]) -> None:
    from aiocudasem.lowlevel import HostNotifier, SemaphoreDesc, SemOp
    from aiocudasem.testing import SEEN, frame_words, workloads

    drv = rig.drv
    names = args or list(G_OPS)
    side, idle, blocked = (drv.stream_create(0, True, 0) for _ in range(3))
    ev_s, ev_idle = drv.event_create(0), drv.event_create(0)
    keep = [rig.vk.create_timeline_semaphore() for _ in range(3)]  # keep the Vulkan side alive
    fd2 = keep[0].export_fd()
    unused = rig.import_timeline(keep[1])
    sig = rig.import_timeline(keep[2])
    doomed = workloads(drv).alloc_pinned(4096)
    words = 64
    buf = workloads(drv).alloc_pinned(4 * words)
    ctypes.memmove(buf, frame_words(1, words).ctypes.data, 4 * words)
    notifier = HostNotifier()
    done: set[str] = set()

    def run(name: str) -> None:
        if name == "stream_create":
            drv.stream_create(0, True, 0)
        elif name == "event_create":
            drv.event_create(0)
        elif name == "event_record_S":
            drv.event_record(ev_s, rig.S)
        elif name == "event_record_idle":
            drv.event_record(ev_idle, side)
        elif name == "stream_wait_event":
            drv.stream_wait_event(side, ev_s)
        elif name == "launch_host_func":
            notifier.launch(drv, side, 7)
        elif name == "import_semaphore":
            drv.import_semaphore(0, SemaphoreDesc(_TIMELINE_FD, fd=fd2))
        elif name == "destroy_semaphore":
            drv.destroy_semaphore(unused)
        elif name == "signal_semaphores":
            drv.enqueue_semaphore_signals([SemOp(sig, value=1)], rig.S)
        elif name == "wait_semaphores":
            drv.enqueue_semaphore_waits([SemOp(sig, value=1)], side)
        elif name == "queries":
            drv.stream_query(rig.S)
            drv.event_query(ev_s)
        elif name == "check_health":
            drv.check_health(0)
        elif name == "alloc_pinned":
            workloads(drv).alloc_pinned(1 << 20)
        elif name == "free_pinned":
            workloads(drv).free_pinned(doomed)
        elif name == "launch_spin":
            workloads(drv).launch_spin(rig.S, 1_000)
        elif name == "launch_check_frame":
            workloads(drv).launch_check_frame(rig.S, buf, words, 1, rig.out)
        elif name == "event_destroy":
            drv.event_destroy(ev_s)
        elif name == "stream_destroy_idle":
            drv.stream_destroy(idle)
        elif name == "stream_destroy_blocked":
            drv.stream_destroy(blocked)
        else:
            raise ValueError(f"unknown operation {name!r}")
        done.add(name)

    rig.block(blocked)
    for name in names:
        rig.op(name, functools.partial(run, name))
    if "wait_semaphores" in done and "signal_semaphores" not in done:
        keep[2].signal(1)  # nobody else will release the side stream's wait
    rig.release(side, *(() if "stream_destroy_blocked" in done else (blocked,)))
    if "launch_host_func" in done:
        rig.note("the host function fired:", 7 in notifier.drain())
    if "launch_check_frame" in done:
        rig.note("the check kernel saw the frame:", rig.word(1) == SEEN)


def _child_main(key: str, ops: list[str]) -> None:
    rig = Rig()
    try:
        EXPERIMENTS[key].run(rig, ops)
    except BaseException:
        # A normal exit could wait for the blocked stream and pass for a hang: report, leave.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
    _say("CHILD-OK")


# =============================================================================================
# The parent side: run each experiment in a child, watch its progress, report.

_EOF = object()


@dataclass
class Outcome:
    key: str
    status: str = "completed"  # or HUNG, FAILED, SKIPPED
    wall: float = 0.0
    mode: str = "?"
    ops: list[tuple[str, str, float]] = field(default_factory=list)  # name, done/HUNG/FAILED, s
    hung_in: str = ""
    killed_after: float = 0.0
    complete_after_release: float | None = None
    notes: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    unkillable: bool = False


def _spawn(
    exp: Experiment, ops: list[str], op_timeout: float, setup_timeout: float
) -> tuple[Outcome, list[str]]:
    """Run one child; return its outcome and, for "g", the operations it did not reach."""
    env = {k: v for k, v in os.environ.items() if k not in _LOADING_VARS}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), PYTHONUNBUFFERED="1", **exp.env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", exp.key]
    if ops:
        cmd += ["--ops", ",".join(ops)]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    lines: queue.Queue[object] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(_EOF)

    threading.Thread(target=pump, daemon=True).start()
    res = Outcome(exp.key)
    seen: list[str] = []
    phase, since, limit = "setup", t0, setup_timeout
    started: set[str] = set()
    while True:
        try:
            item = lines.get(timeout=0.1)
        except queue.Empty:
            item = None
        if item is _EOF:
            break
        if isinstance(item, str):
            seen.append(item)
            tag, _, rest = item.partition(" ")
            if tag in ("BLOCKED", "OP", "OPDONE", "RELEASED", "COMPLETE", "NOTE"):
                since, limit = time.monotonic(), op_timeout
            if tag == "MODE":
                res.mode = rest
            elif tag == "BLOCKED":
                phase = "between the wait and the operation"
            elif tag == "OP":
                phase = rest
                started.add(rest)
            elif tag == "OPDONE":
                secs, _, name = rest.partition(" ")
                res.ops.append((name, "done", float(secs)))
                phase = f"after {name}"
            elif tag == "RELEASED":
                phase = "synchronizing S after the host's signal"
            elif tag == "COMPLETE":
                res.complete_after_release = float(rest)
                phase = "cleaning up"
            elif tag == "NOTE":
                res.notes.append(rest)
        if time.monotonic() - since > limit:
            res.status, res.hung_in, res.killed_after = "HUNG", phase, time.monotonic() - since
            proc.kill()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                res.unkillable = True  # stuck in the kernel driver; leave it and go on
            break
    if res.status != "HUNG":
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
        if rc != 0 or "CHILD-OK" not in seen:
            res.status = "FAILED"
            res.hung_in = phase
    if res.status != "completed" and phase in started:
        res.ops.append((phase, res.status, res.killed_after))
    res.wall = time.monotonic() - t0
    res.tail = [line for line in seen if line.partition(" ")[0] not in _MARKERS][-12:]
    left: list[str] = []
    if ops and res.status != "completed":
        reached = {name for name, _, _ in res.ops}
        left = [name for name in ops if name not in reached and name != phase]
    return res, left


_MARKERS = {"MODE", "BLOCKED", "OP", "OPDONE", "RELEASED", "COMPLETE", "NOTE", "CHILD-OK"}


def _describe(res: Outcome) -> list[str]:
    out: list[str] = []
    for name, status, secs in res.ops:
        label = G_OPS.get(name, name)
        if status == "HUNG":
            out.append(f"    op {label}: HUNG (killed after {secs:.0f} s)")
        elif status == "FAILED":
            out.append(f"    op {label}: FAILED (raised; see the output below)")
        else:
            out.append(f"    op {label}: completed in {secs:.6f} s")
    if res.complete_after_release is not None:
        out.append(f"    S completed {res.complete_after_release:.6f} s after the host's signal")
    for note in res.notes:
        out.append(f"    note: {note}")
    if res.status == "HUNG":
        out.append(
            f"    result: HUNG (killed after {res.killed_after:.0f} s) in: {res.hung_in}; "
            f"wall {res.wall:.1f} s"
        )
        if res.unkillable:
            out.append("    the child did not die within 30 s of SIGKILL; left behind")
    elif res.status == "FAILED":
        out.append(f"    result: FAILED at: {res.hung_in}; wall {res.wall:.1f} s; output:")
        out.extend(f"      | {line}" for line in res.tail)
    elif res.status == "completed":
        took = sum(secs for _, _, secs in res.ops)
        out.append(f"    result: completed in {took:.6f} s; wall {res.wall:.1f} s")
    return out


def _header() -> list[str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    lines = [
        "== aiocudasem lazy-loading probe",
        f"python {platform.python_version()}, cuda-bindings {version('cuda-bindings')}, "
        f"cuda-core {version('cuda-core')}",
    ]
    try:
        from cuda.bindings._v2 import driver as d

        import aiocudasem as acs

        drv: Any = acs.get_driver("cuda")
        v = int(d.driver_get_version())
        lines.append(f"GPU: {drv.device_name(0)}; CUDA driver API {v // 1000}.{v % 1000 // 10}")
        mode = drv.module_loading_mode()
    except Exception as exc:
        lines.append(f"the CUDA driver is not usable here: {exc}")
        mode = "?"
    setting = ", ".join(f"{k}={os.environ[k]}" for k in _LOADING_VARS if k in os.environ)
    lines.append(
        f"this process: {setting or 'no loading variables set'}; cuModuleGetLoadingMode: {mode}"
    )
    lines.append(
        "children: the loading variables are removed unless an experiment sets them; a child "
        "that makes no progress for the timeout is killed with SIGKILL"
    )
    return lines


# Most telling first, so that a tight budget loses the least.
ORDER = [
    "ctl",
    "a",
    "a-eager",
    "b",
    "b3",
    "g",
    "h-lazy",
    "h-eager",
    "c",
    "c3",
    "c4",
    "c5",
    "b2",
    "b4",
    "i",
    "e3",
    "e2",
    "e",
    "f",
    "a-idle",
    "d",
]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ops", default="", help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated experiment keys")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds without progress")
    parser.add_argument("--setup-timeout", type=float, default=60.0)
    parser.add_argument("--budget", type=float, default=270.0, help="total seconds")
    ns = parser.parse_args(argv)
    if ns.child:
        _child_main(ns.child, [op for op in ns.ops.split(",") if op])
        return 0

    keys = [k for k in ns.only.split(",") if k] or ORDER
    unknown = [k for k in keys if k not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiments {unknown}; known: {', '.join(ORDER)}")
    report: list[str] = []

    def emit(*lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            report.append(line)

    emit(*_header(), "")
    start = time.monotonic()
    summary: list[tuple[str, str, str]] = []
    for key in keys:
        exp = EXPERIMENTS[key]
        setting = ", ".join(f"{k}={v}" for k, v in exp.env.items()) or "loading variables unset"
        emit(f"[{key}] {exp.title}", f"    expected: {exp.expect}; {setting}")
        if time.monotonic() - start > ns.budget - ns.timeout - 10:
            emit("    result: SKIPPED (time budget)", "")
            summary.append((key, exp.expect, "SKIPPED"))
            continue
        pending = list(G_OPS) if key == "g" else []
        results: list[Outcome] = []
        why = ""
        while True:
            res, pending = _spawn(exp, pending, ns.timeout, ns.setup_timeout)
            results.append(res)
            emit(f"    mode: {res.mode}", *_describe(res))
            if not pending:
                break
            if not res.ops:  # no operation started: a new process would fail the same way
                why = "the process got no operation done"
                break
            if time.monotonic() - start > ns.budget - ns.timeout - 10:
                why = "time budget"
                break
            emit(f"    continuing in a fresh process with: {', '.join(pending)}")
        if pending:
            emit(f"    not run ({why}): {', '.join(pending)}")
        verdicts = sorted({r.status for r in results})
        bad = [f"{name} {st}" for r in results for name, st, _ in r.ops if st != "done"]
        verdict = "/".join(verdicts) + (f" ({', '.join(bad)})" if bad and key == "g" else "")
        summary.append((key, exp.expect, verdict))
        emit("")
    emit("== summary")
    width = max(len(expect) for _, expect, _ in summary)
    for key, expect, verdict in summary:
        emit(f"{key:>8}  expected {expect:<{width}}  got {verdict}")
    emit(f"total {time.monotonic() - start:.0f} s")
    if summary and summary[0][0] == "ctl" and summary[0][2] != "completed":
        emit("the control did not complete: the other results say nothing about lazy loading")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "lazy-probe.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(report) + "\n")
        print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
