"""The device seam: a small synchronous Protocol on int handles.

Everything above this package is backend-free. A driver never awaits, never touches the event
loop, and raises only :mod:`aiocudasem._errors` exceptions (the CUDA driver's own exceptions are
translated inside ``_cuda``). Two drivers exist: ``cuda`` (the real one, the default) and ``sim``
(a simulated device for tests, CI and users' own test suites).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Literal, overload

from . import _protocol
from ._protocol import (
    DRIVER_ENV,
    Driver,
    SemaphoreDesc,
    SemOp,
    TrackedDriver,
    check_stream_handle,
    cuda_stream_handle,
    forked_error,
    track,
    unavailable,
)

if TYPE_CHECKING:
    from ._sim import SimDriver

__all__ = (
    "DRIVER_ENV",
    "Driver",
    "SemOp",
    "SemaphoreDesc",
    "TrackedDriver",
    "check_stream_handle",
    "cuda_stream_handle",
    "forked_error",
    "get_driver",
    "track",
    "unavailable",
)

_NAMES = ("cuda", "sim")
_lock = threading.Lock()
_drivers: dict[str, Driver] = {}  # name -> the process-wide driver of that name


def _after_fork_in_child() -> None:
    """The child gets a lock of its own and no process-wide drivers: the parent's refuse every
    call (see ``_protocol``), and ``get_driver("sim")`` makes a new one."""
    global _lock
    _lock = threading.Lock()
    _drivers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@overload
def get_driver(name: Literal["sim"]) -> SimDriver: ...
@overload
def get_driver(name: str | None = None) -> Driver: ...
def get_driver(name: str | None = None) -> Driver:
    """Return the process-wide driver called ``name`` (``"cuda"`` or ``"sim"``), created on
    first use; later calls return the same object. Thread-safe.

    ``None`` reads ``$AIOCUDASEM_DRIVER`` and falls back to ``"cuda"``: the simulated device is
    never picked silently. Raises :class:`DriverUnavailableError` if the CUDA driver cannot run
    here, with a message naming the ``sim`` option (a failed attempt is not remembered), or,
    for ``"cuda"``, in a child forked from a parent that had created it; ``ValueError`` for an
    unknown name, whether passed or read from ``$AIOCUDASEM_DRIVER`` (the message names the
    variable and its value); and ``TypeError`` for a name that is not a ``str``. In a forked
    child, ``get_driver("sim")`` returns a new simulated device, not the parent's.
    """
    if name is None:
        raw = os.environ.get(DRIVER_ENV, "")
        name = raw.strip() or "cuda"
        if name not in _NAMES:
            raise ValueError(
                f"{DRIVER_ENV}={raw!r} names no driver: set it to 'cuda' or 'sim', or unset it "
                "(then 'cuda' is used), or pass driver= explicitly"
            )
    if not isinstance(name, str):
        raise TypeError(f"driver name must be a str, not {type(name).__name__}")
    with _lock:
        drv = _drivers.get(name)
        if drv is not None:
            return drv
        if name == "cuda":
            if _protocol.cuda_before_fork:
                raise forked_error("cuda")
            from ._cuda import CudaDriver

            drv = CudaDriver()
        elif name == "sim":
            from ._sim import SimDriver

            drv = SimDriver()
        else:
            raise ValueError(f"unknown driver {name!r}: use 'cuda' or 'sim'")
        _drivers[name] = drv
        return drv
