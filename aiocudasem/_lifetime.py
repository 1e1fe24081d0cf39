"""One lifetime for every object that must be released: streams, events, semaphores, host
timelines, and the low-level host notifier.

A class states once how it is destroyed, and the rest follows from that:

- ``_destroy``, a static method, destroys from a *state*: the arguments the class gives
  :meth:`Lifetime._track` (or :meth:`Owned._own`), which must not reference the object itself,
  since its finalizer keeps them;
- ``_destroy_blocks``: True if destroying may block on the device (a semaphore's destruction, a
  host timeline's wait for its page), False if it returns at once;
- ``_destroy_in_collector``: True if destroying is safe inside the garbage collector (it takes
  no lock that Python code can hold); False (the default) defers a collected object's release
  to the library's next use (see :mod:`._release`);
- ``_warn_when_collected``: False for objects that may be left to the collector on purpose
  (events).

From these, :class:`Lifetime` gives each of them the same shape:

- ``closed`` says whether the object is closed;
- :meth:`~Lifetime.close`, synchronous and idempotent, releases without waiting: inline, or,
  when destroying blocks, in a thread of its own;
- :meth:`~Lifetime.aclose` is always a checkpoint; when destroying blocks, it runs the destroy
  in a worker thread and waits for it without blocking the event loop (a WARNING after
  ``CLOSE_WARNING_S`` says what it waits for), and a cancelled ``aclose()`` leaves the release
  to that thread;
- ``async with`` closes with ``aclose()`` on a normal exit and with ``close()`` when an
  exception leaves the block, and refuses a closed object;
- a ``weakref.finalize`` safety net: a forgotten object is released (at the library's next use,
  or at once where that is safe in the collector), with a ``ResourceWarning`` that names it
  and, in development mode (``python -X dev``) or while ``tracemalloc`` traces, the line that
  created it.

:class:`Owned` adds a driver handle: no public constructor (the library's factories call
``_create``, which calls :meth:`Owned._own`), ``handle``, which raises
``anyio.ClosedResourceError`` once closed, and :meth:`Owned.detach`, which gives the handle up
without releasing it. :class:`OnDevice` adds the device and driver it belongs to.
"""

from __future__ import annotations

import sys
import tracemalloc
import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.lowlevel

from . import _release

if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Self

    from ._driver import Driver

__all__ = ("Lifetime", "OnDevice", "Owned")


