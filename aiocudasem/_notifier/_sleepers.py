"""How a parked coroutine sleeps and is woken: one sleeper per parked coroutine, native to its
loop.

A sleeper has the four methods of an asyncio future that parking needs: ``done()``,
``set_result(None)`` (only when not done), ``cancel()`` (when its coroutine leaves without it:
nobody wakes it after that) and ``await``. On asyncio (and uvloop) it *is* a future of the
loop: awaiting it resumes no Python frame. On trio it is the task itself, parked with
``wait_task_rescheduled`` and woken with ``reschedule``. Any other anyio backend gets an
``anyio.Event``, which adds an event of the loop and two coroutine frames per wake-up.

A crowd, the sleepers of the points that one batch of completions finished, is woken by
:func:`crowd_waker`'s function, in the order in which its coroutines parked. On asyncio,
``set_result()`` on each future would schedule each task's wake-up with the loop's
``call_soon()``: a handle of the loop per task (about 1-1.5 us on an H200 host), all of them
made before the first coroutine resumes, which the loop then runs. Instead one callback of the
loop, ``_hotpath.wake_in_turn()``, takes each future in turn: it marks it done, as
``set_result()`` does, with its callbacks taken off, and runs its task's wake-up at once; then
the next. The futures stay the loop's own, so that what looks at a task's future (anyio's
cancel scopes, ``Task.cancel()``) sees what it would with ``set_result()``: pending until its
turn, done after it. Elsewhere each sleeper is woken in turn.

Both are cancellable as the loop's own primitives are: a cancelled asyncio task cancels the
future it awaits (which is then done), and a cancelled trio task is aborted (and its sleeper
marked done), so that nobody hands a role to a coroutine that is leaving.

While no coroutine of a loop is parked, nobody waits on its fd, yet host functions of abandoned
waits may still be armed. :func:`fd_watcher` gives the loop a cheap watcher of the fd for that
time, so that their notifications are collected when they fire, whether or not the loop parks
again: on asyncio (and uvloop) a reader of the loop (``add_reader``), on trio a system task that
waits for the fd. It is started when the last parked coroutine leaves with host functions still
armed, and stopped, synchronously, before a drainer waits on the fd (one waiter per fd at a
time: asyncio's ``add_reader`` would replace the drainer's reader, trio refuses a second one)
and when the notifier closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._hotpath import wake_in_turn

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

__all__ = ("FdWatcher", "Sleeper", "crowd_waker", "fd_watcher", "sleeper_factory", "wake")


class Sleeper(Protocol):
    """What parking needs of a sleeper: the subset of ``asyncio.Future`` below."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def cancel(self) -> bool: ...

    def __await__(self) -> Generator[Any, Any, Any]: ...


def sleeper_factory(
    library: str | None, backend: type[AsyncBackend], token: object
) -> Callable[[], Sleeper]:
    """A function that makes one sleeper for the loop of ``token`` (anyio's
    ``current_token()``: the asyncio loop, or the trio token)."""
    if library == "asyncio":
        return token.create_future  # type: ignore[attr-defined,no-any-return]
    if library == "trio":
        return _trio_sleeper()
    return lambda: _EventSleeper(backend)


def crowd_waker(library: str | None, token: object) -> Callable[[list[Sleeper]], None]:
    """A function that wakes a crowd: the sleepers of a list, in its order, skipping those
    that are done (cancelled, or woken otherwise). On asyncio it schedules one callback of the
    loop, which marks each future done and runs its task's wake-up, in turn; elsewhere it wakes
    each in turn."""
    if library == "asyncio":
        call_soon = token.call_soon  # type: ignore[attr-defined]

        def wake_asyncio(sleepers: list[Sleeper]) -> None:
            if sleepers:
                call_soon(wake_in_turn, sleepers)

        return wake_asyncio
    return wake


def wake(sleepers: Iterable[Sleeper]) -> None:
    """Wake each sleeper that is not done yet (cancelled, or woken otherwise)."""
    for s in sleepers:
        if not s.done():
            s.set_result(None)


