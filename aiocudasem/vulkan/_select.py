"""Enumerating the physical devices, probing what each one can do, and picking one.

Every device is probed before one is picked, so that when none fits the error can list each
device found and what it lacks.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Final

from .._errors import VulkanUnavailableError
from ._abi import (
    _U64_MAX,
    VK_EXTERNAL_SEMAPHORE_FEATURE_EXPORTABLE_BIT,
    VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT,
    VK_INCOMPLETE,
    VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME,
    VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME,
    VK_PHYSICAL_DEVICE_TYPE_CPU,
    VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU,
    VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
    VK_PHYSICAL_DEVICE_TYPE_OTHER,
    VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU,
    VK_QUEUE_COMPUTE_BIT,
    VK_QUEUE_GRAPHICS_BIT,
    VK_QUEUE_TRANSFER_BIT,
    VK_SEMAPHORE_TYPE_TIMELINE,
    VK_TRUE,
    VkExtensionProperties,
    VkExternalSemaphoreProperties,
    VkPhysicalDeviceExternalSemaphoreInfo,
    VkPhysicalDeviceFeatures2,
    VkPhysicalDeviceIDProperties,
    VkPhysicalDeviceProperties,
    VkPhysicalDeviceProperties2,
    VkPhysicalDeviceTimelineSemaphoreFeatures,
    VkPhysicalDeviceTimelineSemaphoreProperties,
    VkQueueFamilyProperties,
    VkSemaphoreTypeCreateInfo,
    _chain,
    _major_minor,
    _new,
    _ptr,
    _u32,
    _version_text,
)
from ._loader import _NO_DRIVER_HINT, _NO_DRIVER_RESULTS, _check, _Fn, _unavailable


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
