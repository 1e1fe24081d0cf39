import asyncio
import collections
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Final, Literal, TypeVar

from ._notifier._points import Point

_K = TypeVar("_K")

PROBE_EVERY: Final[int]
"""A stream whose waits are long still spins on one wait in this many."""

IDLE_SPIN: Final[float]
"""How long a spin on asyncio queries without yielding while the loop has nothing else ready, at
most, in seconds."""

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

class Tally:
    """A notifier's counts that :func:`wait_complete` keeps from C."""

    completed: int
    """Waits that found their work complete."""
    def __init__(self) -> None: ...

def wait_complete(
    stream: Any,
    query: Callable[[int], bool],
    handle: int,
    history: History,
    finder: Callable[[], Any],
    /,
) -> Coroutine[Any, Any, None]:
    """``Stream.wait_complete()`` on a stream other than the default ones. Finds the notifier
    with ``finder``, passes its checkpoint (asyncio: one bare yield; else
    ``notifier.checkpoint()``, delegated to), then :func:`settle`; idle: counts the completed
    wait in ``notifier._tally``; busy: delegates to ``stream._wait_busy(notifier, started)``. A
    failed first query raises through ``stream._query_failed(exc)``."""

def spin_recorded(
    driver: Any,
    device: int,
    pool: list[int],
    handle: int,
    history: History,
    started: float,
    ready: collections.deque[Any] | None,
    /,
) -> Awaitable[tuple[int, float] | None]:
    """On asyncio, once the first query of ``stream.wait_complete()`` (begun at ``started``)
    found the stream busy: take an event from ``pool`` (or ``driver.event_create(device)``) and
    record it on ``handle`` now, at the call. Awaited, it queries the event between bare yields
    while ``history``'s spin window lasts, and without yielding, for up to :data:`IDLE_SPIN`
    seconds at a time, while ``ready`` (the loop's ready callbacks; None: never) is empty.
    None once the event is done (``history`` learnt how long the wait took, the event went
    back to ``pool``); else ``(event, recorded)``: the event is the caller's to park on,
    recorded at that ``time.perf_counter()``. An error, ``throw()`` or ``close()`` gives the
    event back."""

def set_pool_limit(limit: int, /) -> None:
    """How many free events a pool keeps (``_EventPool._LIMIT``); the rest are destroyed."""

def wake_in_turn(futures: list[asyncio.Future[Any]], /) -> None:
    """For each future of the list that is not done yet, in order: take its done callbacks off,
    mark it done as ``set_result(None)`` does, and run those callbacks at once, each in its
    context: called by the loop, as a callback. A future whose callbacks cannot be read from
    ``_callbacks`` gets plain ``set_result(None)``. If anything raises, that future is woken
    as ``set_result()`` would wake it, the rest go to a new ``call_soon(wake_in_turn, rest)``,
    and the error propagates."""

def in_park_order(batches: list[dict[_K, int]], /) -> list[_K]:
    """The keys of a list of dicts ``{sleeper: place}``, in the order of their places (one dict
    is taken as it is: it is in that order already)."""
