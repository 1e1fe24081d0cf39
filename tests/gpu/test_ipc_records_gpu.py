"""Interprocess records on the real GPU: two processes, 10,000 records awaited by number, and
a producer killed mid-stream.

The producer and consumer are tests/test_ipc_records.py's, which the CPU suite runs on the
simulated device. Here each consumer is a process of its own too, so that a consumer that does
not end (a wait or a release held by the dead producer's record) fails its test by the time
limit instead of holding up the suite.

- In order: the producer records 10,000 records on one stream, each after a GPU write of its
  number to a payload timeline and at most 64 ahead of the consumer, which awaits each by
  number (``wait_record(n)``), checks that the payload is there and the producer no further
  than the window allows, and then has a stream of its own wait for the last record on the GPU
  (``enqueue_wait``). The producer's ``aclose()`` returns once the consumer has released its
  copy of the event.
- Killed: record 50's work is a 10 s kernel; the consumer enqueues a GPU wait for record 50,
  awaits it on the host, and the producer is killed (SIGKILL) 0.2 s later. The consumer sees
  the process end, abandons the records (the count goes to ``HostTimeline.MAX``), gets
  ``AbandonedError`` from the wait, and releases its stream, records and pages within 5 s:
  nothing of its own waits for the dead record's event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiocudasem as acs

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "test_ipc_records.py"
BACKENDS = ["asyncio", "trio"]


def _consume(kind: str, records: int, slow: int, backend: str, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["consume", "cuda", kind, str(records), str(slow), backend]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("backend", BACKENDS)
def test_10000_records_of_another_process_awaited_in_order(cuda: acs.Driver, backend: str) -> None:
    report = _consume("in_order", 10_000, 0, backend, timeout=180)
    assert (report["taken"], report["code"]) == (10_000, 0), report
    assert "recorded 10000" in report["output"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_producer_killed_mid_stream_is_abandoned_and_the_consumer_ends(
    cuda: acs.Driver, backend: str
) -> None:
    report = _consume("killed", 1000, 50, backend, timeout=60)
    assert report["taken"] == 49, report  # record 50's work never completed
    assert report["code"] == -9, report
    assert report["raised"] == "AbandonedError", report
    assert report["released_s"] < 5, report
