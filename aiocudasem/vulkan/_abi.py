"""The part of ``vulkan_core.h`` this package uses, mirrored in :mod:`ctypes`.

Constants keep their C names, structures their C type names, and every command is described
by its C signature, so that tests/test_vulkan_layout.py can compile a probe from these
registries and compare each value, size, offset and signature with the real header. Nothing
here loads the Vulkan loader.
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any, Final, TypeVar

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

#: (C name, Python value) of every constant this package relies on: each ``VK_`` name defined
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


# Packed versions decode as VK_API_VERSION_MAJOR/MINOR/PATCH do (the variant bits are ignored).


def _version_text(version: int) -> str:
    return f"{(version >> 22) & 0x7F}.{(version >> 12) & 0x3FF}.{version & 0xFFF}"


def _major_minor(version: int) -> tuple[int, int]:
    return ((version >> 22) & 0x7F, (version >> 12) & 0x3FF)


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


#: (C name, ctypes class) of every structure this package passes to Vulkan.
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
