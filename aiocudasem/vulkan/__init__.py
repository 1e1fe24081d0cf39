"""A real external producer: exportable Vulkan semaphores, driven from the host.

:class:`VulkanDevice` opens one Vulkan device (the one whose ``deviceUUID`` equals a CUDA
device's UUID, when asked) with a single queue, and creates :class:`VulkanSemaphore` objects
whose payload can be exported as a POSIX file descriptor and imported into CUDA
(``TIMELINE_SEMAPHORE_FD`` for timeline semaphores, ``OPAQUE_FD`` for binary ones).

Everything goes through :mod:`ctypes` on the system's Vulkan loader (``libvulkan.so.1``); no
Python package is needed. The loader is loaded by :meth:`VulkanDevice.open`, never at import,
so importing this package works on machines without Vulkan.

Thread safety: every method may be called from any thread. Host waits
(:meth:`VulkanSemaphore.block_until`, :meth:`VulkanDevice.block_until_idle`) run without
holding the device's lock, so another thread can signal while one waits; closing an object
that another thread is waiting on defers the destruction of its Vulkan handle until that wait
returns.

Inside, each layer imports only those before it: ``_abi`` (the ctypes mirror of
``vulkan_core.h``), ``_loader``, ``_select``, ``_state``, and ``_api``.
"""

from .._public import publish as _publish
from ._api import VulkanDevice as VulkanDevice
from ._api import VulkanSemaphore as VulkanSemaphore

__all__ = (
    "VulkanDevice",
    "VulkanSemaphore",
)

_publish(__name__, globals(), __all__)
