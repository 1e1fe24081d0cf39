"""The public objects, :class:`VulkanDevice` and :class:`VulkanSemaphore`.

Each is a thin wrapper over its state in ``_state``: it checks its arguments first, then does its
Vulkan work under the device's lock, or under a lease for the host waits that must not hold it.
"""

from __future__ import annotations

import ctypes
import weakref

from .._errors import DeviceMismatchError, VulkanError, VulkanUnavailableError
from ._abi import (
    _U64_MAX,
    VK_ERROR_UNKNOWN,
    VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT,
    VK_TIMEOUT,
    VkSemaphoreGetFdInfoKHR,
    VkSemaphoreSignalInfo,
    VkSemaphoreWaitInfo,
    _ndh,
    _new,
    _u64,
)
from ._loader import _check, _check_u64, _check_uuid, _timeout_ns
from ._state import _DeviceState, _open_state, _SemaphoreState


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

    def block_until_idle(self) -> None:
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

    def block_until(self, value: int, timeout: float | None = None) -> bool:
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
        other, signal_value = self._check_then_signal(then_signal, then_signal_value)
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

    def _check_then_signal(
        self, then_signal: VulkanSemaphore | None, then_signal_value: int | None
    ) -> tuple[_SemaphoreState | None, int]:
        """The state of :meth:`submit_wait`'s ``then_signal`` (None without one) and the value
        to signal it to, checked before the device's lock is taken."""
        if then_signal is None:
            if then_signal_value is not None:
                raise TypeError("then_signal_value is only meaningful together with then_signal")
            return None, 0
        if not isinstance(then_signal, VulkanSemaphore):
            raise TypeError(
                f"then_signal must be a VulkanSemaphore, got {type(then_signal).__name__}"
            )
        other = then_signal._state
        if other.device is not self._state.device:
            raise DeviceMismatchError(
                "then_signal belongs to another VulkanDevice; a batch can only use "
                "semaphores of the device it is submitted to"
            )
        if other.timeline:
            if then_signal_value is None:
                raise TypeError("then_signal is a timeline semaphore: give then_signal_value")
            return other, _check_u64("then_signal_value", then_signal_value)
        if then_signal_value is not None:
            raise TypeError(
                "then_signal is a binary semaphore, which carries no value; "
                "leave then_signal_value unset"
            )
        return other, 0

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
