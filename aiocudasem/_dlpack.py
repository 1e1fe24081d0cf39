"""Readiness of anything that speaks DLPack: :func:`ready`.

DLPack lets a consumer hand its stream to the producer: ``x.__dlpack__(stream=s)`` makes the
producer order its pending work on ``x`` before whatever comes next on ``s`` (it enqueues an
event wait there). So a private stream passed that way and then awaited tells when ``x`` is
ready, with no knowledge of the producer's streams: it reaches libraries that expose none. The
capsule that ``__dlpack__`` returns is dropped unconsumed, which frees the export.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Final

import anyio.lowlevel

from ._checks import resolve_driver
from ._driver import Driver
from ._notifier import wait_private_stream

__all__ = ("ready",)

# DLDeviceType codes (dlpack.h).
_CPU: Final = 1
_CUDA_DEVICES: Final = {2: "kDLCUDA", 3: "kDLCUDAHost", 13: "kDLCUDAManaged"}


async def ready(*arrays: object, driver: Driver | str | None = None) -> None:
    """Wait until the pending GPU work of every array of ``arrays`` has completed, for any
    object that implements DLPack (``__dlpack__`` and ``__dlpack_device__``) and honours its
    ``stream`` argument: a PyTorch tensor, a CuPy or JAX array.

    A private stream of the array's device is passed to ``array.__dlpack__(stream=...)``, which
    makes the producer order its pending work before that stream's next operation; then that
    stream is awaited as :meth:`Stream.wait_complete` would. What counts as pending is the
    producer's to say: PyTorch and CuPy order the work of their *current* stream on the
    *current* device, so call ``ready()`` where those are the tensor's. A CPU array
    (``kDLCPU``) is ready at once; for pinned host memory (``kDLCUDAHost``) the producer
    decides (PyTorch orders nothing for a CPU tensor: await the stream of a ``non_blocking``
    copy instead). PyTorch refuses to export a tensor that requires grad: pass ``x.detach()``.

    **Several arrays.** ``ready(a, b, c)`` passes one private stream to every array of one
    device and awaits it once: one event and one notification for the lot, whichever streams
    of their libraries the producers ordered their work on. Arrays of different devices get a
    private stream each, awaited together; the call returns once all have passed. Every array
    is checked before any is exported (its DLPack methods, its device, and a ``stream``
    parameter where the signature of its ``__dlpack__`` can be read), so a bad one exports
    nothing. ``ready(x)`` of one array is the same call. Where arrays of several devices fail,
    the first failure is raised, with the others (an exception group) as its ``__cause__``.

    cuda.core's buffers ignore the ``stream`` argument (their ``__dlpack__`` leaves stream
    order to the caller), so ``ready()`` refuses them: await the stream that wrote the buffer
    with :func:`wait_stream`.

    A ``__dlpack__`` that accepts the ``stream`` argument but ignores it cannot be told from
    one whose producer has nothing pending, which rightly enqueues nothing: CUDA cannot say
    whether anything was enqueued on a stream. ``ready()`` then returns at once, whatever the
    producer's work. Only a ``__dlpack__`` without a ``stream`` parameter is refused, and
    cuda.core's buffers, which ignore it (see above).

    ``driver`` is as for :func:`open_stream` (by default the real CUDA driver). A checkpoint;
    cancelling abandons the observation only (the private stream is reused once the
    producer's work has passed it). Raises ``TypeError`` for a call without arrays, an object
    without DLPack, or whose ``__dlpack__`` takes no ``stream``, or for one of cuda.core;
    ``ValueError`` for a device that is neither the CPU nor CUDA, or for a device ordinal that
    does not exist; and what a producer's ``__dlpack__`` raises (the arrays exported before it
    stay ordered before the private stream, which is not awaited).
    """
    if not arrays:
        raise TypeError("ready() needs at least one array: ready(x), or ready(*arrays) for several")
    exports: dict[int, list[tuple[str, Callable[..., object]]]] = {}  # ordinal -> arrays
    drv: Driver | None = None
    for array in arrays:
        name, export, kind, ordinal = _checked(array)
        if kind == _CPU:
            continue
        if drv is None:
            drv = resolve_driver(driver)
        count = drv.device_count()
        if not 0 <= ordinal < count:
            raise ValueError(
                f"{name} is on {_CUDA_DEVICES[kind]} device {ordinal}, which does not exist "
                f"here: {count} device(s)"
            )
        exports.setdefault(ordinal, []).append((name, export))
    if drv is None:  # CPU arrays only
        await anyio.lowlevel.checkpoint()
        return
    if len(exports) == 1:
        [(ordinal, these)] = exports.items()
        await _ready_on(drv, ordinal, these)
        return
    try:
        async with anyio.create_task_group() as tg:
            for ordinal, these in exports.items():
                tg.start_soon(_ready_on, drv, ordinal, these)
    except BaseExceptionGroup as group:
        # One device's failure (a fault, a producer's error) cancels the others' waits: raise
        # it as itself, as the call of one device would.
        # With several, the first, and the group as its cause: the same type on every loop
        # (trio cancels the others' waits before they fail; asyncio may let them fail too).
        raise group.exceptions[0] from (group if len(group.exceptions) > 1 else None)


def _checked(array: object) -> tuple[str, Callable[..., object], int, int]:
    """``array``'s type name, ``__dlpack__``, and device type and ordinal, checked."""
    name = type(array).__name__
    device_of = getattr(array, "__dlpack_device__", None)
    export = getattr(array, "__dlpack__", None)
    if device_of is None or export is None:
        raise TypeError(
            f"{name} does not implement DLPack (__dlpack__ and __dlpack_device__): await "
            "aiocudasem.wait_stream() or wait_event() instead"
        )
    if type(array).__module__.startswith("cuda.core"):
        raise TypeError(
            f"{name} of cuda.core ignores the stream passed to __dlpack__, so it cannot say "
            "when its data is ready: await the stream that wrote it with "
            "aiocudasem.wait_stream()"
        )
    kind, ordinal = _device(device_of(), name)
    if kind != _CPU and _takes_stream(type(array), export) is False:
        raise _no_stream(name)
    return name, export, kind, ordinal


