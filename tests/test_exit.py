"""No library thread keeps the interpreter from exiting.

Each scenario runs in a child process: what it tests is the interpreter's exit, after
``anyio.run()`` has returned, which a test inside pytest's own process cannot see.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time

import anyio
import pytest

from aiocudasem import CudaError, _release

#: A child's whole run, imports included; its exit itself must take a fraction of it.
_EXIT_WITHIN = 15.0

_SCENARIO = textwrap.dedent(
    """
    import sys, time
    import anyio
    import aiocudasem as acs
    from aiocudasem.testing import SimDriver, import_sim_semaphore

    async def main(what):
        sim = SimDriver()
        stream = acs.open_stream(driver=sim)
        if what == "semaphore":
            obj, _producer = import_sim_semaphore(sim)
        else:
            obj = acs.create_host_timeline(driver=sim)
        stream.enqueue_wait(acs.Wait(obj, 1))  # never satisfied: the release blocks for ever
        with anyio.move_on_after(0.1) as scope:
            await obj.aclose()
        assert scope.cancelled_caught, "aclose() returned while the device still waited"
        assert obj.closed
        stream.close()

    backend, what = sys.argv[1], sys.argv[2]
    options = {"use_uvloop": True} if backend == "asyncio+uvloop" else {}
    anyio.run(main, what, backend=backend.partition("+")[0], backend_options=options)
    print("returned", time.monotonic(), flush=True)
    """
)


@pytest.mark.parametrize("backend", ["asyncio", "asyncio+uvloop", "trio"])
@pytest.mark.parametrize("what", ["semaphore", "host_timeline"])
def test_a_cancelled_aclose_does_not_keep_the_process_alive(backend: str, what: str) -> None:
    """aclose() of an object that the device still waits on blocks in the driver; cancelling
    it leaves that release to a thread, which must not hold the interpreter at exit (an anyio
    worker thread did, on asyncio: it took a second Ctrl-C)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "dev", "-W", "error", "-c", _SCENARIO, backend, what],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=_EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the child did not exit within {_EXIT_WITHIN} s:\n{out}")
    exited = time.monotonic()
    assert proc.returncode == 0, out
    returned = [line for line in out.splitlines() if line.startswith("returned ")]
    assert returned, out
    # time.monotonic() is system-wide on Linux: the child's figure compares with ours.
    assert exited - float(returned[-1].split()[1]) < 3.0, out


@pytest.mark.anyio
async def test_a_cancelled_release_ends_in_a_daemon_thread_and_logs_its_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = threading.Event()
    ran: list[str] = []

    def destroy() -> None:
        gate.wait(10)
        ran.append("destroy")
        raise CudaError("the driver refused", status=999)

    caplog.set_level(logging.WARNING, logger="aiocudasem")
    before = set(threading.enumerate())
    with anyio.move_on_after(0.05) as scope:
        await _release.in_worker(destroy, "a test object", lambda: ran.append("abandoned"))
    assert scope.cancelled_caught
    threads = [t for t in set(threading.enumerate()) - before if t.name == "aiocudasem-release"]
    assert len(threads) == 1 and threads[0].daemon
    gate.set()
    threads[0].join(5)
    assert ran == ["destroy"]  # the thread released, and only it
    assert any("destroying a test object failed" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_a_release_failure_is_raised_to_the_waiting_aclose() -> None:
    def destroy() -> None:
        raise CudaError("the driver refused", status=999)

    with pytest.raises(CudaError, match="refused"):
        await _release.in_worker(destroy, "a test object", lambda: None)
