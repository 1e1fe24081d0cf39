"""Helpers to test code that uses aiocudasem, on the simulated device and on the GPU.

``SimDriver`` is a full driver: pass it (or ``driver="sim"``) wherever a ``driver=`` argument
is taken. Its ``create_semaphore`` returns a :class:`SimProducer`, the host side of an external
semaphore (what Vulkan or a peer process would hold), and ``inject_fault`` puts a device into
a sticky error as a trapped kernel would.

:func:`workloads` gives work to put on streams, on the simulated device and on the CUDA driver
alike: pinned memory, a kernel that runs for a given time, one that checks a frame of data, one
that traps, and one that publishes its progress into a host timeline while it runs.
"""

from __future__ import annotations

import threading
from typing import Literal

from ._driver import get_driver
from ._driver._sim import SimDriver as SimDriver
from ._driver._sim import SimProducer as SimProducer
from ._handles import HandleType
from ._notifier import current_notifier
from ._public import publish as _publish
from ._semaphore import ExternalSemaphore, import_semaphore
from ._stream import Stream
from ._workloads import SEEN as SEEN
from ._workloads import Workloads as Workloads
from ._workloads import frame_word as frame_word
from ._workloads import frame_words as frame_words
from ._workloads import workloads as workloads

__all__ = (
    "SEEN",
    "SimDriver",
    "SimProducer",
    "Workloads",
    "frame_word",
    "frame_words",
    "hold",
    "import_sim_semaphore",
    "wait_all_tasks_blocked",
    "workloads",
)


def import_sim_semaphore(
    driver: SimDriver | Literal["sim"],
    *,
    timeline: bool = True,
    initial: int = 0,
    device: int = 0,
) -> tuple[ExternalSemaphore, SimProducer]:
    """Create a simulated external semaphore and import it into ``device``: returns the CUDA
    side and the producer's side. ``driver`` is a :class:`SimDriver` or ``"sim"``, the
    process-wide one of ``get_driver("sim")``.

    ``timeline=True`` makes a timeline semaphore starting at ``initial``, imported as
    ``TIMELINE_SEMAPHORE_FD``; ``timeline=False`` a binary one imported as ``OPAQUE_FD``,
    whose ``initial`` is 0 (unsignalled) or 1 (signalled). Raises ``TypeError`` for another
    driver, and what :meth:`SimDriver.create_semaphore` and :func:`import_semaphore`
    raise."""
    if driver == "sim":
        driver = get_driver("sim")
    if not isinstance(driver, SimDriver):
        raise TypeError(
            "import_sim_semaphore() needs the simulated driver: pass a SimDriver or 'sim', "
            f"not {driver!r}"
        )
    producer = driver.create_semaphore(timeline=timeline, initial=initial)
    kind = HandleType.TIMELINE_SEMAPHORE_FD if timeline else HandleType.OPAQUE_FD
    fd = producer.export_fd()
    try:
        sem = import_semaphore(kind, fd, device=device, driver=driver)
    except BaseException:
        import os

        os.close(fd)
        raise
    return sem, producer


def hold(stream: Stream) -> threading.Event:
    """Enqueue a simulated kernel that runs until the returned ``threading.Event`` is set.
    Lets a test decide exactly when a stream's work completes; work enqueued after it waits
    too. Raises ``TypeError`` for anything but a stream of a :class:`SimDriver`."""
    if not isinstance(stream, Stream):
        raise TypeError(f"hold() needs an aiocudasem.Stream, not {type(stream).__name__}")
    driver = stream.driver
    if not isinstance(driver, SimDriver):
        raise TypeError("hold() needs a stream of the simulated device")
    gate = threading.Event()

    def kernel() -> None:
        gate.wait()

    driver.launch(stream.handle, kernel)
    return gate


async def wait_all_tasks_blocked() -> None:
    """Return once every other task of the event loop is blocked: ``anyio.
    wait_all_tasks_blocked()``, without its wait on asyncio.

    anyio's asyncio backend looks again only 0.1 s after it finds a task that can run, and a
    wait of this library that has just started can run for up to ``Tuning.spin_limit`` (its
    checkpoint, then its spin) before it parks: right after a wait starts, anyio's call takes
    about 0.1 s on asyncio. This one looks again after each pass of the loop, so it returns
    within about the spin limit once the waits have parked. On trio it is anyio's, which trio
    answers exactly. Like anyio's, it returns when every other task is blocked on anything,
    not only on this library's waits, and never returns while a task keeps running."""
    await current_notifier().loop.wait_all_tasks_blocked()


_publish(__name__, globals(), __all__)
