"""One lifetime for every object that owns a driver handle: streams, events, semaphores.

:class:`Owned` gives each of them the same shape:

- no public constructor: the library's factories call ``_create``, which calls :meth:`_own`;
- ``handle`` raises ``anyio.ClosedResourceError`` once the object is closed, and ``closed``
  says so;
- :meth:`close`, synchronous and idempotent, releases without waiting for the device where
  that is safe; ``aclose()`` is a checkpoint, and waits where waiting means something (a
  stream's work, a semaphore's destruction);
- ``async with`` closes with ``aclose()`` on a normal exit and with ``close()`` when an
  exception leaves the block, and refuses a closed object;
- :meth:`detach` gives the handle up without releasing it;
- a ``weakref.finalize`` safety net: a forgotten object is released at the library's next use
  (see :mod:`._release`), with a ``ResourceWarning`` that names it and, in development mode
  (``python -X dev``) or while ``tracemalloc`` traces, the line that created it.

Each class says what its release does (:meth:`_release`) and what the collector's release does
(the ``collected`` callable given to :meth:`_own`).
"""

from __future__ import annotations

import sys
import tracemalloc
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.lowlevel

from . import _release

if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Self

    from ._driver import Driver

__all__ = ("OnDevice", "Owned")


class Owned:
    """Base of the objects that own a driver handle."""

    __slots__ = ("__weakref__", "_finalizer", "_handle", "_open")
    _finalizer: weakref.finalize[..., Any]
    _handle: int
    #: False once closed or detached (``_claim()``): the finalizer's ``alive`` as a plain
    #: attribute, which the hot path of an await reads several times more cheaply than the
    #: property. Only ``_claim()`` may end an object's life while it is referenced; the
    #: finalizer's own run at interpreter exit does not clear it, when nothing awaits any more.
    _open: bool

    #: The message of ``TypeError`` from the constructor: where to get one instead.
    _factory: ClassVar[str]
    #: What the error messages call it: "the stream is closed".
    _noun: ClassVar[str]
    #: False for objects that may be left to the collector on purpose (events).
    _warn_when_collected: ClassVar[bool] = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(self._factory)

    def _own(self, handle: int, collected: Callable[[], None] | None) -> None:
        """Take ``handle``. ``collected`` releases it if the object is collected unclosed; it
        runs at a safe point, not in the collector. None: nothing to release (borrowed)."""
        self._handle = handle
        self._open = True
        warn = self._warn_when_collected
        if warn:
            what = self._describe()
            if sys.flags.dev_mode or tracemalloc.is_tracing():
                what += f", created at {_caller()}"
        else:  # silent when collected (events, one per record()): no need to name it
            what = f"an aiocudasem.{type(self).__name__}"
        self._finalizer = weakref.finalize(self, _collected, collected, what, warn)

    def _describe(self) -> str:
        """How the ``ResourceWarning`` of a forgotten object names it."""
        return f"aiocudasem.{type(self).__name__} {self._handle:#x}"

    def _release(self) -> None:
        """Release the handle now, without waiting for the device."""
        raise NotImplementedError

    @property
    def handle(self) -> int:
        """The driver's handle. Raises ``anyio.ClosedResourceError`` once closed."""
        if not self._finalizer.alive:
            raise self._closed_error()
        return self._handle

    def _closed_error(self) -> anyio.ClosedResourceError:
        return anyio.ClosedResourceError(f"the {self._noun} is closed")

    @property
    def closed(self) -> bool:
        """True once the object is closed (by ``close()``, ``aclose()`` or ``detach()``)."""
        return not self._finalizer.alive

    def _claim(self) -> bool:
        """Mark the object closed; True for the one caller that takes the handle (atomic: of
        concurrent callers, the others get False)."""
        self._open = False
        return self._finalizer.detach() is not None

    def close(self) -> None:
        """Release now, without waiting for the device. Idempotent."""
        if self._claim():
            self._release()

    async def aclose(self) -> None:
        """Release; idempotent, and always a checkpoint."""
        self.close()
        await anyio.lowlevel.checkpoint()

    def detach(self) -> int:
        """Give the handle up without releasing it and return it: from now on it is the
        caller's to release, or to leak on purpose (a semaphore that a GPU wait that never
        completes still uses cannot be destroyed). Raises ``ClosedResourceError`` if closed."""
        if not self._claim():  # atomic: of this and a concurrent close(), one gets the handle
            raise self._closed_error()
        return self._handle

    async def __aenter__(self) -> Self:
        self.handle  # noqa: B018 - raises ClosedResourceError once closed
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


def _collected(release: Callable[[], None] | None, what: str, warn: bool) -> None:
    if release is None:
        return
    if warn:
        _release.release(release, what, collected=True)
    else:
        _release.defer(release, what)


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
