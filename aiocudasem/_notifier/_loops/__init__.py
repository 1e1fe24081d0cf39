"""The event-loop seam: one adapter class per kind of loop, picked in one place.

Everything that the notifier does differently on asyncio and on trio goes through the adapter
of the loop it serves, made once per loop run by :func:`loop_adapter`:

============================  ========================================================
``checkpoint``                the loop's checkpoint, called directly
``bare_yield``                whether that checkpoint is asyncio's bare ``yield``, which
                              the C hot path yields itself
``ready_queue``               the loop's queue of ready callbacks, if it can be read: a
                              spin queries again without yielding while it is empty
``serves_running_loop()``     whether the running loop is still this one (every await)
``new_sleeper()``             the sleeper of one parked coroutine (see ``_sleepers``)
``wake_crowd(sleepers)``      wakes a crowd in order, skipping those done
``fd_watcher(fd, callback)``  watches the notifier's fd while nobody is parked
============================  ========================================================

- :class:`LoopAdapter`, the generic one, serves any loop that anyio runs, through anyio's
  public backend interface: an ``anyio.Event`` per sleeper, no fd watcher, and no running
  check (``current_notifier()`` then asks anyio each time).
- ``AsyncioLoop`` (``_asyncio``) serves every asyncio event loop, the standard library's and
  uvloop's: futures of the loop as sleepers, one callback of the loop per crowd, a reader as
  fd watcher. Only the standard library's loop has a ready queue to read.
- ``TrioLoop`` (``_trio``) serves trio: tasks parked with ``wait_task_rescheduled``, a system
  task as fd watcher.

Every read of another library's private state is in the adapter of that library, each with a
public fallback, and ``tests/test_private_shapes.py`` checks each against the installed
versions. A new loop gets a module here and a line in :func:`loop_adapter`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

try:  # trio needs it; asyncio alone does not (anyio then assumes asyncio, as here)
    import sniffio
except ImportError:  # pragma: no cover - the test environment has trio, hence sniffio
    sniffio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import collections

    from anyio.abc import AsyncBackend

__all__ = (
    "FdWatcher",
    "LoopAdapter",
    "Sleeper",
    "current_library",
    "loop_adapter",
    "never",
    "wake",
)


class Sleeper(Protocol):
    """How one parked coroutine sleeps: the subset of ``asyncio.Future`` that parking needs.

    ``done()``; ``set_result(None)``, only when not done; ``cancel()``, when its coroutine
    leaves without it (nobody wakes it after that); and ``await``. A sleeper is cancellable as
    the loop's own primitives are: a cancelled coroutine leaves its sleeper done, so that nobody
    hands the drainer role to a coroutine that is leaving."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def cancel(self) -> bool: ...

    def __await__(self) -> Generator[Any, Any, Any]: ...


class FdWatcher(Protocol):
    """Calls ``on_readable()`` on the loop whenever the fd is readable, between :meth:`start`
    and :meth:`stop` (both idempotent), or until ``on_readable()`` returns False. ``stop()``
    frees the fd at once, for a drainer to wait on."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def wake(sleepers: Iterable[Sleeper]) -> None:
    """Wake each sleeper that is not done yet (cancelled, or woken otherwise)."""
    for s in sleepers:
        if not s.done():
            s.set_result(None)


def never() -> bool:
    """The running check of a loop that cannot be recognised cheaply, or has ended."""
    return False


class LoopAdapter:
    """The generic adapter: any loop that anyio runs, through its public backend interface.

    The attributes below are plain attributes, read once by the notifier, so that an await
    pays for no method lookup here."""

    #: What the docs and ``statistics()`` call this kind of loop.
    name: ClassVar[str] = "generic"

    #: The loop's checkpoint: what anyio runs for ``anyio.lowlevel.checkpoint()``.
    checkpoint: Callable[[], Awaitable[Any]]
    #: Whether :attr:`checkpoint` is asyncio's bare ``yield`` (``_notify.yield_once``).
    bare_yield: bool = False
    #: The loop's queue of ready callbacks, where it can be read; else None.
    ready_queue: collections.deque[Any] | None = None
    #: Whether the running loop is this one, at least as strict as sniffio; a false answer
    #: only makes ``current_notifier()`` ask anyio.
    serves_running_loop: Callable[[], bool]
    #: Makes the sleeper of one parked coroutine.
    new_sleeper: Callable[[], Sleeper]
    #: Wakes the sleepers of a list, in its order, skipping those done.
    wake_crowd: Callable[[list[Sleeper]], None]

    def __init__(self, backend: type[AsyncBackend], token: object) -> None:
        self.checkpoint = backend.checkpoint
        self.serves_running_loop = never
        self.new_sleeper = lambda: _EventSleeper(backend)
        self.wake_crowd = wake

    def fd_watcher(self, fd: int, on_readable: Callable[[], bool]) -> FdWatcher | None:
        """A watcher of ``fd`` for this loop, or None where the loop offers none: there, a
        notification of an abandoned wait is collected when the loop next parks."""
        return None

    def forget(self) -> None:
        """The loop has ended: drop what refers to it, so that it is not kept alive."""
        self.serves_running_loop = never


class _EventSleeper:
    """The generic sleeper: an event of the backend, which adds two coroutine frames per
    wake-up."""

    __slots__ = ("_event",)

    def __init__(self, backend: type[AsyncBackend]) -> None:
        self._event = backend.create_event()

    def done(self) -> bool:
        return self._event.is_set()

    def set_result(self, result: None, /) -> None:
        self._event.set()

    def cancel(self) -> bool:
        self._event.set()
        return True

    def __await__(self) -> Generator[Any, Any, Any]:
        return self._event.wait().__await__()


def current_library() -> str | None:
    """The running async library's name, as anyio detects it (sniffio), or None."""
    if sniffio is None:
        return "asyncio"
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return None


def loop_adapter(backend: type[AsyncBackend], token: object) -> LoopAdapter:
    """The adapter for the running loop, whose anyio backend and native token (the asyncio
    loop, the trio token) are given. The one place where the kind of loop is decided."""
    library = current_library()
    if library == "asyncio":
        from ._asyncio import AsyncioLoop

        return AsyncioLoop(backend, token)
    if library == "trio" and sniffio is not None:
        from ._trio import TrioLoop

        return TrioLoop(backend, token)
    return LoopAdapter(backend, token)
