"""CUDA lazy loading against hand-offs: a Vulkan/CUDA timeline ping-pong in fresh processes.

The ping-pong is the one of NVIDIA's simpleVulkan sample, pipelined one deep. Iteration ``k``:
the stream enters a hand-off (waits for ``ready >= 2k+1``), the host launches a kernel that
writes ``out[k]``, and only then submits the Vulkan batch that waits for ``done >= 2k`` and
signals ``ready = 2k+1``; the hand-off's exit signals ``done = 2k+2`` and awaits the stream.

Under lazy loading (CUDA's default since 12.2) a kernel is loaded at its first launch, and
loading may wait for the context to go idle, which it cannot while the stream waits for a
signal the host has not submitted yet (docs/lazy-loading.md). Loading state is per process, so
each case runs in a fresh one, with ``CUDA_MODULE_LOADING`` and ``CUDA_MODULE_DATA_LOADING``
removed from its environment unless the case sets them. A deadlocked ``cuLaunchKernel`` cannot
be interrupted, so each run has a timeout after which it is killed with SIGKILL.

Run directly, this file is that child: ``python tests/gpu/test_lazy_loading.py CASE BACKEND``.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 1000
WORDS = 64  # of the frame the library's own check kernel reads, per iteration
HAZARD_TIMEOUT_S = 20.0  # a healthy run takes a few seconds, most of it start-up
RUN_TIMEOUT_S = 60.0
_LOADING_VARS = ("CUDA_MODULE_LOADING", "CUDA_MODULE_DATA_LOADING")
BACKENDS = ["asyncio", "trio"]

# The cases the child knows. "user-*" launch a kernel compiled by the application with cuda.core;
# "own-*" use only the library's workload kernels.
USER_FIRST_INSIDE = "user-first-inside"  # the kernel's first launch is inside the first hand-off
USER_WARM_LAUNCH = "user-warm-launch"  # launched once before the first hand-off
USER_WARM_LOAD = "user-warm-load"  # cuKernelGetFunction + cuFuncLoad before the first hand-off
OWN_FIRST_INSIDE = "own-first-inside"  # launch_spin's and launch_check_frame's first use inside
OWN_WARM_SPIN = "own-warm-spin"  # launch_spin once before; launch_check_frame first used inside

# ---------------------------------------------------------------------------------------------
# The child: one ping-pong in this process.

_SRC = r"""
extern "C" __global__ void pingpong_mark(unsigned int *out, unsigned int k) {
    out[k] = k + 1u;
}
"""


def _say(*words: object) -> None:
    # Markers on stdout, flushed at once: after a kill they tell the parent where it hung.
    print(*words, flush=True)


class _UserKernel:
    """A kernel the application compiles itself, with cuda.core, as users do."""

    def __init__(self, stream: object) -> None:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions

        dev = Device(0)
        dev.set_current()
        cc = dev.compute_capability
        # cubin for this GPU: PTX from a newer NVRTC can be rejected by an older driver.
        options = ProgramOptions(arch=f"sm_{cc.major}{cc.minor}")
        code = Program(_SRC, code_type="c++", options=options).compile("cubin")
        self.kernel = code.get_kernel("pingpong_mark")
        self.stream = dev.create_stream(stream)  # wraps ours through __cuda_stream__
        self.config = LaunchConfig(grid=1, block=1)

    def launch(self, out: int, k: int) -> None:
        import numpy as np
        from cuda.core import launch

        launch(self.stream, self.config, self.kernel, out, np.uint32(k))

    def load(self) -> None:
        """docs/lazy-loading.md's recipe: load the kernel into the current context, no launch."""
        from cuda.bindings import driver as cu

        handle = self.kernel.handle
        if not isinstance(handle, cu.CUkernel):
            handle = cu.CUkernel(int(handle))
        err, func = cu.cuKernelGetFunction(handle)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        (err,) = cu.cuFuncLoad(func)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        err, state = cu.cuFuncIsLoaded(func)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        assert state == cu.CUfunctionLoadingState.CU_FUNCTION_LOADING_STATE_LOADED, state


