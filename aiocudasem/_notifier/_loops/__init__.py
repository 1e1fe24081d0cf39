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
``spawn(fn, name)``           runs a task of the library's own, which nobody awaits
``wait_all_tasks_blocked()``  anyio's, looking again each pass on asyncio
                              (``aiocudasem.testing``)
============================  ========================================================

- :class:`LoopAdapter`, the generic one, serves any loop that anyio runs, through anyio's
  public backend interface: an ``anyio.Event`` per sleeper, no fd watcher, no task of its
  own (host stages raise ``UnsupportedFeatureError``), and no running check
  (``current_notifier()`` then asks anyio each time).
- ``AsyncioLoop`` (``_asyncio``) serves every asyncio event loop, the standard library's and
  uvloop's: futures of the loop as sleepers, one callback of the loop per crowd, a reader as
  fd watcher, ``create_task()`` for a task of its own. Only the standard library's loop has a
  ready queue to read.
- ``TrioLoop`` (``_trio``) serves trio: tasks parked with ``wait_task_rescheduled``, a system
  task as fd watcher and as a task of its own.

Every read of another library's private state is in the adapter of that library, each with a
public fallback, and ``tests/test_private_shapes.py`` checks each against the installed
versions. A new loop gets a module here and a line in :func:`loop_adapter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:  # trio needs it; asyncio alone does not (anyio then assumes asyncio, as here)
    import sniffio
except ImportError:  # pragma: no cover - the test environment has trio, hence sniffio
    sniffio = None  # type: ignore[assignment]

from ._generic import FdWatcher, LoopAdapter, Sleeper, never, wake

if TYPE_CHECKING:
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
