"""The adapter of asyncio's event loops: the standard library's, uvloop's and any other that
implements asyncio's loop interface.

- Checkpoint: the bare ``yield`` of ``asyncio.sleep(0)``, from C (``_notify.yield_once``), with
  no coroutine or generator for the garbage collector to track.
- Sleeper: a future of the loop. Awaiting it resumes no Python frame; a cancelled task cancels
  the future it awaits.
- Crowd wake: ``set_result()`` on each future would make a handle of the loop per task (about
  1-1.5 us each on an H200 host), all before the first coroutine resumes. Instead one callback
  of the loop, ``_hotpath.wake_in_turn()``, takes each future in turn: it marks it done, as
  ``set_result()`` does, with its callbacks taken off, and runs its task's wake-up at once. The
  futures stay the loop's own, so what looks at a task's future (anyio's cancel scopes,
  ``Task.cancel()``) sees what it would with ``set_result()``.
- Fd watcher: a reader of the loop (``add_reader``), level-triggered.
- A task of the library's own: ``create_task()``, with a strong reference kept until it is
  done (the loop keeps only weak ones).
- Running check: C (``_hotpath.LoopCheck``), on the running-loop getter below and sniffio's
  thread-local name and context variable, so that an asyncio loop counts only while no trio
  run (a guest one included) claims the thread.

The private state read here, each with its public fallback (a new Python makes the library
slower, never wrong; ``tests/test_private_shapes.py`` names the attribute when a shape
changes):

- ``asyncio.events._get_running_loop``: the running loop, without an exception when there is
  none. Fallback: ``asyncio.get_running_loop()`` in a ``try``.
- ``BaseEventLoop._ready``: whether the loop has other callbacks ready. Fallback: none read,
  and a spin always yields.
- ``asyncio.Future._callbacks``, read by ``_hotpath.wake_in_turn()`` in C. Fallback:
  ``set_result()``.
- ``asyncio.Task._fut_waiter``: the future a task awaits, which anyio's
  ``wait_all_tasks_blocked()`` reads too, for :meth:`AsyncioLoop.wait_all_tasks_blocked`.
  Fallback: anyio's, which looks again only 0.1 s after it finds a task runnable.
- ``asyncio.coroutines._is_coroutine``, on Python 3.11 only: marking ``Stream.wait_complete``
  as a coroutine function. Fallback: unmarked, and only ``asyncio.iscoroutinefunction()``
  answers False.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ... import _hotpath, _notify
from ._generic import LoopAdapter, Sleeper, never

try:  # see the package: asyncio alone does not need it
    import sniffio
except ImportError:  # pragma: no cover - the test environment has trio, hence sniffio
    sniffio = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

__all__ = (
    "AsyncioLoop",
    "has_fut_waiter",
    "mark_coroutine_function",
    "ready_queue_of",
    "running_loop_getter",
)


class AsyncioLoop(LoopAdapter):
    """Any asyncio event loop; ``token`` is the loop."""

    name = "asyncio"

    def __init__(self, backend: type[AsyncBackend], token: Any) -> None:
        self._loop = token
        #: The tasks of :meth:`spawn` not done yet: asyncio holds its tasks weakly.
        self._tasks: set[asyncio.Task[None]] = set()
        self.checkpoint = _notify.yield_once
        self.bare_yield = True
        self.ready_queue = ready_queue_of(token)
        self.new_sleeper = token.create_future
        call_soon = token.call_soon

        def wake_crowd(sleepers: list[Sleeper]) -> None:
            if sleepers:
                call_soon(_hotpath.wake_in_turn, sleepers)

        self.wake_crowd = wake_crowd
        get_loop = running_loop_getter()
        if sniffio is None:
            self.serves_running_loop = _hotpath.LoopCheck("asyncio", token, get_loop, None, None)
        else:
            local, cvar = sniffio.thread_local, sniffio.current_async_library_cvar
            self.serves_running_loop = _hotpath.LoopCheck("asyncio", token, get_loop, local, cvar)

    def fd_watcher(self, fd: int, on_readable: Callable[[], bool]) -> _ReaderWatcher | None:
        if not callable(getattr(self._loop, "add_reader", None)):
            return None
        return _ReaderWatcher(self._loop, fd, on_readable)

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        tasks = self._tasks
        task = self._loop.create_task(fn(), name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def wait_all_tasks_blocked(self) -> None:
        """As anyio's: return once every other task awaits a future not done yet. anyio's
        looks again 0.1 s after it finds a runnable task, and a wait that has just started is
        runnable through its spin (up to ``Tuning.spin_limit``) before it parks; this one looks
        again after each pass of the loop, yielding on a future of its own so that two of them
        see each other as blocked."""
        this = asyncio.current_task()
        if not has_fut_waiter(this):
            await super().wait_all_tasks_blocked()
            return
        loop = self._loop
        while True:
            passing = loop.create_future()
            loop.call_soon(_pass, passing)
            await passing
            for task in asyncio.all_tasks(loop):
                if task is this:
                    continue
                waiter = task._fut_waiter  # type: ignore[attr-defined]
                if waiter is None or waiter.done():
                    break
            else:
                return

    def forget(self) -> None:
        self.serves_running_loop = never
        self.ready_queue = None


def _pass(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def has_fut_waiter(task: object) -> bool:
    """Whether a task shows the future it awaits as asyncio's own tasks do."""
    return task is not None and hasattr(task, "_fut_waiter")


