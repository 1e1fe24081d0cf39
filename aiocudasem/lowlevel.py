"""The low-level layer: what the device seam's calls take, the notifier's counters and its C core.

Most programs need only the top level (:mod:`aiocudasem`), which also holds the device seam
(:class:`~aiocudasem.Driver`, :func:`~aiocudasem.get_driver`, :data:`~aiocudasem.DRIVER_ENV`)
and the wait strategy's settings (:class:`~aiocudasem.Tuning`, :func:`~aiocudasem.configure`).
This module is for code that drives the library from underneath: a custom or wrapped driver,
benchmarks and monitoring.

- :class:`SemaphoreDesc` and :class:`SemOp` are what a driver's semaphore calls take, and
  :data:`HANDLE_TYPES` says what each handle type means (:class:`HandleInfo`).
- :func:`statistics` returns a frozen :class:`Statistics`: the running loop's notifier and
  the process-wide pools and threads, for monitoring and tests.
- :class:`HostNotifier` is the notifier's C core on its own, for code that waits for stream
  points its own way; :data:`HOST_FUNCTION` is the address of its host function.
- :func:`include_dir` is where the package's CUDA C headers are, for kernels that publish
  their progress into a host timeline (``aiocudasem/progress.cuh``).
"""

from __future__ import annotations

from pathlib import Path as _Path
from typing import TYPE_CHECKING

from ._checks import check_uint as _check_uint
from ._driver import SemaphoreDesc as SemaphoreDesc
from ._driver import SemOp as SemOp
from ._errors import AiocudasemError as _AiocudasemError
from ._handles import HANDLE_TYPES as HANDLE_TYPES
from ._handles import HandleInfo as HandleInfo
from ._lifetime import Lifetime as _Lifetime
from ._notifier import Statistics as Statistics
from ._notifier import statistics as statistics
from ._notify import HOST_FN as _HOST_FN
from ._notify import Notifier as _CNotifier
from ._public import publish as _publish

if TYPE_CHECKING:
    from types import TracebackType

    from ._driver import Driver

#: The address of the C host function that reports completions to the event loop (a
#: ``CUhostFn`` that never takes the GIL and never calls CUDA), for diagnostics.
HOST_FUNCTION: int = _HOST_FN


class HostNotifier(_Lifetime):
    """A completion queue with one wake-up fd, filled by the library's GIL-free C host
    function: the core of the notifier, with nothing around it.

    :meth:`launch` enqueues the host function on a stream with a ``token``; once everything
    enqueued on that stream before it has completed, the host function appends the token to
    the queue and makes :meth:`fileno` readable (one write per burst of completions).
    :meth:`drain` returns the tokens that came back, oldest first. Wait for the fd with
    ``anyio.wait_readable(notifier.fileno())``; one task at a time may wait on it.

    A host function delays the work behind it on its stream until it returns (about 40 us on
    an H200 with this one). The library's own waits avoid that with a side stream per work
    stream and do not use this class.

    Close it with :meth:`close`, ``aclose()``, ``with`` or ``async with``; that closes the fd
    at once and is safe while host functions are still outstanding (after a device fault they
    never run). A forgotten one is closed when collected, with a ``ResourceWarning``.
    """

    __slots__ = ("_c",)
    _noun = "host notifier"
    _destroy_in_collector = True  # closing takes no lock that Python code holds

    @staticmethod
    def _destroy(c: _CNotifier) -> None:
        c.close()

    def __init__(self) -> None:
        self._c = _CNotifier()
        self._track(self._c)

    def _describe(self) -> str:
        return f"aiocudasem.lowlevel.HostNotifier (fd {self._c.fileno()})"

    def launch(self, driver: Driver, stream: int, token: int) -> None:
        """Enqueue the host function on ``stream`` (a driver handle). ``token`` is an int in
        [0, 2**64). ``TypeError`` or ``ValueError`` for a bad argument, before anything is
        armed. If the driver refuses (an :class:`~aiocudasem.AiocudasemError`), nothing stays
        armed. Any other exception from the driver may come after it enqueued the host
        function, so its queue node is left armed (and leaks) rather than freed under it."""
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise TypeError(f"stream must be a driver handle (int), not {type(stream).__name__}")
        _check_uint("token", token, 1 << 64)
        if not callable(getattr(driver, "launch_host_func", None)):
            raise TypeError(
                f"driver must be an aiocudasem.Driver (with launch_host_func), not "
                f"{type(driver).__name__}"
            )
        user = self._c.arm(token)
        try:
            driver.launch_host_func(stream, _HOST_FN, user)
        except _AiocudasemError:
            self._c.disarm(user)
            raise

    def drain(self) -> list[int]:
        """Consume the wake-up and return the tokens that came back, oldest first."""
        return self._c.drain()

    def fileno(self) -> int:
        """The wake-up fd: readable while tokens wait to be drained."""
        return self._c.fileno()

    def __enter__(self) -> HostNotifier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def include_dir() -> str:
    """The directory of the package's CUDA C headers, to pass to nvcc or NVRTC as an include
    path (``-I``). ``#include <aiocudasem/progress.cuh>`` then gives a kernel
    ``aiocudasem_publish()`` and ``aiocudasem_publish_max()``, which publish its progress into
    a host timeline's word (``HostTimeline.handle``) while it runs, for the host to await with
    ``HostTimeline.wait_value()``: see docs/progress.md. The headers need neither the CUDA
    toolkit's other headers nor this package at run time."""
    return str(_Path(__file__).resolve().parent / "include")


__all__ = (
    "HOST_FUNCTION",
    "HostNotifier",
    "HANDLE_TYPES",
    "HandleInfo",
    "SemOp",
    "SemaphoreDesc",
    "Statistics",
    "include_dir",
    "statistics",
)

_publish(__name__, globals(), __all__)