class Lifetime:
    """Base of the objects that must be released: the lifetime that follows from ``_destroy``
    and ``_destroy_blocks`` (see the module)."""

    __slots__ = ("__weakref__", "_destroyer", "_finalizer", "_open")
    _finalizer: weakref.finalize[..., Any]
    #: ``_destroy`` bound to the object's state; None if there is nothing to release.
    _destroyer: Callable[[], None] | None
    #: False once closed (``_claim()``): the finalizer's ``alive`` as a plain attribute, which
    #: the hot path of an await reads several times more cheaply than the property. Only
    #: ``_claim()`` may end an object's life while it is referenced; the finalizer's own run at
    #: interpreter exit does not clear it, when nothing awaits any more.
    _open: bool

    #: What the error messages call it: "the stream is closed".
    _noun: ClassVar[str]
    #: Whether destroying may block (on the device): then ``close()`` destroys in a thread of
    #: its own, and ``aclose()`` in a worker thread that it waits for.
    _destroy_blocks: ClassVar[bool] = False
    #: Whether destroying is safe inside the garbage collector; if not, a collected object's
    #: release waits for the library's next use.
    _destroy_in_collector: ClassVar[bool] = False
    #: False for objects that may be left to the collector on purpose (events).
    _warn_when_collected: ClassVar[bool] = True

    #: Destroys from the state given to :meth:`_track`: a static method that each class
    #: states.
    _destroy: ClassVar[Callable[..., None]]

    def _track(self, *state: object) -> None:
        """Start the object's life: ``_destroy(*state)`` releases it. No state: nothing to
        release (a borrowed handle)."""
        cls = type(self)
        destroy = partial(cls._destroy, *state) if state else None
        self._destroyer = destroy
        self._open = True
        if cls._warn_when_collected:
            what = self._describe()
            if sys.flags.dev_mode or tracemalloc.is_tracing():
                what += f", created at {_caller()}"
        else:  # silent when collected (events, one per record()): no need to name it
            what = f"an aiocudasem.{cls.__name__}"
        self._finalizer = weakref.finalize(self, _collected, destroy, what, cls)

    def _describe(self) -> str:
        """How the ``ResourceWarning`` of a forgotten object and the logs name it."""
        return f"aiocudasem.{type(self).__name__}"

    @property
    def closed(self) -> bool:
        """True once the object is closed (by ``close()``, ``aclose()`` or ``detach()``)."""
        return not self._finalizer.alive

    def _closed_error(self) -> anyio.ClosedResourceError:
        return anyio.ClosedResourceError(f"the {self._noun} is closed")

    def _claim(self) -> bool:
        """Mark the object closed; True for the one caller that takes it over to release it
        (atomic: of concurrent callers, the others get False)."""
        self._open = False
        return self._finalizer.detach() is not None

    def _release(self) -> None:
        """Release now, without waiting: inline, or in a thread of its own if destroying
        blocks. Called once, by the caller that claimed the object."""
        destroy = self._destroyer
        if destroy is None:
            return
        if self._destroy_blocks:
            _release.in_thread(destroy, self._describe())
        else:
            _release.now(destroy)

    def close(self) -> None:
        """Release now, without waiting for the device. Idempotent; not a checkpoint."""
        if self._claim():
            self._release()

    async def aclose(self) -> None:
        """Release. Idempotent, and always a checkpoint. Where destroying blocks on the device,
        a worker thread destroys and this waits for it without blocking the event loop,
        logging a WARNING that says what it waits for after a few seconds; cancelling leaves
        the release to that thread."""
        if not self._destroy_blocks:
            self.close()
            await anyio.lowlevel.checkpoint()
            return
        destroy = self._destroyer
        if not self._claim() or destroy is None:
            await anyio.lowlevel.checkpoint()
            return
        what = self._describe()
        await _release.in_worker(destroy, what, partial(_release.in_thread, destroy, what))

    async def __aenter__(self) -> Self:
        if self.closed:
            raise self._closed_error()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            await self.aclose()
        else:
            self.close()


class Owned(Lifetime):
    """Base of the objects that own a driver handle."""

    __slots__ = ("_handle",)
    _handle: int

    #: The message of ``TypeError`` from the constructor: where to get one instead.
    _factory: ClassVar[str]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(self._factory)

    def _own(self, handle: int, *state: object) -> None:
        """Take ``handle``; ``_destroy(*state)`` releases it (see :meth:`Lifetime._track`)."""
        self._handle = handle
        self._track(*state)

    def _describe(self) -> str:
        return f"aiocudasem.{type(self).__name__} {self._handle:#x}"

    @property
    def handle(self) -> int:
        """The driver's handle. Raises ``anyio.ClosedResourceError`` once closed."""
        if not self._finalizer.alive:
            raise self._closed_error()
        return self._handle

    def detach(self) -> int:
        """Give the handle up without releasing it and return it: from now on it is the
        caller's to release, or to leak on purpose (a semaphore that a GPU wait that never
        completes still uses cannot be destroyed). Raises ``ClosedResourceError`` if closed."""
        if not self._claim():  # atomic: of this and a concurrent close(), one gets the handle
            raise self._closed_error()
        return self._handle


class OnDevice(Owned):
    """An owned object of one device of one driver."""

    __slots__ = ("_device", "_driver")
    _device: int
    _driver: Driver

    @property
    def device(self) -> int:
        """The ordinal of the device it belongs to."""
        return self._device

    @property
    def driver(self) -> Driver:
        """The driver it belongs to."""
        return self._driver


def _collected(destroy: Callable[[], None] | None, what: str, cls: type[Lifetime]) -> None:
    """The finalizer: release a collected object as its class says, and warn if it was
    forgotten. Takes no lock unless the class's destroy is safe in the collector."""
    if destroy is None:
        return
    if cls._destroy_blocks:
        destroy = partial(_release.in_thread, destroy, what)
    _release.collected(
        destroy, what, warn=cls._warn_when_collected, inline=cls._destroy_in_collector
    )


def _in_library(module: str) -> bool:
    # The command line is the library's user, not the library.
    return module.startswith("aiocudasem.") and not module.startswith("aiocudasem.cli")


def _caller() -> str:
    """The first frame outside the library: where the user created the object."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _in_library(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    if frame is None:
        return "an unknown place"
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
