"""What every loop adapter shares: the ``Sleeper`` and ``FdWatcher`` protocols, and
:class:`LoopAdapter`, the generic adapter, which the others extend. The adapters import this
module, not the package, which picks one (``loop_adapter()``) and imports it when asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import anyio

from ..._errors import UnsupportedFeatureError

if TYPE_CHECKING:
    import collections

    from anyio.abc import AsyncBackend

__all__ = ("FdWatcher", "LoopAdapter", "Sleeper", "never", "wake")


class Sleeper(Protocol):
    """How one parked coroutine sleeps: the subset of ``asyncio.Future`` that parking needs.

    ``done()``; ``set_result(None)``, only when not done; ``cancel()``, when its coroutine
    leaves without it (nobody wakes it after that); and ``await``. A sleeper is cancellable as
    the loop's own primitives are: a cancelled coroutine leaves its sleeper done, so that nobody
    hands the drainer role to a coroutine that is leaving."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def cancel(self) -> bool: ...

    def __await__(self) -> Generator[Any, Any, Any]: ...


class FdWatcher(Protocol):
    """Calls ``on_readable()`` on the loop whenever the fd is readable, between :meth:`start`
    and :meth:`stop` (both idempotent), or until ``on_readable()`` returns False. ``stop()``
    frees the fd at once, for a drainer to wait on."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def wake(sleepers: Iterable[Sleeper]) -> None:
    """Wake each sleeper that is not done yet (cancelled, or woken otherwise)."""
    for s in sleepers:
        if not s.done():
            s.set_result(None)


def never() -> bool:
    """The running check of a loop that cannot be recognised cheaply, or has ended."""
    return False


class LoopAdapter:
    """The generic adapter: any loop that anyio runs, through its public backend interface.

    The attributes below are plain attributes, read once by the notifier, so that an await
    pays for no method lookup here."""

    #: What the docs and ``statistics()`` call this kind of loop.
    name: ClassVar[str] = "generic"

    #: The loop's checkpoint: what anyio runs for ``anyio.lowlevel.checkpoint()``.
    checkpoint: Callable[[], Awaitable[Any]]
    #: Whether :attr:`checkpoint` is asyncio's bare ``yield`` (``_notify.yield_once``).
    bare_yield: bool = False
    #: The loop's queue of ready callbacks, where it can be read; else None.
    ready_queue: collections.deque[Any] | None = None
    #: Whether the running loop is this one, at least as strict as sniffio; a false answer
    #: only makes ``current_notifier()`` ask anyio.
    serves_running_loop: Callable[[], bool]
    #: Makes the sleeper of one parked coroutine.
    new_sleeper: Callable[[], Sleeper]
    #: Wakes the sleepers of a list, in its order, skipping those done.
    wake_crowd: Callable[[list[Sleeper]], None]

    def __init__(self, backend: type[AsyncBackend], token: object) -> None:
        self.checkpoint = backend.checkpoint
        self.serves_running_loop = never
        self.new_sleeper = lambda: _EventSleeper(backend)
        self.wake_crowd = wake

    def fd_watcher(self, fd: int, on_readable: Callable[[], bool]) -> FdWatcher | None:
        """A watcher of ``fd`` for this loop, or None where the loop offers none: there, a
        notification of an abandoned wait is collected when the loop next parks."""
        return None

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        """Run ``fn()`` as a task of the library's own on this loop, which nobody awaits and
        which lives until it returns (a host stage, see ``_stages``). ``fn`` must catch what it
        raises: on trio an exception of such a task would end the whole run. Called in the loop.
        Raises :class:`~aiocudasem.UnsupportedFeatureError` where the loop offers no such task
        (anyio's public interface has none, only task groups that someone must await)."""
        raise UnsupportedFeatureError(
            f"{name} needs a task of the library's own on the event loop, which only asyncio "
            "(uvloop included) and trio offer: run it on one of them"
        )

    async def wait_all_tasks_blocked(self) -> None:
        """Return once every other task of the loop is blocked: anyio's
        ``wait_all_tasks_blocked()``, which is exact where the loop says so itself (trio)."""
        await anyio.wait_all_tasks_blocked()

    def forget(self) -> None:
        """The loop has ended: drop what refers to it, so that it is not kept alive."""
        self.serves_running_loop = never


class _EventSleeper:
    """The generic sleeper: an event of the backend, which adds two coroutine frames per
    wake-up."""

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
