"""The exception hierarchy.

Every error the library raises on purpose derives from :class:`AiocudasemError`, except misuse,
which is a plain :class:`TypeError` or :class:`ValueError` whose message says what to do, and
anyio's :class:`~anyio.ClosedResourceError` for an object used after ``close()`` or ``aclose()``
(a stream, an event, a semaphore, or a ``Wait``/``Signal`` entry made of a closed semaphore)
and for a hand-off section entered a second time.

Errors that come from a driver carry the driver's status code in ``.status`` (a ``CUresult``
for CUDA, a ``VkResult`` for Vulkan), never only in the message.
"""

from __future__ import annotations

import copy

import anyio

__all__ = (
    "AbandonedError",
    "AiocudasemError",
    "CudaError",
    "DeviceFaultError",
    "DeviceMismatchError",
    "DriverUnavailableError",
    "StageCancelledError",
    "UnsupportedFeatureError",
    "UnsupportedHandleTypeError",
    "VulkanError",
    "VulkanUnavailableError",
)

# CUresult codes after which the context is unusable (the "sticky" errors of the CUDA driver
# API documentation): every later call in the process fails with the same code.
STICKY_STATUSES: frozenset[int] = frozenset(
    {
        700,  # CUDA_ERROR_ILLEGAL_ADDRESS
        702,  # CUDA_ERROR_LAUNCH_TIMEOUT
        710,  # CUDA_ERROR_ASSERT
        714,  # CUDA_ERROR_HARDWARE_STACK_ERROR
        715,  # CUDA_ERROR_ILLEGAL_INSTRUCTION
        716,  # CUDA_ERROR_MISALIGNED_ADDRESS
        717,  # CUDA_ERROR_INVALID_ADDRESS_SPACE
        718,  # CUDA_ERROR_INVALID_PC
        719,  # CUDA_ERROR_LAUNCH_FAILED
        214,  # CUDA_ERROR_ECC_UNCORRECTABLE
        220,  # CUDA_ERROR_NVLINK_UNCORRECTABLE
    }
)


def _rebuild(cls: type[BaseException], args: tuple[object, ...]) -> BaseException:
    # What unpickling and copy.copy call: the exception's message without its __init__, whose
    # signature varies by class; __reduce__'s state then restores every field.
    return cls.__new__(cls, *args)


class AiocudasemError(Exception):
    """Base class of the library's errors.

    ``status`` is the driver's status code where a driver reported the failure, else ``None``.
    Every error of the library can be copied and pickled with all its fields (``status``,
    ``name``, ``reason``), so it can cross a process boundary.
    """

    #: The driver's status code (a ``CUresult`` or a ``VkResult``) where a driver reported the
    #: failure, else ``None``.
    status: int | None

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args), self.__dict__)

    def _for_waiter(self) -> AiocudasemError:
        """A copy of this error for one more waiter: the same type, fields, cause and context,
        with a traceback of its own (one shared object would pile up every waiter's frames)."""
        fresh = copy.copy(self)
        fresh.__cause__ = self.__cause__
        fresh.__context__ = self.__context__
        fresh.__suppress_context__ = self.__suppress_context__
        return fresh


class CudaError(AiocudasemError):
    """A CUDA driver call failed. ``status`` is the ``CUresult``; ``name`` its symbolic name.
    Errors of the simulated device carry the same codes, with ``[simulated]`` in the message."""

    #: The ``CUresult``.
    status: int

    def __init__(self, message: str, status: int, name: str = "") -> None:
        super().__init__(message, status)
        #: The symbolic name of ``status``, for example ``CUDA_ERROR_INVALID_HANDLE``.
        self.name = name

    def _explained(self, why: str) -> CudaError:
        """This error with ``why`` after its message: the same type, status and name."""
        return type(self)(f"{self}: {why}", self.status, self.name)


