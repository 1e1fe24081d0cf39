"""A Vulkan producer process killed with SIGKILL mid-stream, on the real GPU.

The producer opens the Vulkan device whose UUID is CUDA device 0's, creates two exportable
timeline semaphores, ``ready`` and ``done``, sends their fds with ``acs.send_semaphore``, and
hands frames over from the host (``ready.signal(n)``, then it waits for ``done >= n``). It is
killed while the consumer's stream waits in a hand-off for the next frame (behind a kernel of
the frame, as a real pipeline launches) and a task of the consumer is parked in
``ready.wait_value()``. The consumer is tests/test_producer_dies.py's, which the CPU suite runs
on the simulated device with host timelines: it sees end-of-file on the socket, calls
``ready.abandon()`` (a CUDA signal of the highest value it waited for), gets
``AbandonedError`` from the hand-off's exit and the parked wait, closes everything and exits
with 0 within 1 s of noticing. Its fds are back to its baseline before it exits (fds of the
driver's device nodes aside), and the device's free memory afterwards is printed beside the
figure before.

Run under the driver's default module loading mode: the consumer launches its kernel once
before the first hand-off, as docs/lazy-loading.md says to.
"""

from __future__ import annotations

import socket
import sys

import anyio
import anyio.abc
import pytest

import aiocudasem as acs
from aiocudasem.vulkan import VulkanDevice
from tests.test_producer_dies import BACKENDS, FRAMES, MiB, check_report, kill_mid_stream, say

pytestmark = pytest.mark.gpu

KIND = acs.HandleType.TIMELINE_SEMAPHORE_FD


@pytest.fixture(scope="module")
def uuid(cuda: acs.Driver) -> bytes:
    """CUDA device 0's UUID, once a Vulkan device with it can export semaphores."""
    uuid = cuda.device_uuid(0)
    try:
        VulkanDevice.open(uuid=uuid).close()
    except acs.VulkanUnavailableError as exc:
        pytest.skip(f"no Vulkan device that can export semaphores: {exc}")
    return uuid


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_killed_vulkan_producer_process_ends_the_consumer_cleanly(
    backend: str, uuid: bytes
) -> None:
    producer = [sys.executable, "-m", "tests.gpu.test_producer_dies_gpu", "producer", uuid.hex()]
    report = kill_mid_stream(producer, "cuda", "semaphore", backend, timeout=60)
    check_report(report, kill_bound=2.0)
    # The driver opens its device nodes once for the process and keeps them.
    driver_nodes = {
        fd: target for fd, target in report["new_fds"].items() if target.startswith("/dev/nvidia")
    }
    assert report["new_fds"] == driver_nodes, report["output"]
    before, after = report["gpu_free_before"], report["gpu_free_after"]
    if isinstance(before, int) and isinstance(after, int):
        # The killed producer's memory comes back too, so this bounds the consumer's leak by
        # the producer's footprint plus the slack, no tighter.
        free = f"{before / MiB:.0f} MiB before, {after / MiB:.0f} MiB after"
        say(f"cuda/{backend}: device memory free {free}")
        assert after >= before - 32 * MiB, (before, after)
    else:
        say(f"cuda/{backend}: device memory not measured ({before!r}, {after!r})")


async def produce(fd: int, uuid: bytes) -> None:
    with VulkanDevice.open(uuid=uuid) as vk:
        ready, done = vk.create_timeline_semaphore(), vk.create_timeline_semaphore()
        sock = await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd))
        async with sock:
            await acs.send_semaphore(sock, ready.export_fd(), KIND)
            await acs.send_semaphore(sock, done.export_fd(), KIND)
            for n in range(1, FRAMES + 1):
                ready.signal(n)
                # The consumer's stream signals it after frame n's kernel.
                if not done.block_until(n, timeout=30):
                    raise RuntimeError(f"the consumer did not hand frame {n} back within 30 s")
            say(f"handed over {FRAMES} frames")
            await anyio.sleep_forever()  # until killed


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role != "producer":
        sys.exit(f"unknown role {role!r}: the consumer is tests.test_producer_dies'")
    anyio.run(produce, int(args[1]), bytes.fromhex(args[0]))
