"""The test helpers' streams as typed, for ``mypy --strict`` (listed in ``[tool.mypy] files``;
never run, see ``docs_examples.py``): a kernel of the simulated device and the workloads take a
``Stream``, another object of the CUDA stream protocol, or a raw handle; the progress kernel
takes a host timeline's device address."""

from __future__ import annotations

import aiocudasem as acs
from aiocudasem.lowlevel import include_dir
from aiocudasem.testing import SimDriver, workloads


class Foreign:
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)


def streams(sim: SimDriver, stream: acs.Stream) -> None:
    sim.launch(stream, lambda: None)
    sim.launch(Foreign(), lambda: None)
    sim.launch(stream.handle, lambda: None)
    work = workloads(stream.driver)
    work.launch_spin(stream, 1_000)
    work.launch_spin(Foreign(), 1_000)
    work.launch_spin(stream.handle, 1_000)
    work.launch_check_frame(stream, 0, 1, 0, 0)
    work.launch_trap(stream)
    sim.launch("stream", lambda: None)  # type: ignore[arg-type]
    work.launch_spin(1.5, 1_000)  # type: ignore[arg-type]


async def progress(stream: acs.Stream, timeline: acs.HostTimeline) -> None:
    work = workloads(stream.driver)
    work.launch_progress(stream, timeline.handle, 1_000, 2_000_000_000)
    work.launch_progress(stream.handle, timeline.handle, 10, 1_000, start=5, trap_at=9, stamps=8)
    await timeline.wait_value(1_000)
    headers: str = include_dir()
    assert headers
    work.launch_progress(stream, timeline, 10, 1_000)  # type: ignore[arg-type]
