"""Progress from inside a running kernel on the real GPU: a persistent kernel publishes values
into a host timeline's word with aiocudasem_publish() (a system-scope release store to mapped
host memory), and the host awaits each with ``HostTimeline.wait_value()`` while the kernel
still runs, through cuStreamWaitValue64 on a private stream; a trap midway fails the wait;
the header compiles under NVRTC through cuda.core, and docs/progress.md's Numba form works.
Wake latency and CPU are printed; only generous bounds are asserted."""

from __future__ import annotations

import ctypes
import time

import anyio
import numpy as np
import pytest

import aiocudasem as acs
from aiocudasem.testing import workloads
from tests.gpu.conftest import run_script

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MS = 1_000_000  # ns


async def test_a_kernel_publishes_1000_values_over_2_s_each_awaited_in_order(
    cuda: acs.Driver,
) -> None:
    """Each value is awaited in turn while the kernel runs: every wait returns with its value
    there, none is skipped, and the host burns no core meanwhile. The kernel stamps each
    publish with %globaltimer, whose origin the host's clock does not share: the latencies
    printed are each wake's delay over the quickest one's, plus that quickest one's own,
    unknown, delay."""
    count = 1000
    work = workloads(cuda)
    buf = work.alloc_pinned(8 * count)
    try:
        stamps = np.ctypeslib.as_array((ctypes.c_uint64 * count).from_address(buf))
        stamps[:] = 0
        woke = np.zeros(count, dtype=np.int64)
        seen = np.zeros(count, dtype=np.int64)
        late = np.zeros(count, dtype=bool)  # published before its wait began
        async with acs.create_host_timeline(driver=cuda) as t:
            async with acs.open_stream(driver=cuda) as s:
                await s.wait_complete()  # the loop's notifier exists before the timing
                cpu0, wall0 = time.process_time(), time.perf_counter()
                work.launch_progress(s, t.handle, count, 2000 * MS, stamps=buf)
                with anyio.fail_after(60):
                    for n in range(1, count + 1):
                        late[n - 1] = t.value >= n
                        await t.wait_value(n)
                        woke[n - 1] = time.perf_counter_ns()
                        seen[n - 1] = t.value
                    await s.wait_complete()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            published = stamps.astype(np.int64)
    finally:
        work.free_pinned(buf)
    values = np.arange(1, count + 1)
    assert (seen >= values).all()  # never before its value
    assert (np.diff(seen) >= 0).all()
    assert (published > 0).all() and (np.diff(published) >= 0).all()
    parked = ~late
    assert parked.sum() > count // 2  # most waits were parked when their value came
    delay = woke - published
    delay = (delay - delay[parked].min())[parked] / 1e3  # over the quickest wake, us
    lag = seen - values  # values the kernel was ahead by when the wait returned
    print(
        f"{count} values in {wall:.2f} s: {parked.sum()} waits parked; wake delay over the "
        f"quickest: median {np.median(delay):.1f} us, p99 {np.percentile(delay, 99):.1f} us, "
        f"max {delay.max():.1f} us; the kernel was ahead at {np.count_nonzero(lag)} wakes; "
        f"CPU {cpu:.3f} s ({100 * cpu / wall:.1f}% of a core)"
    )
    assert wall >= 1.9  # the kernel's pace
    assert np.percentile(delay, 50) < 20_000  # 20 ms: generous
    assert cpu < 0.25 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s"


_TRAP = """
import sys, time
import anyio
import aiocudasem as acs
from aiocudasem.testing import workloads

backend = sys.argv[1]
drv = acs.get_driver("cuda")
work = workloads(drv)  # its kernels load before the first wait


async def main() -> None:
    t = acs.create_host_timeline(driver=drv)
    s = acs.open_stream(driver=drv)
    work.launch_progress(s, t.handle, 1000, 2_000_000_000, trap_at=500)
    with anyio.fail_after(30):
        for n in range(1, 500):
            await t.wait_value(n)
    started = time.perf_counter()
    try:
        with anyio.fail_after(30):
            await t.wait_value(500)
    except acs.DeviceFaultError as exc:
        status = exc.status
    else:
        raise AssertionError("the wait for the value the kernel trapped at returned")
    took = time.perf_counter() - started
    assert t.value == 499, t.value
    try:
        with anyio.fail_after(30):
            await t.wait_value(600)
    except acs.DeviceFaultError:
        pass
    else:
        raise AssertionError("a wait after the fault returned")
    with anyio.fail_after(30):
        await t.aclose()  # a faulted context lets the release end
    try:
        await s.aclose()
    except acs.DeviceFaultError:
        pass
    print(f"trapped: status {status} after {took:.3f} s")


anyio.run(main, backend=backend)
"""


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_kernel_that_traps_midway_fails_the_wait(backend: str) -> None:
    """The values before the trap arrive, the wait for the next one raises DeviceFaultError
    in bounded time, never hangs, and the timeline is released. A trap poisons the context,
    so it runs in a process of its own."""
    proc = run_script(_TRAP, backend, timeout=120)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("trapped: status ")
    took = float(line.split()[-2])
    assert took < 10.0, line  # about 2 ms of kernel time, then the driver's report


