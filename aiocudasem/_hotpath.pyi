from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final, Literal

from ._notifier._points import Point

PROBE_EVERY: Final[int]
"""A stream whose waits are long still spins on one wait in this many."""

class LoopCheck:
    """Called with no arguments: True while the running loop is the token's."""

    def __init__(
        self,
        library: Literal["asyncio", "trio"],
        token: object,
        probe: Callable[[], object],
        local: Any,
        cvar: ContextVar[str | None] | None,
        *,
        context: Any = None,
        runner: object = None,
    ) -> None: ...
    def __call__(self) -> bool: ...

class Finder:
    """Called with no arguments: ``here.notifier`` if ``deferred`` is empty and the notifier
    serves the running loop, else ``slow()``."""

    def __init__(self, here: Any, deferred: Any, slow: Callable[[], Any]) -> None: ...
    def __call__(self) -> Any: ...

class History:
    """How long the recent waits on one stream took, and the newest point parked on it."""

    newest: Point | None
    recent: float
    unspun: int
    closed: bool
    def __init__(self) -> None: ...
    def learn(self, took: float, /) -> None: ...
    def spin_window(self) -> float: ...

def set_spin_limit(seconds: float, /) -> None: ...
def get_spin_limit() -> float: ...
def settle(
    stream: Any,
    query: Callable[[int], bool],
    handle: int,
    history: History,
    started: float,
    /,
) -> bool:
    """After the first checkpoint of ``stream.wait_complete()``, which began at ``started``:
    raise ``stream._closed_error()`` if ``history.closed``, else ``query(handle)``; for an
    idle stream, have ``history`` learn how long the wait took, and return True."""

def checkpoint_query(
    stream: Any,
    query: Callable[[int], bool],
    handle: int,
    history: History,
    /,
) -> Awaitable[float | None]:
    """On asyncio: one bare yield, then :func:`settle`. None if the stream was idle, else when
    the wait began (a ``time.perf_counter()``)."""
