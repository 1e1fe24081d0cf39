"""The wake strategy seam: how an armed point's completion reaches the loop's C queue.

This is the one place a new wake strategy goes. ``Notifier._launch`` arms a C node (``user_data``)
and hands it to the strategy that ``configure(wake=...)`` names, which enqueues the C host
function ``_notify.HOST_FN`` with it behind the point's event. A strategy must guarantee:

- the node's host function runs exactly once, after ``event`` has completed (later is allowed,
  earlier never), or never at all once the device has faulted (CUDA calls no host function after
  a context error; the watchdog covers that case);
- the host function is the C one: it runs on the driver's thread, so whatever runs there must
  not call CUDA or take the GIL (no Python callable on the driver's thread);
- ``launch`` raises only :class:`AiocudasemError` for a driver failure, and then nothing that
  could call the host function is enqueued: the caller disarms (frees) the node and fails the
  point;
- ``launch`` runs on the event loop's thread, once per host function: it must not block;
- ``prepare`` makes, when a :class:`~aiocudasem.Stream` is opened or adopted, whatever
  ``launch`` will need for that work stream and could block to make later (a CUDA stream: see
  ``_pools.side_streams.ensure``).

A new strategy gets a name in ``_tuning._WAKE_CHOICES`` and an entry in :data:`STRATEGIES`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final, Protocol

from .. import _notify, _release
from . import _tuning
from ._pools import host_wait_streams, side_streams

if TYPE_CHECKING:
    from .._driver import Driver

__all__ = (
    "STRATEGIES",
    "SideStreamHostFn",
    "WakeStrategy",
    "WorkStreamHostFn",
    "prepare_new_stream",
    "prepare_stream",
    "reserve_host_wait_stream",
)


class WakeStrategy(Protocol):
    """Enqueues the C host function so that it follows a point's event."""

    def prepare(self, driver: Driver, device: int, work_stream: int) -> None:
        """Called when a Stream is opened or adopted: make now what :meth:`launch` needs for
        ``work_stream`` and could not make later without risk of blocking."""
        ...

    def launch(
        self, driver: Driver, device: int, work_stream: int, event: int, user_data: int
    ) -> None:
        """Make the host function ``_notify.HOST_FN`` run with ``user_data`` once ``event``,
        recorded on ``work_stream`` of ``device``, has completed. Raises
        :class:`AiocudasemError` if the driver fails, having enqueued nothing that could call
        the host function."""
        ...


class SideStreamHostFn:
    """The default: the side stream that serves ``work_stream`` waits for the event, then runs
    the host function. The work stream never waits for a host function, and waits on different
    work streams never queue behind each other."""

    __slots__ = ()

    def prepare(self, driver: Driver, device: int, work_stream: int) -> None:
        side_streams.ensure(driver, device, work_stream)

    def launch(
        self, driver: Driver, device: int, work_stream: int, event: int, user_data: int
    ) -> None:
        def enqueue(side: int) -> None:
            driver.stream_wait_event(side, event)
            driver.launch_host_func(side, _notify.HOST_FN, user_data)

        side_streams.enqueue_on(driver, device, work_stream, enqueue)


class WorkStreamHostFn:
    """The host function launched on the work stream itself, with no side stream: the design
    the library rejected. Every host function stalls the work behind it until it returns (about
    41 us per await on an H200); it is kept so that the benchmark can show what the side stream
    buys. It fires after everything enqueued on the work stream before the launch, so possibly
    later than the event; the work stream must still exist (a user's ``Event`` awaited after its
    stream was closed fails with the driver's error), and the watchdog finds no host function of
    the point on a side stream to sleep behind, so a fault on a parked device is noticed within
    about one ``Tuning.watchdog`` period instead of at once."""

    __slots__ = ()

    def prepare(self, driver: Driver, device: int, work_stream: int) -> None:
        pass  # nothing to make

    def launch(
        self, driver: Driver, device: int, work_stream: int, event: int, user_data: int
    ) -> None:
        driver.launch_host_func(work_stream, _notify.HOST_FN, user_data)


def prepare_stream(driver: Driver, device: int, work_stream: int) -> None:
    """What the wake strategy in force makes for a work stream when a Stream is opened or
    adopted (the side stream, by default). A strategy chosen later with
    ``configure(wake=...)`` makes its part at the first wait that needs it."""
    STRATEGIES[_tuning.current.wake].prepare(driver, device, work_stream)


def prepare_new_stream(driver: Driver, device: int, stream: int) -> None:
    """:func:`prepare_stream` for a stream that the caller has just created and owns: if
    preparing fails, the stream is destroyed (quietly) before the error propagates."""
    try:
        prepare_stream(driver, device, stream)
    except BaseException:
        _release.release_quietly(
            functools.partial(driver.stream_destroy, stream), "a stream without its side stream"
        )
        raise


def reserve_host_wait_stream(driver: Driver, device: int) -> None:
    """``host_wait_streams.reserve()`` with what the wake strategy in force makes for a
    stream: one private stream for a host-side wait on ``device``, ready before the wait
    needs it (see ``_pools._HostWaitStreams.reserve``). Best effort."""
    host_wait_streams.reserve(driver, device, prepare_stream, prepare_new_stream)


#: The strategies by the name ``configure(wake=...)`` takes, one per ``_tuning._WAKE_CHOICES``.
STRATEGIES: Final[dict[str, WakeStrategy]] = {
    "side_stream": SideStreamHostFn(),
    "work_stream": WorkStreamHostFn(),
}