def _child(case: str, backend: str) -> None:
    import anyio
    import numpy as np

    import aiocudasem as acs
    from aiocudasem._driver._cuda import CudaDriver
    from aiocudasem.testing import SEEN, frame_words, workloads
    from aiocudasem.vulkan import VulkanDevice, VulkanSemaphore

    drv = acs.get_driver("cuda")
    assert isinstance(drv, CudaDriver)
    _say("MODE", drv.module_loading_mode())
    n = ITERATIONS

    def import_timeline(vsem: VulkanSemaphore) -> acs.ExternalSemaphore:
        fd = vsem.export_fd()
        try:
            return acs.import_semaphore(acs.HandleType.TIMELINE_SEMAPHORE_FD, fd, driver=drv)
        except BaseException:
            os.close(fd)  # still ours after a failed import
            raise

    async def main() -> None:
        with VulkanDevice.open(uuid=drv.device_uuid(0)) as vk:
            vready, vdone = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
            ready, done = import_timeline(vready), import_timeline(vdone)
            out_ptr = workloads(drv).alloc_pinned(4 * (n + 1))
            src_ptr = workloads(drv).alloc_pinned(4 * WORDS)
            out = np.ctypeslib.as_array((ctypes.c_uint32 * (n + 1)).from_address(out_ptr))
            src = np.ctypeslib.as_array((ctypes.c_uint32 * WORDS).from_address(src_ptr))
            out[:] = 0
            async with ready, done, acs.open_stream(driver=drv) as stream:
                h = stream.handle
                body: Callable[[int], None]
                if case.startswith("user-"):
                    user = _UserKernel(stream)
                    if case == USER_WARM_LAUNCH:
                        user.launch(out_ptr, n)  # slot n: outside the checked range
                        await stream.wait_complete()
                    elif case == USER_WARM_LOAD:
                        user.load()

                    def body(k: int) -> None:
                        user.launch(out_ptr, k)

                else:
                    if case == OWN_WARM_SPIN:
                        workloads(drv).launch_spin(h, 1_000)
                        await stream.wait_complete()

                    def body(k: int) -> None:
                        src[:] = frame_words(k + 1, WORDS)  # the previous hand-off is over
                        if case == OWN_FIRST_INSIDE:
                            workloads(drv).launch_spin(h, 2_000)
                        workloads(drv).launch_check_frame(h, src_ptr, WORDS, k + 1, out_ptr)

                _say("SETUP-DONE")
                for k in range(n):
                    async with stream.handoff(
                        acs.Wait(ready, 2 * k + 1), acs.Signal(done, 2 * k + 2)
                    ):
                        if k == 0:
                            _say("FIRST-LAUNCH")
                        try:
                            body(k)
                        except BaseException:
                            # Cleaning up behind a stream that waits for a signal nobody
                            # will send could hang and hide this error: report and leave.
                            traceback.print_exc()
                            sys.stderr.flush()
                            _say("BODY-FAILED")
                            os._exit(3)
                        if k == 0:
                            _say("FIRST-LAUNCH-RETURNED")
                        # The producer moves only after the launch: Vulkan's queue waits
                        # for CUDA's previous signal (2k), then releases this wait (2k+1).
                        vdone.submit_wait(2 * k, then_signal=vready, then_signal_value=2 * k + 1)
                _say("LOOP-DONE")
            if case.startswith("user-"):
                bad = np.flatnonzero(out[:n] != np.arange(1, n + 1, dtype=np.uint32))
            else:
                bad = np.flatnonzero(out[1 : n + 1] != SEEN) + 1
            assert bad.size == 0, f"{bad.size} wrong slots, first {bad[0]}: {out[bad[0]]}"
            _say("ITERATIONS", n, "OK")
            workloads(drv).free_pinned(out_ptr)  # only now: cuMemFreeHost may wait for the device
            workloads(drv).free_pinned(src_ptr)
            vk.block_until_idle()
            vready.close()
            vdone.close()

    anyio.run(main, backend=backend)


# ---------------------------------------------------------------------------------------------
# The parent: run a case in a fresh process, with a timeout.


@dataclass
class _Run:
    case: str
    env: dict[str, str]
    hung: bool
    returncode: int | None
    out: str
    err: str
    seconds: float

    def said(self, marker: str) -> bool:
        return any(line.split()[:1] == [marker] for line in self.out.splitlines())

    @property
    def mode(self) -> str | None:
        for line in self.out.splitlines():
            if line.startswith("MODE "):
                return line.split()[1]
        return None

    @property
    def last_marker(self) -> str:
        lines = [line for line in self.out.splitlines() if line.strip()]
        return lines[-1] if lines else "(nothing)"

    def report(self) -> str:
        state = (
            f"HUNG, killed after {self.seconds:.1f} s"
            if self.hung
            else f"exit status {self.returncode} after {self.seconds:.1f} s"
        )
        return (
            f"case {self.case} with {self.env or 'no loading variables'}: {state}, last "
            f"marker {self.last_marker!r}\n--- stdout\n{self.out}\n--- stderr\n{self.err[-4000:]}"
        )