class DeviceFaultError(CudaError):
    """The device context hit a sticky error (a trapped kernel, an illegal address, a launch
    failure, an uncorrectable ECC or NVLink error): ``status`` is one of 700, 702, 710,
    714-719, 214 and 220.

    Raised to every coroutine awaiting work on the faulted device, and by every later call on it.
    The context cannot be recovered inside this process; GPU work that was enqueued is lost.
    """


class DriverUnavailableError(AiocudasemError):
    """The requested driver cannot run here: no CUDA driver library, no device, or a
    ``cuda-bindings`` without ``cuda.bindings._v2.driver``. The message says how to pick the
    simulated device instead; ``reason`` is the cause alone.

    Also raised in a child process created by ``os.fork()``: by every call on a driver object
    inherited from the parent (a ``SimDriver`` included), and by ``get_driver("cuda")`` if the
    parent had created the ``cuda`` driver. The message then names fork and suggests
    multiprocessing's ``'spawn'`` or ``'forkserver'`` start method."""

    def __init__(self, message: str, status: int | None = None, *, reason: str = "") -> None:
        super().__init__(message, status)
        #: The cause alone, without the advice of the message.
        self.reason = reason or message


class DeviceMismatchError(AiocudasemError, ValueError):
    """Objects from two different devices (or drivers) were combined in one operation, for
    example a semaphore imported on device 0 waited on by a stream of device 1, an event of
    another driver, a foreign stream outside its device's primary context, or a
    ``then_signal`` semaphore of another Vulkan device. Two driver objects of the same name
    (two ``SimDriver()``) are two machines; the message tells them apart."""


class UnsupportedHandleTypeError(AiocudasemError):
    """The external semaphore handle type is part of the API but this platform or driver cannot
    provide it (Win32 and D3D handles off Windows, NvSciSync off Tegra/DRIVE). ``status`` is
    801 (``CUDA_ERROR_NOT_SUPPORTED``) where the driver refused the import, and ``None`` for a
    Windows type off Windows, which is refused before the driver is called."""


class UnsupportedFeatureError(AiocudasemError):
    """The device cannot do what a feature needs, for example a host timeline on a device
    without 64-bit stream memory operations or mapped host memory. The message names the
    missing capability. ``status`` is ``None`` where a device attribute said so, and the
    ``CUresult`` where the driver refused the call."""


class AbandonedError(AiocudasemError, anyio.BrokenResourceError):
    """The semaphore or host timeline was given up on with ``abandon()``: its producer is gone.

    Raised to every task parked in its ``wait_value()`` or ``wait_signaled()`` when
    ``abandon()`` is called, by every later ``Wait``, ``Signal`` or host wait made of it, and by
    the exit of a hand-off section whose wait it released: the section's work may have run
    without the producer's data. It is an ``anyio.BrokenResourceError`` too: the other side of
    the channel is gone. ``status`` is ``None``.

    A host stage (``Stream.enqueue_host()``) raises it too, at its ``await``, when a stage
    before it on its stream failed or was cancelled after it was enqueued: the work between
    them ran without that stage, so this one did not run (its ``__cause__`` is the earlier
    stage's error). A cancelled stage raises :class:`StageCancelledError`, a subclass.
    """


class StageCancelledError(AbandonedError):
    """A host stage (``Stream.enqueue_host()``) was cancelled before its coroutine returned:
    by ``HostStage.cancel()``, by closing its stream, or by the end of its event loop. Raised
    by ``await stage``. The stream went on past the stage's position without it, so the work
    behind it ran without the stage's result, as after an ``abandon()``. ``status`` is
    ``None``.
    """


class VulkanError(AiocudasemError):
    """A Vulkan call failed. ``status`` is the ``VkResult``; ``name`` its symbolic name."""

    #: The ``VkResult``.
    status: int

    def __init__(self, message: str, status: int, name: str = "") -> None:
        super().__init__(message, status)
        #: The symbolic name of ``status``, for example ``VK_ERROR_DEVICE_LOST``.
        self.name = name


class VulkanUnavailableError(AiocudasemError):
    """No Vulkan loader (``libvulkan.so.1``), no Vulkan device, or no device with the needed
    extensions or with the UUID of the requested CUDA device."""
