import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextvars import ContextVar
from typing import Any, Final, Literal, TypeVar

from ._notifier._points import Point

_K = TypeVar("_K")

PROBE_EVERY: Final[int]
"""A stream whose waits are long still spins on one wait in this many."""

IDLE_SPIN: Final[float]
"""How long a spin queries without yielding while the loop has nothing else ready, at
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
    expect: float
    jitter: float
    lead: float
    spun: float
    closed: bool
    def __init__(self) -> None: ...
    def learn(self, took: float, /) -> None: ...
    def spin_window(self) -> float: ...

def set_spin_limit(seconds: float, /) -> None: ...
def get_spin_limit() -> float: ...

class Counters:
    """A notifier's counters that :func:`wait_complete` keeps (``Notifier.counters``)."""

    completed: int
    """Waits that returned normally, counted by :func:`wait_complete`."""
    spinning: int
    """Waits that spin now (``max_spinners``)."""
    def __init__(self) -> None: ...

class WaitState:
    """What the waits of one stream share, made with the stream: :func:`wait_complete` takes
    it. ``hooks`` has ``closed_error() -> BaseException``, ``query_failed(state, exc) ->
    NoReturn`` and ``drive(wait) -> Coroutine``; ``record_first``: a default stream, whose
    event is recorded before the checkpoint and queried instead of the stream."""

    @property
    def driver(self) -> Any: ...
    @property
    def device(self) -> int: ...
    @property
    def handle(self) -> int: ...
    @property
    def pool(self) -> list[int]: ...
    @property
    def history(self) -> History: ...
    @property
    def hooks(self) -> Any: ...
    @property
    def finder(self) -> Finder: ...
    @property
    def record_first(self) -> bool: ...
    def __init__(
        self,
        driver: Any,
        device: int,
        handle: int,
        pool: list[int],
        history: History,
        hooks: Any,
        finder: Callable[[], Any],
        *,
        record_first: bool = False,
    ) -> None: ...

class WaitComplete(Coroutine[Any, Any, None]):
    """One wait of :func:`wait_complete`: a coroutine, and the steps for a driver in Python."""

    def send(self, value: Any, /) -> Any: ...
    def throw(self, *args: Any) -> Any: ...
    def close(self) -> None: ...
    def __await__(self) -> Generator[Any]: ...
    def step(self) -> Awaitable[Any] | None:
        """The next step: an awaitable to await before the next call, or None once the wait is
        over. Call ``close()`` if awaiting it raises."""

def wait_complete(state: WaitState, /) -> Coroutine[Any, Any, None]:
    """``Stream.wait_complete()``: the wait algorithm on ``state``'s stream (see
    docs/architecture.md, "The hot path in C"). In a thread whose last wait ran on a loop whose
    checkpoint is a coroutine, ``state.hooks.drive(wait)``; else the :class:`WaitComplete`
    itself."""

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
