from collections.abc import Callable
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
    def __init__(self) -> None: ...
    def learn(self, took: float, /) -> None: ...
    def spin_window(self) -> float: ...

def set_spin_limit(seconds: float, /) -> None: ...
def get_spin_limit() -> float: ...
