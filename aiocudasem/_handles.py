"""The external semaphore handle types, in one table.

Everything that depends on a handle type reads its row here: how the handle is passed
(:attr:`HandleInfo.passed_as`), what a wait and a signal mean (:attr:`HandleInfo.sync`), and
whether it may be opened by name. The API (``_semaphore``) and the drivers share this leaf
module; it imports nothing from the library.

Adding a type is one :class:`HandleType` member, one row in :data:`HANDLE_TYPES`, and, if it
is passed in a new way, the branch in each driver's ``import_semaphore`` that fills the
descriptor.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

__all__ = ("HANDLE_TYPES", "HandleInfo", "HandleType", "info", "lookup")


class HandleType(enum.IntEnum):
    """``CUexternalSemaphoreHandleType``. The values are the driver's."""

    #: A binary semaphore passed as a POSIX fd (what a Vulkan binary semaphore exports).
    OPAQUE_FD = 1
    #: A binary semaphore passed as a Win32 ``HANDLE``, or opened by name.
    OPAQUE_WIN32 = 2
    #: A binary semaphore passed as a global (KMT) Win32 ``HANDLE``; no name.
    OPAQUE_WIN32_KMT = 3
    #: A D3D12 fence (a timeline), passed as a Win32 ``HANDLE``, or opened by name.
    D3D12_FENCE = 4
    #: A D3D11 fence (a timeline), passed as a Win32 ``HANDLE``, or opened by name.
    D3D11_FENCE = 5
    #: An ``NvSciSyncObj``, passed by address (Tegra and DRIVE platforms).
    NVSCISYNC = 6
    #: A D3D11 keyed mutex, passed as a Win32 ``HANDLE``, or opened by name.
    D3D11_KEYED_MUTEX = 7
    #: A D3D11 keyed mutex passed as a global (KMT) Win32 ``HANDLE``; no name.
    D3D11_KEYED_MUTEX_KMT = 8
    #: A timeline semaphore passed as a POSIX fd (what a Vulkan timeline semaphore exports).
    TIMELINE_SEMAPHORE_FD = 9
    #: A timeline semaphore passed as a Win32 ``HANDLE``, or opened by name.
    TIMELINE_SEMAPHORE_WIN32 = 10


@dataclass(frozen=True, slots=True)
class HandleInfo:
    """What the library needs to know about one handle type."""

    #: How the handle travels in ``CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC``: a POSIX fd, a Win32
    #: ``HANDLE`` (or a name), or an ``NvSciSyncObj`` address.
    passed_as: Literal["fd", "win32", "nvsci"]
    #: ``fence``: a wait completes at value >= N and a signal sets the value (timelines and D3D
    #: fences). ``binary``: one wait consumes one signal. ``keyed_mutex``: acquire and release
    #: with a key. ``nvscisync``: waits and signals take an ``NvSciSyncFence``.
    sync: Literal["fence", "binary", "keyed_mutex", "nvscisync"]
    #: A Win32 type that may be opened by name instead of by handle.
    by_name: bool = False

    @property
    def platform(self) -> str | None:
        """The only platform (``sys.platform``) that has the type, or None for any."""
        return "win32" if self.passed_as == "win32" else None

    @property
    def available(self) -> bool:
        """Whether the running platform has the type: ``import_semaphore`` refuses one that
        it does not with :class:`UnsupportedHandleTypeError`, before calling the driver."""
        platform = self.platform
        return platform is None or sys.platform == platform


#: One read-only row per :class:`HandleType` member: what that type means to the library.
HANDLE_TYPES: Final[Mapping[HandleType, HandleInfo]] = MappingProxyType(
    {
        HandleType.OPAQUE_FD: HandleInfo("fd", "binary"),
        HandleType.OPAQUE_WIN32: HandleInfo("win32", "binary", by_name=True),
        HandleType.OPAQUE_WIN32_KMT: HandleInfo("win32", "binary"),
        HandleType.D3D12_FENCE: HandleInfo("win32", "fence", by_name=True),
        HandleType.D3D11_FENCE: HandleInfo("win32", "fence", by_name=True),
        HandleType.NVSCISYNC: HandleInfo("nvsci", "nvscisync"),
        HandleType.D3D11_KEYED_MUTEX: HandleInfo("win32", "keyed_mutex", by_name=True),
        HandleType.D3D11_KEYED_MUTEX_KMT: HandleInfo("win32", "keyed_mutex"),
        HandleType.TIMELINE_SEMAPHORE_FD: HandleInfo("fd", "fence"),
        HandleType.TIMELINE_SEMAPHORE_WIN32: HandleInfo("win32", "fence", by_name=True),
    }
)


def info(handle_type: int) -> HandleInfo:
    """The row of ``handle_type`` (a :class:`HandleType` or its int value). Raises
    ``ValueError`` for a value that is not a handle type."""
    return HANDLE_TYPES[HandleType(handle_type)]


def lookup(handle_type: int) -> HandleInfo | None:
    """The row of ``handle_type``, or None for a value that is not a handle type (a driver
    reports that as the real driver would, not as ``ValueError``)."""
    try:
        return HANDLE_TYPES[HandleType(handle_type)]
    except (ValueError, KeyError):
        return None