def _trio_sleeper() -> Callable[[], Sleeper]:
    import trio.lowlevel

    wait, reschedule = trio.lowlevel.wait_task_rescheduled, trio.lowlevel.reschedule
    current_task, succeeded = trio.lowlevel.current_task, trio.lowlevel.Abort.SUCCEEDED

    class TrioSleeper:
        """A trio task parked until :meth:`set_result`, like a task awaiting a future."""

        __slots__ = ("_done", "_task")

        def __init__(self) -> None:
            self._done = False
            self._task: trio.lowlevel.Task | None = None

        def done(self) -> bool:
            return self._done

        def set_result(self, result: None, /) -> None:
            self._done = True
            task = self._task
            if task is not None:
                self._task = None
                reschedule(task)

        def cancel(self) -> bool:
            if self._done or self._task is not None:
                return False  # only ever called on a sleeper that nobody awaits
            self._done = True
            return True

        def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
            self._task = None
            self._done = True  # cancelled, as a cancelled future is done
            return succeeded

        def __await__(self) -> Generator[Any, Any, Any]:
            if self._done:  # as a done future: no wait (parking never awaits one)
                return _no_wait()
            self._task = current_task()
            return wait(self._abort).__await__()

    return TrioSleeper


def _no_wait() -> Generator[Any, Any, Any]:
    return
    yield  # a generator that ends at once


class FdWatcher(Protocol):
    """Calls ``on_readable()`` on the loop whenever the fd is readable, between :meth:`start`
    and :meth:`stop` (both idempotent), or until ``on_readable()`` returns False."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def fd_watcher(
    library: str | None, token: object, fd: int, on_readable: Callable[[], bool]
) -> FdWatcher | None:
    """A watcher of ``fd`` for the loop of ``token``, or None where the loop offers none (any
    other anyio backend, or an asyncio loop without ``add_reader``): there, a notification of
    an abandoned wait is collected when the loop next parks."""
    if library == "asyncio":
        if not callable(getattr(token, "add_reader", None)):
            return None
        return _ReaderWatcher(token, fd, on_readable)
    if library == "trio":
        return _SystemTaskWatcher(fd, on_readable)
    return None


class _ReaderWatcher:
    """asyncio and uvloop: a reader of the loop, level-triggered, as long as it is wanted."""

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


class _SystemTaskWatcher:
    """trio: a system task that waits for the fd, in a cancel scope of its own. Cancelling
    the scope aborts its wait at once, so the fd is free for a drainer as soon as
    :meth:`stop` returns; at the end of the run trio cancels it with its other system tasks."""

    __slots__ = ("_fd", "_on_readable", "_scope")

    def __init__(self, fd: int, on_readable: Callable[[], bool]) -> None:
        self._fd = fd
        self._on_readable = on_readable
        self._scope: Any = None

    def start(self) -> None:
        if self._scope is None:
            import trio

            self._scope = scope = trio.CancelScope()
            trio.lowlevel.spawn_system_task(self._run, scope, name="aiocudasem fd watcher")

    def stop(self) -> None:
        scope = self._scope
        if scope is not None:
            self._scope = None
            scope.cancel()

    async def _run(self, scope: Any) -> None:
        import trio

        with scope:
            while True:
                # Stopped before it first ran: a drainer may wait on the fd already, and trio
                # would refuse this wait (an error that ends the whole run, from a system task).
                await trio.lowlevel.checkpoint_if_cancelled()
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                except trio.BusyResourceError:  # a drainer has the fd: it collects
                    break
                try:
                    keep = self._on_readable()
                except Exception:
                    # An exception would end the whole run (a system task's): report it as
                    # asyncio reports a reader's, and stop watching.
                    logging.getLogger("aiocudasem").exception("the notifier's fd watcher failed")
                    keep = False
                if not keep:
                    break
        if self._scope is scope:
            self._scope = None


class _EventSleeper:
    """Any other anyio backend: an ``anyio.Event``."""

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
