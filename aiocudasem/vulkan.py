"""A real external producer: exportable Vulkan semaphores, driven from the host.

:class:`VulkanDevice` opens one Vulkan device (the one whose ``deviceUUID`` equals a CUDA
device's UUID, when asked) with a single queue, and creates :class:`VulkanSemaphore` objects
whose payload can be exported as a POSIX file descriptor and imported into CUDA
(``TIMELINE_SEMAPHORE_FD`` for timeline semaphores, ``OPAQUE_FD`` for binary ones).

Everything goes through :mod:`ctypes` on the system's Vulkan loader (``libvulkan.so.1``); no
Python package is needed. The loader is loaded by :meth:`VulkanDevice.open`, never at import,
so importing this module works on machines without Vulkan.

Thread safety: every method may be called from any thread. Host waits
(:meth:`VulkanSemaphore.wait`, :meth:`VulkanDevice.wait_idle`) run without holding the device's
lock, so another thread can signal while one waits; closing an object that another thread is
waiting on defers the destruction of its Vulkan handle until that wait returns.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import anyio

from ._errors import DeviceMismatchError, VulkanError, VulkanUnavailableError

__all__ = ("VulkanDevice", "VulkanSemaphore")

# ---------------------------------------------------------------------------------------------
# Constants. Names are the C names of vulkan_core.h; _CONSTANTS collects every one of them, and
# the layout test compares it with the header.

VK_SUCCESS: Final = 0
VK_NOT_READY: Final = 1
VK_TIMEOUT: Final = 2
VK_INCOMPLETE: Final = 5
VK_ERROR_OUT_OF_HOST_MEMORY: Final = -1
VK_ERROR_OUT_OF_DEVICE_MEMORY: Final = -2
VK_ERROR_INITIALIZATION_FAILED: Final = -3
VK_ERROR_DEVICE_LOST: Final = -4
VK_ERROR_MEMORY_MAP_FAILED: Final = -5
VK_ERROR_LAYER_NOT_PRESENT: Final = -6
VK_ERROR_EXTENSION_NOT_PRESENT: Final = -7
VK_ERROR_FEATURE_NOT_PRESENT: Final = -8
VK_ERROR_INCOMPATIBLE_DRIVER: Final = -9
VK_ERROR_TOO_MANY_OBJECTS: Final = -10
VK_ERROR_FORMAT_NOT_SUPPORTED: Final = -11
VK_ERROR_FRAGMENTED_POOL: Final = -12
VK_ERROR_UNKNOWN: Final = -13
VK_ERROR_OUT_OF_POOL_MEMORY: Final = -1000069000
VK_ERROR_INVALID_EXTERNAL_HANDLE: Final = -1000072003
VK_ERROR_FRAGMENTATION: Final = -1000161000
VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS: Final = -1000257000

VK_STRUCTURE_TYPE_APPLICATION_INFO: Final = 0
VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO: Final = 1
VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO: Final = 2
VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO: Final = 3
VK_STRUCTURE_TYPE_SUBMIT_INFO: Final = 4
VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO: Final = 9
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2: Final = 1000059000
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2: Final = 1000059001
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES: Final = 1000071004
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_SEMAPHORE_INFO: Final = 1000076000
VK_STRUCTURE_TYPE_EXTERNAL_SEMAPHORE_PROPERTIES: Final = 1000076001
VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO: Final = 1000077000
VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR: Final = 1000079001
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES: Final = 1000207000
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_PROPERTIES: Final = 1000207001
VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO: Final = 1000207002
VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO: Final = 1000207003
VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO: Final = 1000207004
VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO: Final = 1000207005

VK_API_VERSION_1_1: Final = (1 << 22) | (1 << 12)
VK_API_VERSION_1_2: Final = (1 << 22) | (2 << 12)
VK_TRUE: Final = 1
VK_UUID_SIZE: Final = 16
VK_MAX_PHYSICAL_DEVICE_NAME_SIZE: Final = 256
VK_MAX_EXTENSION_NAME_SIZE: Final = 256

VK_PHYSICAL_DEVICE_TYPE_OTHER: Final = 0
VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: Final = 1
VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: Final = 2
VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: Final = 3
VK_PHYSICAL_DEVICE_TYPE_CPU: Final = 4

VK_QUEUE_GRAPHICS_BIT: Final = 0x1
VK_QUEUE_COMPUTE_BIT: Final = 0x2
VK_QUEUE_TRANSFER_BIT: Final = 0x4
VK_PIPELINE_STAGE_ALL_COMMANDS_BIT: Final = 0x10000

VK_SEMAPHORE_TYPE_BINARY: Final = 0
VK_SEMAPHORE_TYPE_TIMELINE: Final = 1
VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT: Final = 0x1
VK_EXTERNAL_SEMAPHORE_FEATURE_EXPORTABLE_BIT: Final = 0x1

VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME: Final = "VK_KHR_external_semaphore_fd"
VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME: Final = "VK_KHR_timeline_semaphore"

#: (C name, Python value) of every constant this module relies on: each ``VK_`` name defined
#: above, in order, so that a new constant is checked against the header without a second list.
_CONSTANTS: Final[tuple[tuple[str, int | str], ...]] = tuple(
    (name, value)
    for name, value in globals().items()
    if name.startswith("VK_") and isinstance(value, int | str)
)
_RESULT_NAMES: Final[dict[int, str]] = {
    value: name
    for name, value in _CONSTANTS
    if isinstance(value, int)
    and (name == "VK_SUCCESS" or name.startswith(("VK_ERROR_", "VK_NOT_")))
} | {VK_TIMEOUT: "VK_TIMEOUT", VK_INCOMPLETE: "VK_INCOMPLETE"}

_U64_MAX: Final = 2**64 - 1
# How long closing a device waits for its queue to finish the batches it was given before it
# gives up and leaks the VkDevice: destroying a device (or a semaphore) that a pending batch
# still uses is undefined behaviour, and a batch that waits for a semaphore nobody will signal
# never finishes.
_CLOSE_DRAIN_TIMEOUT_S: float = 5.0

# ---------------------------------------------------------------------------------------------
# Structures. Class names are the C names; every class is listed in _STRUCTS, which the layout
# test compares field by field with the header. Enums are 4-byte ints; non-dispatchable handles
# (VkSemaphore, VkFence) are 64-bit on every platform; dispatchable ones are pointers.

_u8 = ctypes.c_uint8
_u32 = ctypes.c_uint32
_i32 = ctypes.c_int32
_u64 = ctypes.c_uint64
_ptr = ctypes.c_void_p
_ndh = ctypes.c_uint64  # non-dispatchable handle
_STYPE_HEAD: Final[list[tuple[str, Any]]] = [("sType", _i32), ("pNext", _ptr)]


class VkApplicationInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("pApplicationName", ctypes.c_char_p),
        ("applicationVersion", _u32),
        ("pEngineName", ctypes.c_char_p),
        ("engineVersion", _u32),
        ("apiVersion", _u32),
    ]


class VkInstanceCreateInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("flags", _u32),
        ("pApplicationInfo", ctypes.POINTER(VkApplicationInfo)),
        ("enabledLayerCount", _u32),
        ("ppEnabledLayerNames", ctypes.POINTER(ctypes.c_char_p)),
        ("enabledExtensionCount", _u32),
        ("ppEnabledExtensionNames", ctypes.POINTER(ctypes.c_char_p)),
    ]


class VkExtensionProperties(ctypes.Structure):
    _fields_ = [
        ("extensionName", ctypes.c_char * VK_MAX_EXTENSION_NAME_SIZE),
        ("specVersion", _u32),
    ]


class VkPhysicalDeviceSparseProperties(ctypes.Structure):
    _fields_ = [
        ("residencyStandard2DBlockShape", _u32),
        ("residencyStandard2DMultisampleBlockShape", _u32),
        ("residencyStandard3DBlockShape", _u32),
        ("residencyAlignedMipSize", _u32),
        ("residencyNonResidentStrict", _u32),
    ]


class VkPhysicalDeviceProperties(ctypes.Structure):
    # VkPhysicalDeviceLimits is only carried, never read: an opaque block of its size and
    # alignment (checked against the header) saves mirroring its hundred-odd fields.
    _fields_ = [
        ("apiVersion", _u32),
        ("driverVersion", _u32),
        ("vendorID", _u32),
        ("deviceID", _u32),
        ("deviceType", _i32),
        ("deviceName", ctypes.c_char * VK_MAX_PHYSICAL_DEVICE_NAME_SIZE),
        ("pipelineCacheUUID", _u8 * VK_UUID_SIZE),
        ("limits", _u64 * 63),
        ("sparseProperties", VkPhysicalDeviceSparseProperties),
    ]


class VkPhysicalDeviceProperties2(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("properties", VkPhysicalDeviceProperties)]


class VkPhysicalDeviceIDProperties(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("deviceUUID", _u8 * VK_UUID_SIZE),
        ("driverUUID", _u8 * VK_UUID_SIZE),
        ("deviceLUID", _u8 * 8),
        ("deviceNodeMask", _u32),
        ("deviceLUIDValid", _u32),
    ]


class VkPhysicalDeviceTimelineSemaphoreProperties(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("maxTimelineSemaphoreValueDifference", _u64)]


class VkPhysicalDeviceFeatures2(ctypes.Structure):
    # VkPhysicalDeviceFeatures (55 VkBool32) is only carried: opaque, size checked.
    _fields_ = [*_STYPE_HEAD, ("features", _u32 * 55)]


class VkPhysicalDeviceTimelineSemaphoreFeatures(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("timelineSemaphore", _u32)]


class VkExtent3D(ctypes.Structure):
    _fields_ = [("width", _u32), ("height", _u32), ("depth", _u32)]


class VkQueueFamilyProperties(ctypes.Structure):
    _fields_ = [
        ("queueFlags", _u32),
        ("queueCount", _u32),
        ("timestampValidBits", _u32),
        ("minImageTransferGranularity", VkExtent3D),
    ]


class VkDeviceQueueCreateInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("flags", _u32),
        ("queueFamilyIndex", _u32),
        ("queueCount", _u32),
        ("pQueuePriorities", ctypes.POINTER(ctypes.c_float)),
    ]


class VkDeviceCreateInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("flags", _u32),
        ("queueCreateInfoCount", _u32),
        ("pQueueCreateInfos", ctypes.POINTER(VkDeviceQueueCreateInfo)),
        ("enabledLayerCount", _u32),
        ("ppEnabledLayerNames", ctypes.POINTER(ctypes.c_char_p)),
        ("enabledExtensionCount", _u32),
        ("ppEnabledExtensionNames", ctypes.POINTER(ctypes.c_char_p)),
        ("pEnabledFeatures", _ptr),
    ]


class VkPhysicalDeviceExternalSemaphoreInfo(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("handleType", _u32)]


class VkExternalSemaphoreProperties(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("exportFromImportedHandleTypes", _u32),
        ("compatibleHandleTypes", _u32),
        ("externalSemaphoreFeatures", _u32),
    ]


class VkSemaphoreCreateInfo(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("flags", _u32)]


class VkExportSemaphoreCreateInfo(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("handleTypes", _u32)]


class VkSemaphoreTypeCreateInfo(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("semaphoreType", _i32), ("initialValue", _u64)]


class VkSemaphoreGetFdInfoKHR(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("semaphore", _ndh), ("handleType", _u32)]


class VkSemaphoreSignalInfo(ctypes.Structure):
    _fields_ = [*_STYPE_HEAD, ("semaphore", _ndh), ("value", _u64)]


class VkSemaphoreWaitInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("flags", _u32),
        ("semaphoreCount", _u32),
        ("pSemaphores", ctypes.POINTER(_ndh)),
        ("pValues", ctypes.POINTER(_u64)),
    ]


class VkSubmitInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("waitSemaphoreCount", _u32),
        ("pWaitSemaphores", ctypes.POINTER(_ndh)),
        ("pWaitDstStageMask", ctypes.POINTER(_u32)),
        ("commandBufferCount", _u32),
        ("pCommandBuffers", _ptr),
        ("signalSemaphoreCount", _u32),
        ("pSignalSemaphores", ctypes.POINTER(_ndh)),
    ]


class VkTimelineSemaphoreSubmitInfo(ctypes.Structure):
    _fields_ = [
        *_STYPE_HEAD,
        ("waitSemaphoreValueCount", _u32),
        ("pWaitSemaphoreValues", ctypes.POINTER(_u64)),
        ("signalSemaphoreValueCount", _u32),
        ("pSignalSemaphoreValues", ctypes.POINTER(_u64)),
    ]


#: (C name, ctypes class) of every structure this module passes to Vulkan.
_STRUCTS: Final[tuple[tuple[str, type[ctypes.Structure]], ...]] = tuple(
    (cls.__name__, cls)
    for cls in (
        VkApplicationInfo,
        VkInstanceCreateInfo,
        VkExtensionProperties,
        VkPhysicalDeviceSparseProperties,
        VkPhysicalDeviceProperties,
        VkPhysicalDeviceProperties2,
        VkPhysicalDeviceIDProperties,
        VkPhysicalDeviceTimelineSemaphoreProperties,
        VkPhysicalDeviceFeatures2,
        VkPhysicalDeviceTimelineSemaphoreFeatures,
        VkExtent3D,
        VkQueueFamilyProperties,
        VkDeviceQueueCreateInfo,
        VkDeviceCreateInfo,
        VkPhysicalDeviceExternalSemaphoreInfo,
        VkExternalSemaphoreProperties,
        VkSemaphoreCreateInfo,
        VkExportSemaphoreCreateInfo,
        VkSemaphoreTypeCreateInfo,
        VkSemaphoreGetFdInfoKHR,
        VkSemaphoreSignalInfo,
        VkSemaphoreWaitInfo,
        VkSubmitInfo,
        VkTimelineSemaphoreSubmitInfo,
    )
)

#: The sType each extensible structure must carry; _new() fills it in.
_STRUCTURE_TYPES: Final[dict[type[ctypes.Structure], int]] = {
    VkApplicationInfo: VK_STRUCTURE_TYPE_APPLICATION_INFO,
    VkInstanceCreateInfo: VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
    VkPhysicalDeviceProperties2: VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
    VkPhysicalDeviceIDProperties: VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES,
    VkPhysicalDeviceTimelineSemaphoreProperties: (
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_PROPERTIES
    ),
    VkPhysicalDeviceFeatures2: VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
    VkPhysicalDeviceTimelineSemaphoreFeatures: (
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES
    ),
    VkDeviceQueueCreateInfo: VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
    VkDeviceCreateInfo: VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
    VkPhysicalDeviceExternalSemaphoreInfo: (
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_SEMAPHORE_INFO
    ),
    VkExternalSemaphoreProperties: VK_STRUCTURE_TYPE_EXTERNAL_SEMAPHORE_PROPERTIES,
    VkSemaphoreCreateInfo: VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO,
    VkExportSemaphoreCreateInfo: VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO,
    VkSemaphoreTypeCreateInfo: VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
    VkSemaphoreGetFdInfoKHR: VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR,
    VkSemaphoreSignalInfo: VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO,
    VkSemaphoreWaitInfo: VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
    VkSubmitInfo: VK_STRUCTURE_TYPE_SUBMIT_INFO,
    VkTimelineSemaphoreSubmitInfo: VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
}


_S = TypeVar("_S", bound=ctypes.Structure)


def _new(cls: type[_S], **fields: Any) -> _S:
    """A zeroed structure with its ``sType`` set and ``fields`` assigned."""
    obj = cls()
    stype = _STRUCTURE_TYPES.get(cls)
    if stype is not None:
        obj.sType = stype
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


def _chain(*structs: ctypes.Structure) -> None:
    """Link ``structs`` into one pNext chain, in order. The caller keeps them all alive."""
    for head, tail in itertools.pairwise(structs):
        head.pNext = ctypes.addressof(tail)


# ---------------------------------------------------------------------------------------------
# Commands. Each entry: name -> ((C return type, ctypes restype), ((C parameter type, ctypes
# argtype), ...)). The layout test compiles a check that each C signature matches the header's
# PFN_ type and compares every parameter's size with its ctypes type.

_Sig = tuple[tuple[str, Any], tuple[tuple[str, Any], ...]]


def _p(ctype: Any) -> Any:
    return ctypes.POINTER(ctype)


_RESULT: Final = ("VkResult", _i32)
_VOID: Final = ("void", None)
_ALLOC: Final = ("const VkAllocationCallbacks*", _ptr)
_INSTANCE: Final = ("VkInstance", _ptr)
_PHYSICAL: Final = ("VkPhysicalDevice", _ptr)
_DEVICE: Final = ("VkDevice", _ptr)

_FUNCTIONS: Final[dict[str, _Sig]] = {
    "vkGetInstanceProcAddr": (
        ("PFN_vkVoidFunction", _ptr),
        (_INSTANCE, ("const char*", ctypes.c_char_p)),
    ),
    "vkGetDeviceProcAddr": (
        ("PFN_vkVoidFunction", _ptr),
        (_DEVICE, ("const char*", ctypes.c_char_p)),
    ),
    "vkEnumerateInstanceVersion": (_RESULT, (("uint32_t*", _p(_u32)),)),
    "vkCreateInstance": (
        _RESULT,
        (
            ("const VkInstanceCreateInfo*", _p(VkInstanceCreateInfo)),
            _ALLOC,
            ("VkInstance*", _p(_ptr)),
        ),
    ),
    "vkDestroyInstance": (_VOID, (_INSTANCE, _ALLOC)),
    "vkEnumeratePhysicalDevices": (
        _RESULT,
        (_INSTANCE, ("uint32_t*", _p(_u32)), ("VkPhysicalDevice*", _p(_ptr))),
    ),
    "vkGetPhysicalDeviceProperties": (
        _VOID,
        (_PHYSICAL, ("VkPhysicalDeviceProperties*", _p(VkPhysicalDeviceProperties))),
    ),
    "vkGetPhysicalDeviceProperties2": (
        _VOID,
        (_PHYSICAL, ("VkPhysicalDeviceProperties2*", _p(VkPhysicalDeviceProperties2))),
    ),
    "vkGetPhysicalDeviceFeatures2": (
        _VOID,
        (_PHYSICAL, ("VkPhysicalDeviceFeatures2*", _p(VkPhysicalDeviceFeatures2))),
    ),
    "vkGetPhysicalDeviceQueueFamilyProperties": (
        _VOID,
        (
            _PHYSICAL,
            ("uint32_t*", _p(_u32)),
            ("VkQueueFamilyProperties*", _p(VkQueueFamilyProperties)),
        ),
    ),
    "vkEnumerateDeviceExtensionProperties": (
        _RESULT,
        (
            _PHYSICAL,
            ("const char*", ctypes.c_char_p),
            ("uint32_t*", _p(_u32)),
            ("VkExtensionProperties*", _p(VkExtensionProperties)),
        ),
    ),
    "vkGetPhysicalDeviceExternalSemaphoreProperties": (
        _VOID,
        (
            _PHYSICAL,
            (
                "const VkPhysicalDeviceExternalSemaphoreInfo*",
                _p(VkPhysicalDeviceExternalSemaphoreInfo),
            ),
            ("VkExternalSemaphoreProperties*", _p(VkExternalSemaphoreProperties)),
        ),
    ),
    "vkCreateDevice": (
        _RESULT,
        (
            _PHYSICAL,
            ("const VkDeviceCreateInfo*", _p(VkDeviceCreateInfo)),
            _ALLOC,
            ("VkDevice*", _p(_ptr)),
        ),
    ),
    "vkDestroyDevice": (_VOID, (_DEVICE, _ALLOC)),
    "vkGetDeviceQueue": (
        _VOID,
        (_DEVICE, ("uint32_t", _u32), ("uint32_t", _u32), ("VkQueue*", _p(_ptr))),
    ),
    "vkCreateSemaphore": (
        _RESULT,
        (
            _DEVICE,
            ("const VkSemaphoreCreateInfo*", _p(VkSemaphoreCreateInfo)),
            _ALLOC,
            ("VkSemaphore*", _p(_ndh)),
        ),
    ),
    "vkDestroySemaphore": (_VOID, (_DEVICE, ("VkSemaphore", _ndh), _ALLOC)),
    "vkGetSemaphoreFdKHR": (
        _RESULT,
        (
            _DEVICE,
            ("const VkSemaphoreGetFdInfoKHR*", _p(VkSemaphoreGetFdInfoKHR)),
            ("int*", _p(ctypes.c_int)),
        ),
    ),
    "vkSignalSemaphore": (
        _RESULT,
        (_DEVICE, ("const VkSemaphoreSignalInfo*", _p(VkSemaphoreSignalInfo))),
    ),
    "vkWaitSemaphores": (
        _RESULT,
        (
            _DEVICE,
            ("const VkSemaphoreWaitInfo*", _p(VkSemaphoreWaitInfo)),
            ("uint64_t", _u64),
        ),
    ),
    "vkGetSemaphoreCounterValue": (
        _RESULT,
        (_DEVICE, ("VkSemaphore", _ndh), ("uint64_t*", _p(_u64))),
    ),
    "vkQueueSubmit": (
        _RESULT,
        (
            ("VkQueue", _ptr),
            ("uint32_t", _u32),
            ("const VkSubmitInfo*", _p(VkSubmitInfo)),
            ("VkFence", _ndh),
        ),
    ),
}

_INSTANCE_COMMANDS: Final = (
    "vkDestroyInstance",
    "vkEnumeratePhysicalDevices",
    "vkGetPhysicalDeviceProperties",
    "vkGetPhysicalDeviceProperties2",
    "vkGetPhysicalDeviceFeatures2",
    "vkGetPhysicalDeviceQueueFamilyProperties",
    "vkEnumerateDeviceExtensionProperties",
    "vkGetPhysicalDeviceExternalSemaphoreProperties",
    "vkCreateDevice",
    "vkGetDeviceProcAddr",
)
_DEVICE_COMMANDS: Final = (
    "vkDestroyDevice",
    "vkGetDeviceQueue",
    "vkCreateSemaphore",
    "vkDestroySemaphore",
    "vkQueueSubmit",
)
# Core in Vulkan 1.2; on a 1.1 device they come from VK_KHR_timeline_semaphore with a KHR suffix.
_TIMELINE_COMMANDS: Final = ("vkSignalSemaphore", "vkWaitSemaphores", "vkGetSemaphoreCounterValue")

_Fn = Callable[..., Any]


def _prototype(name: str) -> Any:
    (_, restype), params = _FUNCTIONS[name]
    return ctypes.CFUNCTYPE(restype, *(argtype for _, argtype in params))


# ---------------------------------------------------------------------------------------------
# Loader and errors.

_LOADER_ENV: Final = "AIOCUDASEM_VULKAN_LOADER"
#: Library names tried in order when AIOCUDASEM_VULKAN_LOADER is unset.
_LOADER_NAMES: tuple[str, ...] = ("libvulkan.so.1",)


def _load_loader() -> ctypes.CDLL:
    override = os.environ.get(_LOADER_ENV)
    names = (override,) if override else _LOADER_NAMES
    failures: list[str] = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            failures.append(f"{name}: {exc}")
    raise VulkanUnavailableError(
        "cannot load the Vulkan loader ("
        + "; ".join(failures)
        + "); install the system's Vulkan loader (libvulkan1 on Debian and Ubuntu) and a "
        f"Vulkan driver, or set {_LOADER_ENV} to the loader library's path"
    )


def _result_name(result: int) -> str:
    return _RESULT_NAMES.get(result, f"VkResult({result})")


def _vk_error(command: str, result: int) -> VulkanError:
    name = _RESULT_NAMES.get(result, "")
    return VulkanError(f"{command} failed: {_result_name(result)}", status=result, name=name)


def _check(command: str, result: int) -> int:
    if result < 0:
        raise _vk_error(command, result)
    return result


# Instance creation and device enumeration report "no usable driver" with these codes.
_NO_DRIVER_RESULTS: Final = frozenset(
    {VK_ERROR_INCOMPATIBLE_DRIVER, VK_ERROR_INITIALIZATION_FAILED}
)
_NO_DRIVER_HINT: Final = (
    "install a Vulkan driver (ICD) for the device, or point VK_DRIVER_FILES (VK_ICD_FILENAMES on "
    "older loaders) at its ICD JSON file if it is installed outside the standard directories"
)


def _unavailable(command: str, result: int) -> VulkanUnavailableError:
    return VulkanUnavailableError(
        f"no usable Vulkan driver: {command} returned {_result_name(result)}; {_NO_DRIVER_HINT}",
        status=result,
    )


# ---------------------------------------------------------------------------------------------
# Argument checks.


def _check_u64(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{what} must be in [0, 2**64 - 1], got {value}")
    return value


def _timeout_ns(timeout: object) -> int:
    if timeout is None:
        return _U64_MAX
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be None (wait forever) or a number of seconds, got "
            f"{type(timeout).__name__}"
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout}")
    if math.isinf(timeout):
        return _U64_MAX
    return min(int(timeout * 1_000_000_000), _U64_MAX)


def _check_uuid(uuid: object) -> bytes | None:
    if uuid is None:
        return None
    if not isinstance(uuid, bytes | bytearray | memoryview):
        raise TypeError(
            f"uuid must be 16 bytes (the CUDA device UUID) or None, got {type(uuid).__name__}"
        )
    raw = bytes(uuid)
    if len(raw) != VK_UUID_SIZE:
        raise ValueError(f"uuid must be exactly {VK_UUID_SIZE} bytes, got {len(raw)}")
    return raw


def _version_text(version: int) -> str:
    return f"{(version >> 22) & 0x7F}.{(version >> 12) & 0x3FF}.{version & 0xFFF}"


def _major_minor(version: int) -> tuple[int, int]:
    return ((version >> 22) & 0x7F, (version >> 12) & 0x3FF)


# ---------------------------------------------------------------------------------------------
# Device selection.


@dataclass
class _Candidate:
    handle: int
    name: str
    device_type: int
    api_version: int
    uuid: bytes | None = None
    problems: list[str] = field(default_factory=list)
    # Kept apart so that tests can exercise the queue logic on drivers that cannot export.
    export_problems: list[str] = field(default_factory=list)
    has_fd_extension: bool = False
    queue_family: int = -1
    timeline_extension: bool = False
    max_value_difference: int = _U64_MAX

    def describe(self) -> str:
        uuid = self.uuid.hex() if self.uuid is not None else "unknown uuid"
        return f"{self.name!r} ({uuid}, Vulkan {_version_text(self.api_version)})"


# Lower sorts first when no UUID is given: a CPU implementation cannot share work with CUDA.
_TYPE_PREFERENCE: Final = {
    VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: 0,
    VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: 1,
    VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: 2,
    VK_PHYSICAL_DEVICE_TYPE_OTHER: 3,
    VK_PHYSICAL_DEVICE_TYPE_CPU: 4,
}
_QUEUE_KINDS: Final = VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT | VK_QUEUE_TRANSFER_BIT


def _enumerate_physical_devices(fns: dict[str, _Fn], instance: int) -> list[int]:
    while True:
        count = _u32(0)
        result = fns["vkEnumeratePhysicalDevices"](instance, ctypes.byref(count), None)
        if result in _NO_DRIVER_RESULTS:
            raise _unavailable("vkEnumeratePhysicalDevices", result)
        _check("vkEnumeratePhysicalDevices", result)
        handles = (_ptr * count.value)()
        result = fns["vkEnumeratePhysicalDevices"](instance, ctypes.byref(count), handles)
        if result == VK_INCOMPLETE:
            continue  # a device appeared between the two calls
        _check("vkEnumeratePhysicalDevices", result)
        return [int(h) for h in handles[: count.value] if h]


def _device_extensions(fns: dict[str, _Fn], physical: int) -> set[str]:
    while True:
        count = _u32(0)
        _check(
            "vkEnumerateDeviceExtensionProperties",
            fns["vkEnumerateDeviceExtensionProperties"](physical, None, ctypes.byref(count), None),
        )
        props = (VkExtensionProperties * count.value)()
        result = fns["vkEnumerateDeviceExtensionProperties"](
            physical, None, ctypes.byref(count), props
        )
        if result == VK_INCOMPLETE:
            continue
        _check("vkEnumerateDeviceExtensionProperties", result)
        return {p.extensionName.decode("ascii", "replace") for p in props[: count.value]}


def _pick_queue_family(fns: dict[str, _Fn], physical: int) -> int:
    count = _u32(0)
    fns["vkGetPhysicalDeviceQueueFamilyProperties"](physical, ctypes.byref(count), None)
    families = (VkQueueFamilyProperties * count.value)()
    fns["vkGetPhysicalDeviceQueueFamilyProperties"](physical, ctypes.byref(count), families)
    best, best_kinds = -1, 0
    for index, family in enumerate(families[: count.value]):
        kinds = bin(int(family.queueFlags) & _QUEUE_KINDS).count("1")
        # The family that accepts the most kinds of work is where a renderer would submit.
        if family.queueCount > 0 and kinds > best_kinds:
            best, best_kinds = index, kinds
    return best


def _semaphore_exportable(fns: dict[str, _Fn], physical: int, timeline: bool) -> bool:
    info = _new(
        VkPhysicalDeviceExternalSemaphoreInfo,
        handleType=VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT,
    )
    type_info = _new(VkSemaphoreTypeCreateInfo, semaphoreType=VK_SEMAPHORE_TYPE_TIMELINE)
    if timeline:
        _chain(info, type_info)
    props = _new(VkExternalSemaphoreProperties)
    fns["vkGetPhysicalDeviceExternalSemaphoreProperties"](
        physical, ctypes.byref(info), ctypes.byref(props)
    )
    return bool(
        props.externalSemaphoreFeatures & VK_EXTERNAL_SEMAPHORE_FEATURE_EXPORTABLE_BIT
        and props.compatibleHandleTypes & VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT
    )


def _probe(fns: dict[str, _Fn], physical: int) -> _Candidate:
    base = _new(VkPhysicalDeviceProperties)
    fns["vkGetPhysicalDeviceProperties"](physical, ctypes.byref(base))
    candidate = _Candidate(
        handle=physical,
        name=bytes(base.deviceName).split(b"\0", 1)[0].decode("utf-8", "replace"),
        device_type=int(base.deviceType),
        api_version=int(base.apiVersion),
    )
    version = _major_minor(candidate.api_version)
    if version < (1, 1):
        # Without 1.1 there is no vkGetPhysicalDeviceProperties2 to read the UUID with.
        candidate.problems.append("supports only Vulkan 1.0 (needs 1.1 or newer)")
        return candidate

    extensions = _device_extensions(fns, physical)
    has_timeline = version >= (1, 2)
    if not has_timeline and VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME in extensions:
        has_timeline = True
        candidate.timeline_extension = True

    props = _new(VkPhysicalDeviceProperties2)
    id_props = _new(VkPhysicalDeviceIDProperties)
    timeline_props = _new(VkPhysicalDeviceTimelineSemaphoreProperties)
    if has_timeline:
        _chain(props, id_props, timeline_props)
    else:
        _chain(props, id_props)
    fns["vkGetPhysicalDeviceProperties2"](physical, ctypes.byref(props))
    candidate.uuid = bytes(id_props.deviceUUID)

    candidate.has_fd_extension = VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME in extensions
    if not candidate.has_fd_extension:
        candidate.export_problems.append(f"lacks {VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME}")
    if not has_timeline:
        candidate.problems.append(
            f"has no timeline semaphores (needs Vulkan 1.2 or "
            f"{VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME})"
        )
    else:
        candidate.max_value_difference = int(timeline_props.maxTimelineSemaphoreValueDifference)
        features = _new(VkPhysicalDeviceFeatures2)
        timeline_features = _new(VkPhysicalDeviceTimelineSemaphoreFeatures)
        _chain(features, timeline_features)
        fns["vkGetPhysicalDeviceFeatures2"](physical, ctypes.byref(features))
        if timeline_features.timelineSemaphore != VK_TRUE:
            candidate.problems.append("does not support the timelineSemaphore feature")
        elif not _semaphore_exportable(fns, physical, timeline=True):
            candidate.export_problems.append("cannot export timeline semaphores as opaque fds")
    if not _semaphore_exportable(fns, physical, timeline=False):
        candidate.export_problems.append("cannot export binary semaphores as opaque fds")

    candidate.queue_family = _pick_queue_family(fns, physical)
    if candidate.queue_family < 0:
        candidate.problems.append("has no graphics, compute or transfer queue")
    return candidate


def _select(candidates: list[_Candidate], uuid: bytes | None, require_export: bool) -> _Candidate:
    def problems(c: _Candidate) -> list[str]:
        return c.problems + c.export_problems if require_export else c.problems

    if not candidates:
        raise VulkanUnavailableError(
            f"the Vulkan loader found no physical device; {_NO_DRIVER_HINT}"
        )
    if uuid is not None:
        matches = [c for c in candidates if c.uuid == uuid]
        if not matches:
            found = ", ".join(c.describe() for c in candidates)
            raise VulkanUnavailableError(
                f"no Vulkan device has UUID {uuid.hex()} (devices found: {found}); the Vulkan "
                "driver of that CUDA device may be missing"
            )
        ordered = matches
    else:
        ordered = sorted(candidates, key=lambda c: _TYPE_PREFERENCE.get(c.device_type, 3))
    for candidate in ordered:
        if not problems(candidate):
            return candidate
    reasons = "; ".join(f"{c.describe()} {', '.join(problems(c))}" for c in ordered)
    raise VulkanUnavailableError(f"no Vulkan device can export semaphores to CUDA: {reasons}")


# ---------------------------------------------------------------------------------------------
# Shared state. The public objects are thin wrappers so that weakref.finalize callbacks can
# reference the state without keeping the wrappers alive.


class _SemaphoreState:
    __slots__ = (
        "busy",
        "closed",
        "destroyed",
        "device",
        "handle",
        "last_serial",
        "pending_signals",
        "timeline",
    )

    def __init__(self, device: _DeviceState, handle: int, timeline: bool) -> None:
        self.device = device
        self.handle = handle
        self.timeline = timeline
        self.closed = False
        self.destroyed = False
        self.busy = 0
        # Serial of the last queue batch that used this semaphore: its handle must outlive it.
        self.last_serial = 0
        # (serial, value) of queue signal operations submitted and maybe not yet executed.
        self.pending_signals: list[tuple[int, int]] = []


class _DeviceState:
    """The Vulkan objects behind a :class:`VulkanDevice` and its semaphores.

    ``lock`` guards every field below and every call that Vulkan requires to be externally
    synchronized (queue submission, object destruction). Host waits run outside it under a
    "busy" count, which defers destruction instead of racing it.
    """

    def __init__(
        self,
        *,
        loader: ctypes.CDLL,
        instance: int,
        instance_fns: dict[str, _Fn],
        candidate: _Candidate,
        device: int,
        fns: dict[str, _Fn],
        queue: int,
    ) -> None:
        self.loader = loader  # keeps the library mapped while its function pointers are in use
        self.instance = instance
        self.instance_fns = instance_fns
        self.device = device
        self.fns = fns
        self.queue = queue
        self.uuid = candidate.uuid or bytes(VK_UUID_SIZE)
        self.name = candidate.name
        self.api_version = candidate.api_version
        self.queue_family = candidate.queue_family
        self.max_value_difference = candidate.max_value_difference
        self.exportable = not candidate.export_problems
        self.lock = threading.Lock()
        self.closed = False
        self.destroyed = False
        self.busy = 0
        self.semaphores: set[_SemaphoreState] = set()
        self.zombies: list[_SemaphoreState] = []
        # Semaphores whose wrapper was garbage-collected; a finalizer may run while this
        # thread already holds `lock`, so it only queues them here.
        self.orphans: deque[_SemaphoreState] = deque()
        # Every batch this device submits also signals `progress` to its serial, so "has batch
        # N finished" is one counter read and draining the queue can time out.
        self.submitted = 0
        self.completed = 0
        self.progress = self.create_handle(timeline=True, initial=0, export=False)

    # -- locking ------------------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self.lock:
            try:
                yield
            finally:
                while self.orphans:
                    self.close_semaphore_locked(self.orphans.popleft())

    def adopt_orphan(self, sem: _SemaphoreState) -> None:
        self.orphans.append(sem)
        if self.lock.acquire(blocking=False):
            try:
                while self.orphans:
                    self.close_semaphore_locked(self.orphans.popleft())
            finally:
                self.lock.release()

    def check_open_locked(self, sem: _SemaphoreState | None = None) -> None:
        if self.closed:
            raise anyio.ClosedResourceError("this VulkanDevice is closed")
        if sem is not None and sem.closed:
            raise anyio.ClosedResourceError("this VulkanSemaphore is closed")

    @contextmanager
    def lease(self, sem: _SemaphoreState | None = None) -> Iterator[None]:
        """Keep the device (and ``sem``) from being destroyed while the lock is not held."""
        with self.locked():
            self.check_open_locked(sem)
            self.busy += 1
            if sem is not None:
                sem.busy += 1
        try:
            yield
        finally:
            with self.locked():
                self.busy -= 1
                if sem is not None:
                    sem.busy -= 1
                    if sem.closed and sem.busy == 0:
                        self.retire_locked(sem)
                if self.closed and self.busy == 0:
                    self.teardown_locked()

    # -- calls --------------------------------------------------------------------------------

    def call(self, command: str, *args: Any) -> int:
        return _check(command, int(self.fns[command](self.device, *args)))

    def counter_value_locked(self, handle: int) -> int:
        value = _u64(0)
        self.call("vkGetSemaphoreCounterValue", handle, ctypes.byref(value))
        return int(value.value)

    def refresh_completed_locked(self) -> int:
        if self.completed < self.submitted:
            self.completed = self.counter_value_locked(self.progress)
        return self.completed

    def create_handle(self, *, timeline: bool, initial: int, export: bool) -> int:
        info = _new(VkSemaphoreCreateInfo)
        export_info = _new(
            VkExportSemaphoreCreateInfo, handleTypes=VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT
        )
        type_info = _new(
            VkSemaphoreTypeCreateInfo,
            semaphoreType=VK_SEMAPHORE_TYPE_TIMELINE if timeline else VK_SEMAPHORE_TYPE_BINARY,
            initialValue=initial,
        )
        _chain(info, *(s for s, wanted in ((export_info, export), (type_info, timeline)) if wanted))
        handle = _ndh(0)
        self.call("vkCreateSemaphore", ctypes.byref(info), None, ctypes.byref(handle))
        return int(handle.value)

    def create_semaphore_locked(self, *, timeline: bool, initial: int) -> _SemaphoreState:
        handle = self.create_handle(timeline=timeline, initial=initial, export=self.exportable)
        state = _SemaphoreState(self, handle, timeline)
        self.semaphores.add(state)
        return state

    def submit_locked(
        self,
        waits: Sequence[tuple[_SemaphoreState, int]],
        signals: Sequence[tuple[_SemaphoreState, int]],
    ) -> None:
        """One batch without command buffers. Caller holds the lock (vkQueueSubmit requires the
        queue to be externally synchronized) and has checked the values."""
        serial = self.submitted + 1
        wait_count = len(waits)
        signal_handles = [s.handle for s, _ in signals] + [self.progress]
        signal_values = [v for _, v in signals] + [serial]
        signal_count = len(signal_handles)
        wait_semaphores = (_ndh * wait_count)(*(s.handle for s, _ in waits))
        wait_values = (_u64 * wait_count)(*(v for _, v in waits))
        wait_stages = (_u32 * wait_count)(*([VK_PIPELINE_STAGE_ALL_COMMANDS_BIT] * wait_count))
        timeline_info = _new(
            VkTimelineSemaphoreSubmitInfo,
            waitSemaphoreValueCount=wait_count,
            pWaitSemaphoreValues=wait_values if wait_count else None,
            signalSemaphoreValueCount=signal_count,
            pSignalSemaphoreValues=(_u64 * signal_count)(*signal_values),
        )
        info = _new(
            VkSubmitInfo,
            waitSemaphoreCount=wait_count,
            pWaitSemaphores=wait_semaphores if wait_count else None,
            pWaitDstStageMask=wait_stages if wait_count else None,
            signalSemaphoreCount=signal_count,
            pSignalSemaphores=(_ndh * signal_count)(*signal_handles),
        )
        _chain(info, timeline_info)
        result = int(self.fns["vkQueueSubmit"](self.queue, 1, ctypes.byref(info), 0))
        _check("vkQueueSubmit", result)
        self.submitted = serial
        for sem, _ in waits:
            sem.last_serial = serial
        for sem, value in signals:
            sem.last_serial = serial
            if sem.timeline:
                sem.pending_signals.append((serial, value))

    def pending_signal_values_locked(self, sem: _SemaphoreState) -> list[int]:
        if sem.pending_signals:
            done = self.refresh_completed_locked()
            sem.pending_signals = [(s, v) for s, v in sem.pending_signals if s > done]
        return [v for _, v in sem.pending_signals]

    # -- destruction --------------------------------------------------------------------------

    def destroy_semaphore_locked(self, sem: _SemaphoreState) -> None:
        if not sem.destroyed:
            sem.destroyed = True
            self.semaphores.discard(sem)
            self.fns["vkDestroySemaphore"](self.device, sem.handle, None)

    def retire_locked(self, sem: _SemaphoreState) -> None:
        """Destroy ``sem`` now if no batch still uses it, else once one does not."""
        if sem.destroyed or self.destroyed:
            return
        try:
            done = self.refresh_completed_locked()
        except VulkanError:
            done = -1  # device lost: leave it to teardown, which may destroy after a loss
        if sem.last_serial <= done:
            self.destroy_semaphore_locked(sem)
        elif sem not in self.zombies:
            self.zombies.append(sem)

    def reap_locked(self) -> None:
        if not self.zombies:
            return
        zombies, self.zombies = self.zombies, []
        for sem in zombies:
            self.retire_locked(sem)

    def close_semaphore_locked(self, sem: _SemaphoreState) -> None:
        if sem.closed:
            return
        sem.closed = True
        if sem.busy == 0:
            self.retire_locked(sem)

    def close(self) -> None:
        with self.locked():
            if self.closed:
                return
            self.closed = True
            if self.busy == 0:
                self.teardown_locked()

    def teardown_locked(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        drained = True
        if self.submitted > self.completed:
            handles = (_ndh * 1)(self.progress)
            values = (_u64 * 1)(self.submitted)
            info = _new(VkSemaphoreWaitInfo, semaphoreCount=1, pSemaphores=handles, pValues=values)
            result = int(
                self.fns["vkWaitSemaphores"](
                    self.device, ctypes.byref(info), int(_CLOSE_DRAIN_TIMEOUT_S * 1e9)
                )
            )
            # After VK_ERROR_DEVICE_LOST nothing is pending any more, so destruction is allowed.
            drained = result != VK_TIMEOUT
        if not drained:
            warnings.warn(
                f"VulkanDevice {self.name!r} closed while its queue still had unfinished "
                f"batches after {_CLOSE_DRAIN_TIMEOUT_S:g} s (a submit_wait() on a semaphore "
                "that nobody signalled?); its VkDevice and semaphores are leaked rather than "
                "destroyed while in use",
                ResourceWarning,
                stacklevel=2,
            )
            return
        for sem in list(self.semaphores):
            self.destroy_semaphore_locked(sem)
            sem.closed = True
        self.zombies.clear()
        self.fns["vkDestroySemaphore"](self.device, self.progress, None)
        self.fns["vkDestroyDevice"](self.device, None)
        self.instance_fns["vkDestroyInstance"](self.instance, None)


def _bind(getter: _Fn, handle: int | None, name: str, lookup: str | None = None) -> _Fn:
    address = getter(handle, (lookup or name).encode("ascii"))
    if not address:
        raise VulkanUnavailableError(
            f"the Vulkan loader or driver does not provide {lookup or name}"
        )
    fn: _Fn = _prototype(name)(address)
    return fn


def _create_instance(gipa: _Fn) -> int:
    enumerate_version = gipa(None, b"vkEnumerateInstanceVersion")
    if not enumerate_version:
        raise VulkanUnavailableError(
            "the Vulkan loader supports only Vulkan 1.0; Vulkan 1.1 or newer is needed"
        )
    loader_version = _u32(0)
    _check(
        "vkEnumerateInstanceVersion",
        int(
            _prototype("vkEnumerateInstanceVersion")(enumerate_version)(
                ctypes.byref(loader_version)
            )
        ),
    )
    if _major_minor(loader_version.value) < (1, 1):
        raise VulkanUnavailableError(
            f"the Vulkan loader supports Vulkan {_version_text(loader_version.value)}; "
            "1.1 or newer is needed"
        )
    app = _new(
        VkApplicationInfo,
        pApplicationName=b"aiocudasem",
        pEngineName=b"aiocudasem",
        apiVersion=VK_API_VERSION_1_2,
    )
    info = _new(VkInstanceCreateInfo, pApplicationInfo=ctypes.pointer(app))
    instance = _ptr()
    create = _bind(gipa, None, "vkCreateInstance")
    result = int(create(ctypes.byref(info), None, ctypes.byref(instance)))
    if result in _NO_DRIVER_RESULTS:
        raise _unavailable("vkCreateInstance", result)
    _check("vkCreateInstance", result)
    if not instance.value:
        raise VulkanError("vkCreateInstance returned no instance", status=VK_ERROR_UNKNOWN)
    return int(instance.value)


def _create_device(ifns: dict[str, _Fn], candidate: _Candidate) -> int:
    priorities = (ctypes.c_float * 1)(1.0)
    queue_info = _new(
        VkDeviceQueueCreateInfo,
        queueFamilyIndex=candidate.queue_family,
        queueCount=1,
        pQueuePriorities=priorities,
    )
    names = []
    if candidate.has_fd_extension:
        names.append(VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME)
    if candidate.timeline_extension:
        names.append(VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME)
    extensions = (ctypes.c_char_p * len(names))(*(n.encode("ascii") for n in names))
    # VkPhysicalDeviceTimelineSemaphoreFeatures is valid both for core 1.2 and for the KHR
    # extension, unlike VkPhysicalDeviceVulkan12Features.
    timeline = _new(VkPhysicalDeviceTimelineSemaphoreFeatures, timelineSemaphore=VK_TRUE)
    info = _new(
        VkDeviceCreateInfo,
        queueCreateInfoCount=1,
        pQueueCreateInfos=ctypes.pointer(queue_info),
        enabledExtensionCount=len(names),
        ppEnabledExtensionNames=extensions,
    )
    _chain(info, timeline)
    device = _ptr()
    _check(
        "vkCreateDevice",
        int(
            ifns["vkCreateDevice"](candidate.handle, ctypes.byref(info), None, ctypes.byref(device))
        ),
    )
    if not device.value:
        raise VulkanError("vkCreateDevice returned no device", status=VK_ERROR_UNKNOWN)
    return int(device.value)


def _open_state(uuid: bytes | None, *, require_export: bool = True) -> _DeviceState:
    loader = _load_loader()
    try:
        gipa: _Fn = _prototype("vkGetInstanceProcAddr")(("vkGetInstanceProcAddr", loader))
    except AttributeError as exc:
        raise VulkanUnavailableError(
            f"{loader._name} does not export vkGetInstanceProcAddr; it is not a Vulkan loader"
        ) from exc
    instance = _create_instance(gipa)
    ifns: dict[str, _Fn] = {}
    try:
        for name in _INSTANCE_COMMANDS:
            ifns[name] = _bind(gipa, instance, name)
        physicals = _enumerate_physical_devices(ifns, instance)
        candidate = _select([_probe(ifns, p) for p in physicals], uuid, require_export)
        device = _create_device(ifns, candidate)
        gdpa = ifns["vkGetDeviceProcAddr"]
        destroy_device = _bind(gdpa, device, "vkDestroyDevice")
        try:
            fns = {name: _bind(gdpa, device, name) for name in _DEVICE_COMMANDS}
            suffix = "KHR" if candidate.timeline_extension else ""
            for name in _TIMELINE_COMMANDS:
                fns[name] = _bind(gdpa, device, name, name + suffix)
            if not candidate.export_problems:
                fns["vkGetSemaphoreFdKHR"] = _bind(gdpa, device, "vkGetSemaphoreFdKHR")
            queue = _ptr()
            fns["vkGetDeviceQueue"](device, candidate.queue_family, 0, ctypes.byref(queue))
            return _DeviceState(
                loader=loader,
                instance=instance,
                instance_fns=ifns,
                candidate=candidate,
                device=device,
                fns=fns,
                queue=int(queue.value or 0),
            )
        except BaseException:
            destroy_device(device, None)
            raise
    except BaseException:
        if "vkDestroyInstance" in ifns:
            ifns["vkDestroyInstance"](instance, None)
        raise


# ---------------------------------------------------------------------------------------------
# Public API.


class VulkanDevice:
    """One Vulkan device with one queue, used to create exportable semaphores.

    Create it with :meth:`open`. It owns a ``VkInstance``, a ``VkDevice`` and every semaphore it
    created; :meth:`close` (or leaving the ``with`` block) destroys them all. Semaphores keep
    their device object alive, and a garbage-collected device is closed as a safety net.
    """

    __slots__ = ("__weakref__", "_finalizer", "_state")

    def __init__(self, state: _DeviceState) -> None:
        """Internal: use :meth:`open`."""
        if not isinstance(state, _DeviceState):
            raise TypeError("VulkanDevice is not constructed directly; use VulkanDevice.open()")
        self._state = state
        self._finalizer = weakref.finalize(self, state.close)

    @classmethod
    def open(cls, uuid: bytes | None = None) -> VulkanDevice:
        """Open the Vulkan device whose ``deviceUUID`` is ``uuid`` (16 bytes, the CUDA device's
        UUID), or with ``uuid=None`` the first device that can export timeline and binary
        semaphores as opaque fds, GPUs before CPU implementations.

        Loads the Vulkan loader, creates a Vulkan 1.2 instance without layers and a device with
        one queue, enabling ``VK_KHR_external_semaphore_fd`` and the ``timelineSemaphore``
        feature. Blocks only for driver initialisation.

        Raises :class:`TypeError` / :class:`ValueError` for a ``uuid`` that is not 16 bytes;
        :class:`~aiocudasem.VulkanUnavailableError` when there is no loader, no driver, no
        device, no device with that UUID, or none with the needed extensions and features;
        :class:`~aiocudasem.VulkanError` when a Vulkan call fails.
        """
        return cls(_open_state(_check_uuid(uuid)))

    @property
    def uuid(self) -> bytes:
        """The device's 16-byte ``deviceUUID``; equals the CUDA UUID of the same GPU."""
        return self._state.uuid

    @property
    def name(self) -> str:
        """The driver's ``deviceName``."""
        return self._state.name

    @property
    def api_version(self) -> tuple[int, int, int]:
        """The device's Vulkan version as (major, minor, patch)."""
        v = self._state.api_version
        return ((v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._state.closed

    def _create(self, *, timeline: bool, initial: int) -> VulkanSemaphore:
        state = self._state
        with state.locked():
            state.check_open_locked()
            state.reap_locked()
            sem = state.create_semaphore_locked(timeline=timeline, initial=initial)
        return VulkanSemaphore(self, sem)

    def create_timeline_semaphore(self, initial_value: int = 0) -> VulkanSemaphore:
        """A new exportable timeline semaphore whose counter starts at ``initial_value``.

        The device owns it until :meth:`VulkanSemaphore.close` or :meth:`close`. Raises
        :class:`TypeError` / :class:`ValueError` for a value that is not a uint64,
        :class:`anyio.ClosedResourceError` after :meth:`close`, :class:`VulkanError` on failure.
        """
        initial = _check_u64("initial_value", initial_value)
        return self._create(timeline=True, initial=initial)

    def create_binary_semaphore(self) -> VulkanSemaphore:
        """A new exportable binary semaphore, unsignalled. Raises like
        :meth:`create_timeline_semaphore`."""
        return self._create(timeline=False, initial=0)

    def wait_idle(self) -> None:
        """Block until every batch submitted through this device's semaphores has executed.

        Equivalent to ``vkQueueWaitIdle`` on the device's queue, but implemented as a host wait
        on an internal timeline semaphore so that other threads can keep submitting meanwhile
        (a batch waiting for a binary semaphore may need a later submission to finish). Blocks
        forever if a batch waits on a semaphore that is never signalled. Raises
        :class:`anyio.ClosedResourceError` after :meth:`close`, :class:`VulkanError` on a lost
        device.
        """
        state = self._state
        with state.lease():
            with state.locked():
                target = state.submitted
            if target <= state.completed:
                return
            handles = (_ndh * 1)(state.progress)
            values = (_u64 * 1)(target)
            info = _new(VkSemaphoreWaitInfo, semaphoreCount=1, pSemaphores=handles, pValues=values)
            result = int(state.fns["vkWaitSemaphores"](state.device, ctypes.byref(info), _U64_MAX))
            _check("vkWaitSemaphores", result)

    def close(self) -> None:
        """Destroy every semaphore this device created that is still open, the device and the
        instance. Idempotent.

        Waits up to a few seconds for batches still pending on the queue; if they do not finish
        (a ``submit_wait`` on a semaphore nobody signals) the Vulkan objects are leaked with a
        :class:`ResourceWarning` rather than destroyed while in use. If another thread is in a
        host wait on this device, destruction happens when that wait returns. File descriptors
        already exported stay valid and owned by whoever holds them.
        """
        self._finalizer()

    def __enter__(self) -> VulkanDevice:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else "open"
        return f"<VulkanDevice {self.name!r} uuid={self.uuid.hex()} {state}>"


class VulkanSemaphore:
    """An exportable Vulkan semaphore (timeline or binary) created by a :class:`VulkanDevice`.

    Not constructed directly. Holds a reference to its device, which owns the ``VkSemaphore``;
    :meth:`close` destroys it (deferred until no queue batch or host wait still uses it). A
    garbage-collected semaphore is closed as a safety net.
    """

    __slots__ = ("__weakref__", "_device", "_finalizer", "_state")

    def __init__(self, device: VulkanDevice, state: _SemaphoreState) -> None:
        """Internal: use :meth:`VulkanDevice.create_timeline_semaphore` or
        :meth:`VulkanDevice.create_binary_semaphore`."""
        if not isinstance(device, VulkanDevice) or not isinstance(state, _SemaphoreState):
            raise TypeError(
                "VulkanSemaphore is not constructed directly; use "
                "VulkanDevice.create_timeline_semaphore() or create_binary_semaphore()"
            )
        self._device = device
        self._state = state
        self._finalizer = weakref.finalize(self, state.device.adopt_orphan, state)

    @property
    def device(self) -> VulkanDevice:
        """The device that created this semaphore."""
        return self._device

    @property
    def is_timeline(self) -> bool:
        """True for a timeline semaphore, False for a binary one."""
        return self._state.timeline

    @property
    def closed(self) -> bool:
        """True once this semaphore or its device has been closed."""
        return self._state.closed or self._state.device.closed

    def _require_timeline(self, what: str, instead: str) -> None:
        if not self._state.timeline:
            raise TypeError(f"{what} needs a timeline semaphore; for a binary one {instead}")

    def _check_difference_locked(self, what: str, value: int, current: int) -> None:
        limit = self._state.device.max_value_difference
        if value > current and value - current > limit:
            raise ValueError(
                f"{what} {value} is more than maxTimelineSemaphoreValueDifference ({limit}) "
                f"ahead of the semaphore's current value {current}"
            )

    def export_fd(self) -> int:
        """Export the semaphore's payload as a new POSIX file descriptor (opaque fd).

        The caller owns the fd and must close it (``os.close``) or hand it to CUDA, which takes
        ownership on a successful import: as ``TIMELINE_SEMAPHORE_FD`` for a timeline semaphore,
        ``OPAQUE_FD`` for a binary one. Each call returns a distinct fd to the same payload.
        Raises :class:`anyio.ClosedResourceError` after close, :class:`VulkanError` on failure.
        """
        state = self._state
        device = state.device
        with device.locked():
            device.check_open_locked(state)
            if not device.exportable:
                raise VulkanUnavailableError(
                    f"{device.name!r} was opened without semaphore export support"
                )
            info = _new(
                VkSemaphoreGetFdInfoKHR,
                semaphore=state.handle,
                handleType=VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT,
            )
            fd = ctypes.c_int(-1)
            device.call("vkGetSemaphoreFdKHR", ctypes.byref(info), ctypes.byref(fd))
        if fd.value < 0:
            raise VulkanError("vkGetSemaphoreFdKHR returned no fd", status=VK_ERROR_UNKNOWN)
        return int(fd.value)

    @property
    def value(self) -> int:
        """The timeline counter's current value (``vkGetSemaphoreCounterValue``).

        Raises :class:`TypeError` for a binary semaphore, which has no host-visible state.
        """
        self._require_timeline("value", "track submit_signal()/submit_wait() pairs instead")
        state = self._state
        with state.device.locked():
            state.device.check_open_locked(state)
            return state.device.counter_value_locked(state.handle)

    def signal(self, value: int) -> None:
        """Set the timeline counter to ``value`` from the host (``vkSignalSemaphore``); does not
        block.

        ``value`` must be greater than the current value, lower than any queue signal of this
        semaphore still pending from :meth:`submit_signal`, and within the device's
        ``maxTimelineSemaphoreValueDifference``; otherwise :class:`ValueError`. A binary
        semaphore raises :class:`TypeError` (use :meth:`submit_signal`).
        """
        self._require_timeline("signal()", "use submit_signal(), which signals it from the queue")
        target = _check_u64("value", value)
        state = self._state
        device = state.device
        with device.locked():
            device.check_open_locked(state)
            current = device.counter_value_locked(state.handle)
            if target <= current:
                raise ValueError(
                    f"signal value {target} must be greater than the current value {current}"
                )
            pending = device.pending_signal_values_locked(state)
            if pending and target >= min(pending):
                raise ValueError(
                    f"signal value {target} must be lower than the value {min(pending)} of a "
                    "submit_signal() still pending on the queue; wait for it first"
                )
            self._check_difference_locked("signal value", target, current)
            info = _new(VkSemaphoreSignalInfo, semaphore=state.handle, value=target)
            device.call("vkSignalSemaphore", ctypes.byref(info))

    def wait(self, value: int, timeout: float | None = None) -> bool:
        """Block the calling thread until the timeline counter is >= ``value``
        (``vkWaitSemaphores``). Returns True when reached, False when ``timeout`` seconds passed
        first; ``timeout=None`` waits forever, 0 polls.

        Raises :class:`TypeError` for a binary semaphore (use :meth:`submit_wait`) or bad
        argument types, :class:`ValueError` for out-of-range values, :class:`VulkanError` on a
        lost device. Closing the semaphore meanwhile from another thread defers its destruction
        until this returns.
        """
        self._require_timeline("wait()", "use submit_wait(), which waits for it on the queue")
        target = _check_u64("value", value)
        timeout_ns = _timeout_ns(timeout)
        state = self._state
        device = state.device
        with device.lease(state):
            handles = (_ndh * 1)(state.handle)
            values = (_u64 * 1)(target)
            info = _new(VkSemaphoreWaitInfo, semaphoreCount=1, pSemaphores=handles, pValues=values)
            result = int(
                device.fns["vkWaitSemaphores"](device.device, ctypes.byref(info), timeout_ns)
            )
        if result == VK_TIMEOUT:
            return False
        _check("vkWaitSemaphores", result)
        return True

    def submit_signal(self, value: int | None = None) -> None:
        """Submit an empty batch to the device's queue that signals this semaphore, as a
        renderer's frame submission would; returns without waiting for it to execute.

        A timeline semaphore needs ``value`` (greater than the current value and than any
        earlier pending queue signal); a binary one takes none and must not be signalled again
        before something waits on it. Raises :class:`TypeError` / :class:`ValueError` on misuse,
        :class:`anyio.ClosedResourceError` after close, :class:`VulkanError` on failure.
        """
        state = self._state
        if state.timeline:
            if value is None:
                raise TypeError("submit_signal() on a timeline semaphore needs a value")
            target = _check_u64("value", value)
        else:
            if value is not None:
                raise TypeError(
                    "a binary semaphore carries no value; call submit_signal() without one"
                )
            target = 0
        device = state.device
        with device.locked():
            device.check_open_locked(state)
            device.reap_locked()
            if state.timeline:
                self._check_new_signal_locked("value", target)
            device.submit_locked((), ((state, target),))

    def _check_new_signal_locked(self, what: str, target: int) -> None:
        state = self._state
        device = state.device
        current = device.counter_value_locked(state.handle)
        if target <= current:
            raise ValueError(
                f"{what} {target} must be greater than the semaphore's current value {current}"
            )
        pending = device.pending_signal_values_locked(state)
        if pending and target <= max(pending):
            raise ValueError(
                f"{what} {target} must be greater than the value {max(pending)} of an earlier "
                "submit_signal() still pending on the queue"
            )
        self._check_difference_locked(what, target, current)

    def submit_wait(
        self,
        value: int | None = None,
        *,
        then_signal: VulkanSemaphore | None = None,
        then_signal_value: int | None = None,
    ) -> None:
        """Submit an empty batch that makes the device's queue wait (at
        ``VK_PIPELINE_STAGE_ALL_COMMANDS_BIT``) until this semaphore is signalled: a timeline
        semaphore until its counter is >= ``value``, a binary one (``value=None``) until its
        pending signal, which it then consumes. With ``then_signal``, the same batch signals
        that semaphore (to ``then_signal_value`` if it is a timeline) once the wait is over.

        Returns without waiting. A binary semaphore must already have a signal submitted
        (by :meth:`submit_signal` or by CUDA through an exported fd). Raises
        :class:`TypeError` / :class:`ValueError` on misuse,
        :class:`~aiocudasem.DeviceMismatchError` if ``then_signal`` belongs to another device,
        :class:`anyio.ClosedResourceError` after close, :class:`VulkanError` on failure.
        """
        state = self._state
        if state.timeline:
            if value is None:
                raise TypeError("submit_wait() on a timeline semaphore needs a value")
            wait_value = _check_u64("value", value)
        else:
            if value is not None:
                raise TypeError(
                    "a binary semaphore carries no value; call submit_wait() without one"
                )
            wait_value = 0
        other: _SemaphoreState | None = None
        signal_value = 0
        if then_signal is None:
            if then_signal_value is not None:
                raise TypeError("then_signal_value is only meaningful together with then_signal")
        else:
            if not isinstance(then_signal, VulkanSemaphore):
                raise TypeError(
                    f"then_signal must be a VulkanSemaphore, got {type(then_signal).__name__}"
                )
            other = then_signal._state
            if other.device is not state.device:
                raise DeviceMismatchError(
                    "then_signal belongs to another VulkanDevice; a batch can only use "
                    "semaphores of the device it is submitted to"
                )
            if other.timeline:
                if then_signal_value is None:
                    raise TypeError("then_signal is a timeline semaphore: give then_signal_value")
                signal_value = _check_u64("then_signal_value", then_signal_value)
            elif then_signal_value is not None:
                raise TypeError(
                    "then_signal is a binary semaphore, which carries no value; "
                    "leave then_signal_value unset"
                )
        device = state.device
        with device.locked():
            device.check_open_locked(state)
            if other is not None:
                device.check_open_locked(other)
            device.reap_locked()
            if state.timeline:
                current = device.counter_value_locked(state.handle)
                self._check_difference_locked("wait value", wait_value, current)
            if other is not None and other.timeline and then_signal is not None:
                then_signal._check_new_signal_locked("then_signal_value", signal_value)
            signals = ((other, signal_value),) if other is not None else ()
            device.submit_locked(((state, wait_value),), signals)

    def close(self) -> None:
        """Destroy the ``VkSemaphore`` (once no pending batch or host wait uses it). Idempotent.

        Exported fds and CUDA imports of the payload stay valid.
        """
        self._finalizer.detach()
        state = self._state
        with state.device.locked():
            state.device.close_semaphore_locked(state)

    def __enter__(self) -> VulkanSemaphore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "timeline" if self._state.timeline else "binary"
        status = "closed" if self.closed else "open"
        return f"<VulkanSemaphore {kind} on {self._device.name!r} {status}>"
