"""The Vulkan objects behind an open device and its semaphores, and the lock that guards them.

The public objects are thin wrappers around these states so that weakref.finalize callbacks
can reference the state without keeping the wrappers alive.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import anyio

from .._errors import VulkanError, VulkanUnavailableError
from ._abi import (
    _DEVICE_COMMANDS,
    _INSTANCE_COMMANDS,
    _TIMELINE_COMMANDS,
    VK_ERROR_UNKNOWN,
    VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT,
    VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME,
    VK_KHR_TIMELINE_SEMAPHORE_EXTENSION_NAME,
    VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
    VK_SEMAPHORE_TYPE_BINARY,
    VK_SEMAPHORE_TYPE_TIMELINE,
    VK_TIMEOUT,
    VK_TRUE,
    VK_UUID_SIZE,
    VkDeviceCreateInfo,
    VkDeviceQueueCreateInfo,
    VkExportSemaphoreCreateInfo,
    VkPhysicalDeviceTimelineSemaphoreFeatures,
    VkSemaphoreCreateInfo,
    VkSemaphoreTypeCreateInfo,
    VkSemaphoreWaitInfo,
    VkSubmitInfo,
    VkTimelineSemaphoreSubmitInfo,
    _chain,
    _ndh,
    _new,
    _ptr,
    _u32,
    _u64,
)
from ._loader import _bind, _check, _create_instance, _Fn, _load_loader, _prototype
from ._select import _Candidate, _enumerate_physical_devices, _probe, _select

# How long closing a device waits for its queue to finish the batches it was given before it
# gives up and leaks the VkDevice: destroying a device (or a semaphore) that a pending batch
# still uses is undefined behaviour, and a batch that waits for a semaphore nobody will signal
# never finishes.
_CLOSE_DRAIN_TIMEOUT_S: float = 5.0


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


# ---------------------------------------------------------------------------------------------
# Opening: the instance, the chosen device and its commands; whatever was created is destroyed
# again if a later step fails.


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
