"""Every read of another library's private state, in one place, each with its fallback.

The library reads a few private attributes of asyncio, trio and CPython for speed: each saves
a fraction of a microsecond on every await, which is most of what the library adds to an
await. Each one is read here and nowhere else in Python (the C of ``_hotpath`` reads one more,
a future's ``_callbacks``, and falls back to ``set_result()`` without it). Each falls back to a
public way when its shape is not the one expected, so a new Python or trio makes the library
slower, never wrong; ``tests/test_private_shapes.py`` fails, naming the attribute, when a
shape changes, and runs the library on every fallback.

- ``asyncio.events._get_running_loop``: the running loop, without an exception when there
  is none (every await's loop check). Fallback: ``asyncio.get_running_loop()`` in a ``try``.
- ``BaseEventLoop._ready``: whether the loop has other callbacks ready (a spin queries again
  without yielding while it has none). Fallback: none read, and the spin always yields.
- ``trio._core._run.GLOBAL_RUN_CONTEXT``: the run's ``Runner`` in this thread (the loop check
  without ``current_trio_token()``). Fallback: ``trio.lowlevel.current_trio_token()``.
- ``asyncio.coroutines._is_coroutine``: on Python 3.11, marking ``Stream.wait_complete`` as a
  coroutine function for ``asyncio.iscoroutinefunction()`` (3.12 has
  ``inspect.markcoroutinefunction``). Fallback: unmarked, and only that check answers False.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import threading
from collections.abc import Callable
from typing import Any

__all__ = (
    "mark_coroutine_function",
    "ready_queue_of",
    "running_loop_getter",
    "trio_run_context",
)


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


def trio_run_context(token: object) -> tuple[threading.local, object] | None:
    """trio's thread-local run context and the Runner of the run that ``token`` belongs to, if
    trio keeps them as the versions tested here do; else None, and the loop test calls
    ``current_trio_token()``. That function returns the token of ``GLOBAL_RUN_CONTEXT.runner``,
    one token per Runner, and raises where the context holds no runner: the test reads the
    context's ``runner`` in this thread instead (0.3 us less per await). Called in the run:
    the context must be a thread-local whose runner gives this very token."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT as context

        runner = context.__dict__["runner"]
        if isinstance(context, threading.local) and runner.current_trio_token() is token:
            return context, runner
    except Exception:  # another trio: its own test, the public one
        pass
    return None


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