#: What :func:`_takes_stream` found, by the array's type: reading a signature costs 10 us for
#: a method written in Python and 100 us for one in C, more than a whole export.
_stream_params: weakref.WeakKeyDictionary[type, bool | None] = weakref.WeakKeyDictionary()


def _takes_stream(kind: type, export: Callable[..., object]) -> bool | None:
    """Whether ``export``, the ``__dlpack__`` of an array of type ``kind``, takes a ``stream``
    argument, as its signature says; None where it has none to read (a method written in C may
    not). Read once per type."""
    try:
        return _stream_params[kind]
    except KeyError:
        pass
    try:
        params = inspect.signature(export).parameters.values()
    except (TypeError, ValueError):
        found = None
    else:
        found = any(p.name == "stream" or p.kind is p.VAR_KEYWORD for p in params)
    try:
        _stream_params[kind] = found
    except TypeError:  # a type that takes no weak reference: read each time
        pass
    return found


def _no_stream(name: str) -> TypeError:
    return TypeError(
        f"{name}.__dlpack__ takes no stream, so it cannot order its work before one of ours; "
        "await its library's stream with wait_stream()"
    )


async def _ready_on(
    drv: Driver, ordinal: int, exports: list[tuple[str, Callable[..., object]]]
) -> None:
    """Pass one private stream of device ``ordinal`` to every ``__dlpack__`` of ``exports``,
    and await it once."""

    def export_to(stream: int) -> None:
        for name, export in exports:
            try:
                capsule = export(stream=stream)
            except TypeError as exc:
                # A signature that could not be read: Python's own complaint about the
                # argument says that it takes no stream; any other is the producer's.
                if "unexpected keyword argument 'stream'" in str(exc):
                    raise _no_stream(name) from exc
                raise
            del capsule  # never consumed: its destructor frees the export

    await wait_private_stream(drv, ordinal, export_to)


def _device(value: object, name: str) -> tuple[int, int]:
    """The (device type, ordinal) of a ``__dlpack_device__()`` result, checked."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise TypeError(f"{name}.__dlpack_device__() returned {value!r}, not (type, ordinal)")
    kind, ordinal = int(value[0]), int(value[1])
    if kind != _CPU and kind not in _CUDA_DEVICES:
        raise ValueError(
            f"{name} is on DLPack device type {kind}, neither the CPU nor CUDA: aiocudasem "
            "waits for CUDA devices only"
        )
    return kind, ordinal