_CUDA_CORE = """
import anyio
import numpy as np
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

import aiocudasem as acs
from aiocudasem.lowlevel import include_dir

SOURCE = r'''
#include <aiocudasem/progress.cuh>

extern "C" __global__ void every_block_publishes(unsigned long long *word, unsigned int rounds) {
    for (unsigned int r = 1; r <= rounds; ++r) {
        aiocudasem_publish_max(word, (unsigned long long)r * gridDim.x + blockIdx.x + 1);
        __nanosleep(1000);
    }
}
'''


async def main() -> None:
    dev = Device(0)
    dev.set_current()
    options = ProgramOptions(arch=f"sm_{dev.arch}", include_path=[include_dir()])
    program = Program(SOURCE, code_type="c++", options=options)
    kernel = program.compile("cubin").get_kernel("every_block_publishes")
    blocks, rounds = 64, 2000
    drv = acs.get_driver("cuda")
    async with acs.create_host_timeline(driver=drv) as t, acs.open_stream(driver=drv) as s:
        config = LaunchConfig(grid=blocks, block=1)
        launch(dev.create_stream(s), config, kernel, np.uint64(t.handle), np.uint32(rounds))
        seen = [0]
        with anyio.fail_after(30):
            for n in range(blocks, blocks * rounds + 1, blocks * 50):
                await t.wait_value(n)
                seen.append(t.value)
            await s.wait_complete()
        assert seen == sorted(seen), seen
        assert t.value == blocks * rounds + blocks, t.value
        print("published", t.value, "seen", len(seen))


anyio.run(main)
"""


def test_the_header_compiles_under_nvrtc_and_many_writers_never_move_it_back() -> None:
    """cuda.core's Program (NVRTC) compiles a kernel that includes the header from
    include_dir(); 64 blocks publish with aiocudasem_publish_max() at once, and the word only
    ever goes up, to the highest value published. A fresh process: its module loads with no
    stream of the context blocked (docs/lazy-loading.md)."""
    pytest.importorskip("cuda.core")
    proc = run_script(_CUDA_CORE, timeout=120)
    assert "published 128064 " in proc.stdout


_NUMBA = """
import anyio
import numpy as np
from numba import cuda

import aiocudasem as acs


@cuda.jit(device=True)
def publish(word, value):
    cuda.threadfence_system()  # the kernel's earlier writes first, for the whole system
    cuda.atomic.max(word, 0, value)  # never moves the value back


@cuda.jit
def solve(progress, data, steps):
    for step in range(1, steps + 1):
        data[cuda.threadIdx.x] = data[cuda.threadIdx.x] * 0.5 + step  # one step of the work
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            publish(progress, step)


def word_array(timeline):
    desc = {"shape": (1,), "typestr": "<i8", "data": (timeline.handle, False), "version": 3}
    return cuda.from_cuda_array_interface(desc, owner=timeline, sync=False)


async def main() -> None:
    steps = 100_000
    drv = acs.get_driver("cuda")
    data = cuda.to_device(np.zeros(128, dtype=np.float32))
    stream = cuda.stream()  # Numba's own: numba-cuda 0.30's external_stream() fails here
    async with acs.create_host_timeline(driver=drv) as t:
        solve[1, 128, stream](word_array(t), data, steps)
        seen = [0]
        with anyio.fail_after(60):
            for n in range(1, steps + 1, 997):
                await t.wait_value(n)
                seen.append(t.value)
            await t.wait_value(steps)
        stream.synchronize()  # the kernel has published its last step: it is ending
        assert seen == sorted(seen), seen
        assert t.value == steps, t.value
        print("published", t.value, "seen", len(seen))


anyio.run(main)
"""


def test_the_numba_form_of_the_docs_publishes_every_step() -> None:
    """docs/progress.md's Numba device function, as written there, in a kernel of 100,000
    steps: the host's waits return in order, and the word ends at the last step."""
    pytest.importorskip("numba.cuda")
    proc = run_script(_NUMBA, timeout=180)
    assert "published 100000 " in proc.stdout
