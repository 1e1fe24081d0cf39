"""External semaphores: import, abandon and host-side awaits. The entries that name them in
GPU-side waits and signals, :class:`Wait` and :class:`Signal`, are in ``_entries``."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final

from . import _log, _release
from ._abandon import Abandonable
from ._checks import check_device, check_open_fd, check_ordinal, check_uint, resolve_driver
from ._driver import Driver, SemaphoreDesc, SemOp
from ._entries import Wait
from ._errors import AiocudasemError, CudaError, UnsupportedHandleTypeError
from ._handles import HandleInfo, HandleType, info
from ._notifier import host_wait_streams, reserve_host_wait_stream, wait_private_stream

if TYPE_CHECKING:
    from typing import Self

__all__ = (
    "ExternalSemaphore",
    "import_semaphore",
    "resolve_driver",
)

_U64: Final = 1 << 64
_U32: Final = 1 << 32
_NOT_SUPPORTED: Final = 801
#: What the driver answers for an fd that is not a semaphore exported with the handle type
#: given: CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_OPERATING_SYSTEM.
_REJECTED_FD: Final = (1, 400, 304)


def _platform_check(handle_type: HandleType, row: HandleInfo) -> None:
    if not row.available:
        raise UnsupportedHandleTypeError(
            f"{handle_type.name} handles exist only on Windows; on {sys.platform} import an "
            "fd with HandleType.TIMELINE_SEMAPHORE_FD or HandleType.OPAQUE_FD"
        )


class ExternalSemaphore(Abandonable):
    """A semaphore created outside CUDA (Vulkan, D3D, NvSciSync, another process) and imported
    into a device. Get one from :func:`import_semaphore`; there is no public constructor.

    Use it in :class:`Wait` and :class:`Signal` entries on a stream, or await it from the host
    with :meth:`wait_value` / :meth:`wait_signaled`. If its producer is gone, :meth:`abandon`
    releases the streams that wait on it.

    Release it with ``aclose()``, ``close()`` or ``async with``; a forgotten one is destroyed
    when collected, with a ``ResourceWarning``. Waits and signals already enqueued must have
    completed first: CUDA requires it. The semaphore's underlying object (the Vulkan one, say)
    is not affected. ``cuDestroyExternalSemaphore`` waits until the device has no blocked work
    (seen on an H200: it did not return while any stream waited on an external semaphore), so
    a thread of its own destroys it: ``close()`` returns at once, and ``aclose()`` waits for
    that thread without blocking the event loop. Closing it wakes the tasks parked in
    :meth:`wait_value` or :meth:`wait_signaled` at once with ``anyio.ClosedResourceError``, but
    their GPU waits stay enqueued: if the producer is gone, call :meth:`abandon` first, or
    ``aclose()`` waits for ever (it logs a WARNING that says so after a few seconds).
    Cancelling ``aclose()`` abandons the wait for the thread; the semaphore is still destroyed
    once the device allows it.
    """

    __slots__ = ("_settle", "_type")
    _type: HandleType
    #: What must end before the semaphore is destroyed: the signals of abandon().
    _settle: list[Callable[[], None]]
    _factory = "use aiocudasem.import_semaphore() to import an external semaphore"
    _noun = "external semaphore"
    _destroy_blocks = True  # cuDestroyExternalSemaphore waits until no stream is blocked

    @staticmethod
    def _destroy(driver: Driver, handle: int, settle: list[Callable[[], None]]) -> None:
        """Destroy once the signals of abandon() are done: CUDA requires every signal of a
        semaphore to have completed before it is destroyed."""
        while settle:
            settle.pop()()
        driver.destroy_semaphore(handle)

    @classmethod
    def _create(cls, driver: Driver, device: int, handle: int, handle_type: HandleType) -> Self:
        self = object.__new__(cls)
        self._driver = driver
        self._device = device
        self._type = handle_type
        self._init_waits(binary=info(handle_type).sync == "binary")
        self._settle = []
        self._own(handle, driver, handle, self._settle)
        return self

    def _describe(self) -> str:
        return (
            f"aiocudasem.ExternalSemaphore {self._handle:#x} ({self._type.name}, "
            f"device {self._device})"
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle={self._handle:#x}"
        return f"<ExternalSemaphore {self._type.name} device={self._device} {state}>"

    @property
    def handle_type(self) -> HandleType:
        """The :class:`HandleType` it was imported as."""
        return self._type

    @property
    def is_timeline(self) -> bool:
        """True for fence-like semaphores (a wait completes at value >= N), False for binary
        ones (one wait per signal), keyed mutexes and NvSciSync objects."""
        return info(self._type).sync == "fence"

    def abandon(self, value: int | None = None) -> None:
        """Give up on the producer: release every GPU wait on this semaphore, from this side.

        For a producer that died (a killed process, a torn-down Vulkan device, a thread that
        stopped) or that you no longer wait for. Enqueued GPU waits cannot be taken back, so
        this satisfies them: it enqueues, on a private stream, a signal of

        - a timeline: ``value``, by default the highest value that a wait enqueued through
          this library asked for;
        - a binary semaphore: one signal for each wait enqueued through this library beyond
          the signals it enqueued (``value`` must be ``None``).

        Streams blocked on it then go on, and their work runs without the producer's data. The
        semaphore is *abandoned* from then on: tasks parked in :meth:`wait_value` and
        :meth:`wait_signaled` raise :class:`~aiocudasem.AbandonedError` at once, and so do new
        ``Wait`` and ``Signal`` entries of it, new host waits, and the exit of a hand-off
        section that waited on it. ``aclose()`` then completes without the producer.

        The signal goes to the semaphore that the producer shares: a producer that is still
        alive sees it too (stop it first), and one that signals a lower value afterwards
        breaks the rule of timelines that values only grow. Synchronous, non-blocking, safe
        from any thread, and idempotent (a second call changes nothing). Raises
        ``anyio.ClosedResourceError`` once closed, ``ValueError``/``TypeError`` for a bad
        ``value``, :class:`UnsupportedHandleTypeError` for keyed mutexes and NvSciSync (the
        consumer cannot signal them in their producer's place), and :class:`CudaError` if the
        driver refuses the signal (the semaphore is abandoned all the same).
        """
        handle = self.handle
        sync = info(self._type).sync
        if sync == "fence":
            target = self._max_waited if value is None else check_uint("value", value, _U64)
        elif sync == "binary":
            if value is not None:
                raise ValueError(
                    f"{self._type.name} semaphores are binary: abandon() takes no value"
                )
            target = 0
        else:
            raise UnsupportedHandleTypeError(
                f"abandon() cannot signal a {self._type.name} semaphore in its producer's place"
            )
        if self.abandoned:
            return
        drv, device = self._driver, self._device
        try:
            if sync == "binary":
                pending, self._binary_pending = self._binary_pending, []
                if pending:
                    # Binary signals do not add up: each must be consumed before the next is
                    # given, so a thread gives them one at a time (see _signal_each).
                    thread = threading.Thread(
                        target=_signal_each,
                        args=(drv, device, handle, pending),
                        name="aiocudasem-abandon",
                        daemon=True,
                    )
                    thread.start()
                    self._settle.append(thread.join)
            elif target:
                stream = host_wait_streams.take(drv, device)
                try:
                    drv.enqueue_semaphore_signals([SemOp(handle, value=target)], stream)
                    event = drv.event_create(device, blocking=True)
                    drv.event_record(event, stream)
                finally:
                    host_wait_streams.give(drv, device, stream)
                self._settle.append(partial(_sync_and_destroy, drv, event))
        finally:
            self._give_up()

    # -------------------------------------------------------------- host-side awaits

    async def wait_value(self, value: int) -> None:
        """Wait, from the host, until a timeline (fence) semaphore reaches ``value``.

        No thread blocks and nothing polls: the wait is enqueued on a private stream of the
        device, and the notifier reports when that stream passes it. If cancelled, the GPU
        wait stays enqueued on that private stream until the value is reached: the semaphore
        cannot be destroyed before then (``aclose()`` waits for it), so if the producer is
        gone, call :meth:`abandon`.

        Raises ``TypeError`` for a non-timeline semaphore, ``ValueError`` outside uint64,
        ``anyio.ClosedResourceError`` if the semaphore is closed before or during the wait, and
        :class:`~aiocudasem.AbandonedError` if it is abandoned before or during the wait.
        """
        self._check_waitable()
        if not self.is_timeline:
            raise TypeError(
                f"wait_value() needs a timeline semaphore; this one is {self._type.name}: "
                "use wait_signaled() for a binary semaphore"
            )
        # A retry of the same value may go behind an abandoned wait's stream (it waits for no
        # less); a weak reference, so that the pool of parked streams keeps no semaphore.
        key = (weakref.ref(self), value)
        await self._park(partial(_host_wait, [Wait(self, value)], key))

    async def wait_signaled(self) -> None:
        """Wait, from the host, until a binary (OPAQUE_FD/Win32) semaphore is signalled, and
        consume that signal, as a GPU wait does.

        Cancellation cannot take back the enqueued GPU wait: it will still consume the next
        signal. Raises ``TypeError`` for a timeline semaphore, ``anyio.ClosedResourceError``
        if the semaphore is closed before or during the wait, and
        :class:`~aiocudasem.AbandonedError` if it is abandoned before or during the wait.
        """
        self._check_waitable()
        if info(self._type).sync != "binary":
            raise TypeError(
                f"wait_signaled() needs a binary semaphore; this one is {self._type.name}: "
                "use wait_value(n) for a timeline semaphore"
            )
        await self._park(partial(_host_wait, [Wait(self)]))


def _sync_and_destroy(driver: Driver, event: int) -> None:
    try:
        driver.event_synchronize(event)
    finally:
        driver.event_destroy(event)


#: How long abandon() of a binary semaphore waits for each of its signals to be consumed
#: before it gives the next one anyway, and how long it goes on in all.
_CONSUMED_WITHIN: Final = 0.05
_SIGNALLING_FOR: Final = 5.0


def _signal_each(driver: Driver, device: int, handle: int, pending: list[int]) -> None:
    """abandon() of a binary semaphore, in a thread of its own: signal it until every wait of
    ``pending`` (an event recorded behind each) has passed, one signal at a time."""
    stream = 0
    try:
        stream = host_wait_streams.take(driver, device)
        give_up_at = time.monotonic() + _SIGNALLING_FOR
        left = [e for e in pending if not driver.event_query(e)]
        while left and time.monotonic() < give_up_at:
            driver.enqueue_semaphore_signals([SemOp(handle)], stream)
            consumed_by = time.monotonic() + _CONSUMED_WITHIN
            before = len(left)
            while len(left) == before and time.monotonic() < consumed_by:
                time.sleep(0.0002)
                left = [e for e in left if not driver.event_query(e)]
        if left:
            _log.logger.warning(
                "abandon() of a binary semaphore: %d of its waits were still pending after "
                "%.0f s of signals; the streams behind them stay blocked",
                len(left),
                _SIGNALLING_FOR,
            )
    except AiocudasemError:
        pass  # a faulted device: its streams are gone with it
    finally:
        if stream:
            host_wait_streams.give(driver, device, stream)
        for e in pending:
            try:
                driver.event_destroy(e)
            except AiocudasemError:
                pass


def import_semaphore(
    handle_type: HandleType | int,
    handle: int | None = None,
    *,
    name: str | None = None,
    device: int = 0,
    driver: Driver | str | None = None,
) -> ExternalSemaphore:
    """Import an external semaphore into ``device``. Synchronous and non-blocking.

    ``handle`` is the fd for ``TIMELINE_SEMAPHORE_FD`` and ``OPAQUE_FD``, the Win32 ``HANDLE``
    for the Win32 and D3D types, and the ``NvSciSyncObj`` address for ``NVSCISYNC``. Win32
    types that allow it may be opened by ``name`` instead.

    **fd ownership.** On success the driver owns the fd: do not use or close it again. On
    failure the fd is still yours, open and unchanged.

    Raises ``TypeError``/``ValueError`` for bad arguments (a closed fd among them),
    :class:`UnsupportedHandleTypeError` where the platform cannot provide the type,
    :class:`CudaError` if the driver rejects the handle (for an fd that is no such semaphore,
    the message says so), and :class:`DriverUnavailableError`
    if the driver cannot run.
    """
    if isinstance(handle_type, bool) or not isinstance(handle_type, int):
        raise TypeError(
            f"handle_type must be an aiocudasem.HandleType, not {type(handle_type).__name__}"
        )
    try:
        kind = HandleType(handle_type)
    except ValueError:
        raise ValueError(
            f"unknown handle type {handle_type!r}: use a member of aiocudasem.HandleType"
        ) from None
    check_ordinal(device)
    if device < 0:
        raise ValueError(f"device must be an ordinal >= 0, not {device}")
    desc, name_buf = _descriptor(kind, handle, name)
    drv = resolve_driver(driver)
    _release.flush()
    check_device(drv, device)
    try:
        sem = drv.import_semaphore(device, desc)
    except CudaError as exc:
        if exc.status == _NOT_SUPPORTED:
            raise UnsupportedHandleTypeError(
                f"the {drv.name} driver cannot import {kind.name} semaphores here: {exc}",
                exc.status,
            ) from None
        if exc.status in _REJECTED_FD and info(kind).passed_as == "fd":
            raise exc._explained(
                f"fd {handle} is not a semaphore exported as {kind.name} (from Vulkan: "
                "vkGetSemaphoreFdKHR with the matching handleType); the fd is still yours, "
                "open and unchanged"
            ) from None
        raise
    finally:
        del name_buf  # the driver copies the name during the call
    imported = ExternalSemaphore._create(drv, device, sem, kind)
    reserve_host_wait_stream(drv, device)  # for its first host-side wait
    return imported


def _descriptor(
    kind: HandleType, handle: int | None, name: str | None
) -> tuple[SemaphoreDesc, ctypes.Array[ctypes.c_wchar] | None]:
    """Check ``handle``/``name`` against the handle type's row and build the descriptor. The
    name buffer, if any, must stay alive until the driver has copied it."""
    row = info(kind)
    if row.passed_as == "fd":
        if name is not None:
            raise ValueError(f"{kind.name} takes an fd, not a name")
        fd, _ = check_open_fd(handle)
        return SemaphoreDesc(int(kind), fd=fd), None
    if row.passed_as == "nvsci":
        if name is not None:
            raise ValueError("NVSCISYNC takes an NvSciSyncObj address, not a name")
        obj = check_uint("handle", handle, _U64)
        if obj == 0:
            raise ValueError("NVSCISYNC needs a non-NULL NvSciSyncObj")
        return SemaphoreDesc(int(kind), nvsci_obj=obj), None
    _platform_check(kind, row)
    if (handle is None) == (name is None):
        raise ValueError(f"{kind.name} needs exactly one of handle= and name=")
    if name is None:
        return SemaphoreDesc(int(kind), win32_handle=check_uint("handle", handle, _U64)), None
    if not row.by_name:
        raise ValueError(f"{kind.name} cannot be opened by name; pass handle=")
    if not isinstance(name, str) or not name:
        raise TypeError("name must be a non-empty str")
    name_buf = ctypes.create_unicode_buffer(name)
    return SemaphoreDesc(int(kind), win32_name=ctypes.addressof(name_buf)), name_buf


async def _host_wait(entries: list[Wait], key: object = None) -> None:
    sem = entries[0].semaphore
    drv = sem._driver
    ops = [e._op() for e in entries]

    def enqueue(stream: int) -> None:
        drv.enqueue_semaphore_waits(ops, stream)
        for e in entries:
            e.semaphore._note_wait(e.value, stream)

    await wait_private_stream(drv, sem._device, enqueue, key)
