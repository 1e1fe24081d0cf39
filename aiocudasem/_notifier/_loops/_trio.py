"""The adapter of trio, as the main loop or as a guest on another.

- Checkpoint: ``trio.lowlevel.checkpoint()``, called directly.
- Sleeper: the task itself, parked with ``wait_task_rescheduled`` and woken with
  ``reschedule``; a cancelled task is aborted, and its sleeper marked done.
- Crowd wake: each sleeper in turn (``reschedule`` only appends to trio's run queue).
- Fd watcher: a system task that waits for the fd, in a cancel scope of its own.
- A task of the library's own: a system task (``spawn_system_task``), in a copy of the
  caller's context, as asyncio's ``create_task()`` gives; trio cancels it as the run ends.
- Running check: C (``_hotpath.LoopCheck``), on sniffio's thread-local name and trio's run
  context below.

The private state read here, with its public fallback (``tests/test_private_shapes.py``
names it when its shape changes):

- ``trio._core._run.GLOBAL_RUN_CONTEXT``: the run's ``Runner`` in this thread, which the
  running check reads instead of calling ``trio.lowlevel.current_trio_token()`` (0.3 us less
  per await). Fallback: ``current_trio_token()``.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

import sniffio
import trio
import trio.lowlevel

from ... import _hotpath
from ._generic import LoopAdapter, Sleeper

if TYPE_CHECKING:
    from anyio.abc import AsyncBackend

__all__ = ("TrioLoop", "trio_run_context")


class TrioLoop(LoopAdapter):
    """trio; ``token`` is the run's ``TrioToken``."""

    name = "trio"

    def __init__(self, backend: type[AsyncBackend], token: object) -> None:
        super().__init__(backend, token)
        self.checkpoint = trio.lowlevel.checkpoint
        self.new_sleeper = _TrioSleeper
        local, probe = sniffio.thread_local, trio.lowlevel.current_trio_token
        known = trio_run_context(token)
        if known is None:
            self.serves_running_loop = _hotpath.LoopCheck("trio", token, probe, local, None)
        else:
            context, runner = known
            self.serves_running_loop = _hotpath.LoopCheck(
                "trio", token, probe, local, None, context=context, runner=runner
            )

    def fd_watcher(self, fd: int, on_readable: Callable[[], bool]) -> _SystemTaskWatcher:
        return _SystemTaskWatcher(fd, on_readable)

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        trio.lowlevel.spawn_system_task(fn, name=name, context=contextvars.copy_context())


_wait, _reschedule = trio.lowlevel.wait_task_rescheduled, trio.lowlevel.reschedule
_current_task, _succeeded = trio.lowlevel.current_task, trio.lowlevel.Abort.SUCCEEDED


class _TrioSleeper:
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
            _reschedule(task)

    def cancel(self) -> bool:
        if self._done or self._task is not None:
            return False  # only ever called on a sleeper that nobody awaits
        self._done = True
        return True

    def _abort(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._task = None
        self._done = True  # cancelled, as a cancelled future is done
        return _succeeded

    def __await__(self) -> Generator[Any, Any, Any]:
        if self._done:  # as a done future: no wait (parking never awaits one)
            return _no_wait()
        self._task = _current_task()
        return _wait(self._abort).__await__()


def _no_wait() -> Generator[Any, Any, Any]:
    return
    yield  # a generator that ends at once


_sleeper_check: type[Sleeper] = _TrioSleeper  # the type checker's proof of the protocol


class _SystemTaskWatcher:
    """A system task that waits for the fd, in a cancel scope of its own. Cancelling the scope
    aborts its wait at once, so the fd is free for a drainer as soon as :meth:`stop` returns;
    at the end of the run trio cancels it with its other system tasks."""

    __slots__ = ("_fd", "_on_readable", "_scope")

    def __init__(self, fd: int, on_readable: Callable[[], bool]) -> None:
        self._fd = fd
        self._on_readable = on_readable
        self._scope: trio.CancelScope | None = None

    def start(self) -> None:
        if self._scope is None:
            self._scope = scope = trio.CancelScope()
            trio.lowlevel.spawn_system_task(self._run, scope, name="aiocudasem fd watcher")

    def stop(self) -> None:
        scope = self._scope
        if scope is not None:
            self._scope = None
            scope.cancel()

    async def _run(self, scope: trio.CancelScope) -> None:
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


# ---------------------------------------------------------------- trio's private state


def trio_run_context(token: object) -> tuple[threading.local, object] | None:
    """trio's thread-local run context and the Runner of the run that ``token`` belongs to, if
    trio keeps them as the versions tested here do; else None, and the running check calls
    ``current_trio_token()``. That function returns the token of ``GLOBAL_RUN_CONTEXT.runner``,
    one token per Runner, and raises where the context holds no runner: the check reads the
    context's ``runner`` in this thread instead. Called in the run: the context must be a
    thread-local whose runner gives this very token."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT as context

        runner = context.__dict__["runner"]
        if isinstance(context, threading.local) and runner.current_trio_token() is token:
            return context, runner
    except Exception:  # another trio: its own test, the public one
        pass
    return None
