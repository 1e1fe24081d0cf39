"""Calling into a running event loop from any thread, without waiting for it.

A release thread that finished, or a ``close()`` in another thread, must reach the tasks of a
loop it does not run in, and must never block on that loop (which may be waiting for it, or
gone). anyio's ``AsyncBackend.run_sync_soon()`` does exactly that, from anyio 4.16 on; before
it, the loop's own thread-safe call is used: ``call_soon_threadsafe()`` of an asyncio loop (the
native token of anyio's asyncio backend) and ``run_sync_soon()`` of a trio token.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio.lowlevel import EventLoopToken

__all__ = ("call_soon",)


def call_soon(token: EventLoopToken, fn: Callable[[], object]) -> bool:
    """Schedule ``fn()`` in the loop of ``token``; False if that loop has ended (or cannot be
    reached), in which case ``fn`` never runs. From any thread; never blocks."""
    try:
        soon = getattr(token.backend_class, "run_sync_soon", None)
        if soon is not None:
            soon(fn, (), token.native_token)
            return True
        native = token.native_token
        # The copy of the context gives ``fn`` the caller's context variables, as anyio does.
        run = contextvars.copy_context().run
        threadsafe = getattr(native, "call_soon_threadsafe", None)  # an asyncio loop
        if threadsafe is not None:
            threadsafe(run, fn)
            return True
        native.run_sync_soon(run, fn)  # type: ignore[attr-defined]  # a trio token
    except Exception:  # the loop has closed (RuntimeError, RunFinishedError) or is unknown
        return False
    return True