class _ReaderWatcher:
    """A reader of the loop, level-triggered, as long as it is wanted."""

    __slots__ = ("_fd", "_loop", "_on", "_on_readable")

    def __init__(self, loop: Any, fd: int, on_readable: Callable[[], bool]) -> None:
        self._loop = loop
        self._fd = fd
        self._on_readable = on_readable
        self._on = False

    def start(self) -> None:
        if not self._on:
            try:
                self._loop.add_reader(self._fd, self._ready)
            except (NotImplementedError, RuntimeError):  # no readers here, or a closed loop
                return
            self._on = True

    def stop(self) -> None:
        if self._on:
            self._on = False
            try:
                self._loop.remove_reader(self._fd)
            except (RuntimeError, ValueError, OSError):  # the loop is closed already
                pass

    def _ready(self) -> None:
        if not self._on_readable():
            self.stop()


# ---------------------------------------------------------------- asyncio's private state


def running_loop_getter() -> Callable[[], asyncio.AbstractEventLoop | None]:
    """A function that returns the running asyncio loop of this thread, or None."""
    get = getattr(asyncio.events, "_get_running_loop", None)
    if callable(get):
        return get  # type: ignore[no-any-return]
    return _running_loop_or_none


def _running_loop_or_none() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def ready_queue_of(loop: object) -> collections.deque[Any] | None:
    """The ready callbacks of an asyncio loop of the standard library's kind
    (``BaseEventLoop._ready``, the queue that each pass of the loop runs), or None (uvloop,
    another loop, another shape)."""
    ready = getattr(loop, "_ready", None)
    return ready if type(ready) is collections.deque else None


def mark_coroutine_function(fn: Callable[..., Any]) -> bool:
    """Mark ``fn``, a function that returns a coroutine, as a coroutine function for
    ``inspect`` and ``asyncio`` (and ``unittest.mock``). False if this Python offers no way."""
    mark = getattr(inspect, "markcoroutinefunction", None)
    if mark is not None:  # Python 3.12: inspect and asyncio both read its marker
        mark(fn)
        return True
    # Python 3.11: asyncio.iscoroutinefunction() reads this marker.
    import asyncio.coroutines

    marker = getattr(asyncio.coroutines, "_is_coroutine", None)
    if marker is None:
        return False
    fn._is_coroutine = marker  # type: ignore[attr-defined]
    return True
