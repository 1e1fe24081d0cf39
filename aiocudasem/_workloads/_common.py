"""What every workloads class shares: the ``Workloads`` protocol, the demo's frame contents,
and a weak reference to the driver. The implementations (``_cuda``, ``_sim``) import this
module, not the package, which picks one (``workloads()``) and imports it when asked."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .._driver import Driver

__all__ = (
    "SEEN",
    "CudaStream",
    "StreamArg",
    "WeakDriver",
    "Workloads",
    "check_progress",
    "frame_word",
    "frame_words",
)

_D = TypeVar("_D")

#: What one check of an intact frame adds to its ``out`` slot (``words`` stays below it).
SEEN = 0x10000

_U32 = 1 << 32
_U64 = 1 << 64
_LIMIT = 1 << 63  # a host timeline's values are below it


def frame_word(frame: int, i: int) -> int:
    """The value the demo's producer writes at word ``i`` of frame ``frame``."""
    return (frame * 2654435761 + i) & 0xFFFFFFFF


def frame_words(frame: int, words: int) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """All of frame ``frame``: ``frame_word(frame, i)`` for ``i`` in ``range(words)``."""
    index = np.arange(words, dtype=np.uint64)
    return ((frame * 2654435761 + index) & 0xFFFFFFFF).astype(np.uint32)


class CudaStream(Protocol):
    """A stream of the CUDA stream protocol: an :class:`aiocudasem.Stream`, or a stream of
    cuda.core, CuPy, PyTorch or Numba."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


#: What the workloads take as a stream: a stream of the CUDA stream protocol (an
#: :class:`aiocudasem.Stream` included) or the driver's ``int`` handle of one.
StreamArg: TypeAlias = CudaStream | int


#: How the workloads refuse a stream of another driver (see ``stream_handle()``).
_MISMATCH = (
    "the stream belongs to {owner!r}, but these workloads to {driver!r}: "
    "use workloads(stream.driver)"
)


@runtime_checkable
class Workloads(Protocol):
    """Work to put on a driver's streams. A stream is an :class:`aiocudasem.Stream`, another
    object with ``__cuda_stream__``, or the driver's ``int`` handle of one; pointers are
    ``int``. Every call enqueues and returns, like a kernel launch."""

    @property
    def driver(self) -> Driver:
        """The driver the workloads belong to."""
        ...

    def alloc_pinned(self, nbytes: int) -> int:
        """Page-locked host memory that kernels of every device can read and write."""
        ...

    def free_pinned(self, ptr: int) -> None:
        """Free memory from :meth:`alloc_pinned`. On the GPU this can wait for the device:
        free only once the work that uses the memory is done."""
        ...

    def launch_spin(self, stream: StreamArg, ns: int) -> None:
        """Enqueue a kernel that runs for ``ns`` nanoseconds of device time."""
        ...

    def launch_check_frame(
        self, stream: StreamArg, src: int, words: int, frame: int, out: int
    ) -> None:
        """Enqueue a kernel that counts the words of pinned ``src`` that differ from
        ``frame_word(frame, i)`` and adds ``SEEN`` plus that count to ``out[frame]`` (uint32,
        pinned). A frame checked once and intact therefore reads exactly ``SEEN``."""
        ...

    def launch_trap(self, stream: StreamArg) -> None:
        """Enqueue a kernel that traps, faulting the device's context."""
        ...

    def launch_progress(
        self,
        stream: StreamArg,
        word: int,
        count: int,
        ns: int,
        *,
        start: int = 0,
        trap_at: int | None = None,
        stamps: int | None = None,
    ) -> None:
        """Enqueue a persistent kernel that reports its progress into a host timeline: it
        publishes ``start + 1`` to ``start + count`` into the timeline's word, value
        ``start + i`` once ``ns * i / count`` nanoseconds of device time have passed, with
        ``aiocudasem_publish()`` of ``aiocudasem/progress.cuh`` (a system-scope release
        store). ``word`` is the device address of the word, ``HostTimeline.handle``; keep the
        timeline open until the kernel has completed.

        ``trap_at``, a value in that range, makes the kernel trap instead of publishing it,
        faulting the device's context: the values below it are published, the others never.
        ``stamps``, pinned memory of ``count`` uint64 words, receives the device's clock in
        nanoseconds (``%globaltimer`` on a GPU, ``time.perf_counter_ns()`` on the simulated
        device) just before each value is published. Raises ``TypeError`` or ``ValueError``
        for a bad argument, before anything is enqueued."""
        ...


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value < high:
        bound = f"2**{high.bit_length() - 1}" if high & (high - 1) == 0 else str(high)
        raise ValueError(f"{name} must be in [{low}, {bound}), not {value}")
    return value


def check_progress(
    word: object,
    count: object,
    ns: object,
    start: object,
    trap_at: object,
    stamps: object,
) -> int:
    """Check the arguments of :meth:`Workloads.launch_progress`; return ``trap_at`` as the
    kernel takes it (0: never, as no value published is 0)."""
    address = _int("word", word, 1, _U64)
    if address % 8:
        raise ValueError(f"word must be the address of a 64-bit word, 8-aligned: {address:#x}")
    n = _int("count", count, 1, _U32)
    _int("ns", ns, 0, _U64)
    first = _int("start", start, 0, _LIMIT - n) + 1
    if stamps is not None:
        _int("stamps", stamps, 1, _U64)
    if trap_at is None:
        return 0
    return _int("trap_at", trap_at, first, first + n)


class WeakDriver(Generic[_D]):
    """The part every workloads class shares: the driver, held weakly. The driver keeps its
    workloads (in the table below, and the CUDA driver through its first-wait hook); they keep
    it only weakly, so that a driver given workloads can still be collected."""

    def __init__(self, driver: _D) -> None:
        self._ref = weakref.ref(driver)

    def _attach(self) -> None:
        """Called once by :func:`workloads`, outside its table's lock."""

    @property
    def _driver(self) -> _D:
        drv = self._ref()
        if drv is None:
            raise ReferenceError("the workloads' driver was collected")
        return drv

    @property
    def driver(self) -> _D:
        return self._driver