def _run(case: str, backend: str, timeout: float, env_set: dict[str, str] | None = None) -> _Run:
    env = {k: v for k, v in os.environ.items() if k not in _LOADING_VARS}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), PYTHONUNBUFFERED="1")
    env.update(env_set or {})
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), case, backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    hung = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        proc.kill()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"case {case}: the child (pid {proc.pid}) survived SIGKILL for 30 s")
    return _Run(case, env_set or {}, hung, proc.returncode, out, err, time.monotonic() - t0)


def _assert_completed(run: _Run, mode: str) -> None:
    assert not run.hung, f"the ping-pong deadlocked, at {run.last_marker!r}:\n{run.report()}"
    assert run.returncode == 0, run.report()
    assert run.mode == mode, run.report()
    assert run.said("ITERATIONS"), run.report()


@pytest.fixture(scope="module")
def ping_pong(cuda: Any) -> None:
    """Skip, saying why, where the child cannot run: no cuda.core or no matching Vulkan."""
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the user kernels are compiled and launched with cuda.core: {exc}")
    from aiocudasem import VulkanUnavailableError
    from aiocudasem.vulkan import VulkanDevice

    try:
        VulkanDevice.open(uuid=cuda.device_uuid(0)).close()
    except VulkanUnavailableError as exc:
        pytest.skip(f"no Vulkan device on CUDA device 0's GPU: {exc}")


def _backend(name: str) -> str:
    if name == "trio":
        pytest.importorskip("trio")
    return name


def test_first_launch_inside_a_handoff_deadlocks_under_lazy_loading(ping_pong: None) -> None:
    run = _run(USER_FIRST_INSIDE, "asyncio", HAZARD_TIMEOUT_S)
    if run.mode == "eager":
        pytest.xfail(f"this driver loads modules eagerly by default: no hazard\n{run.report()}")
    # Whether a lazy load waits for the context is the driver's choice ("might require context
    # synchronization", says CUDA's guide). A driver that does not wait is no fault of ours, so
    # failing the suite would be wrong; passing would claim a hang nobody saw. xfail shows up in
    # the summary with this reason, and docs/lazy-loading.md then needs its results revisited.
    if not run.hung:
        assert run.returncode == 0, f"the child failed instead of hanging:\n{run.report()}"
        pytest.xfail(
            "the lazy-loading hazard did not reproduce on this driver: a user kernel's first "
            f"launch inside a pending hand-off returned, and {ITERATIONS} iterations completed "
            f"in {run.seconds:.1f} s\n{run.report()}"
        )
    assert run.mode == "lazy", run.report()
    assert run.said("FIRST-LAUNCH") and not run.said("FIRST-LAUNCH-RETURNED"), (
        "expected the deadlock inside the kernel's first launch (cuLaunchKernel loading it "
        "lazily while the stream waits for a signal the host has not submitted), but the child "
        f"hung elsewhere:\n{run.report()}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_loading_completes_the_same_ping_pong(ping_pong: None, backend: str) -> None:
    run = _run(
        USER_FIRST_INSIDE, _backend(backend), RUN_TIMEOUT_S, {"CUDA_MODULE_LOADING": "EAGER"}
    )
    _assert_completed(run, "eager")


@pytest.mark.parametrize("case", [USER_WARM_LAUNCH, USER_WARM_LOAD])
@pytest.mark.parametrize("backend", BACKENDS)
def test_loading_the_kernel_before_the_first_handoff_avoids_the_deadlock(
    ping_pong: None, case: str, backend: str
) -> None:
    run = _run(case, _backend(backend), RUN_TIMEOUT_S)
    _assert_completed(run, "lazy")


@pytest.mark.parametrize("case", [OWN_WARM_SPIN, OWN_FIRST_INSIDE])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_librarys_own_kernels_never_load_lazily(
    ping_pong: None, case: str, backend: str
) -> None:
    # OWN_WARM_SPIN: check_frame was never launched before the first hand-off; only loading the
    # whole library at once keeps its first launch from loading. OWN_FIRST_INSIDE: the compile
    # and cuFuncLoad themselves run inside the first hand-off, behind the pending wait.
    run = _run(case, _backend(backend), RUN_TIMEOUT_S)
    _assert_completed(run, "lazy")


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
