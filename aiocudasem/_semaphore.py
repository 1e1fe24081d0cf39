"""External semaphores: import, the GPU-side wait and signal entries, and host-side awaits."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

import anyio
import anyio.lowlevel

from . import _log, _release
from ._abandon import Abandonable
from ._checks import check_device, check_open_fd, check_ordinal, check_uint, resolve_driver
from ._driver import Driver, SemaphoreDesc, SemOp
from ._errors import AiocudasemError, CudaError, UnsupportedHandleTypeError
from ._handles import HandleInfo, HandleType, info
from ._notifier import host_wait_streams, reserve_host_wait_stream, wait_private_stream
from ._timeline import LIMIT, HostTimeline

if TYPE_CHECKING:
    from typing import Self

__all__ = (
    "ExternalSemaphore",
    "Signal",
    "Wait",
    "import_semaphore",
    "resolve_driver",
)

_U64: Final = 1 << 64
_U32: Final = 1 << 32
_INFINITE: Final = 0xFFFFFFFF  # Windows' INFINITE, the keyed mutex's "never time out"
_WAIT_SKIP_NVSCIBUF_MEMSYNC: Final = 0x2
_SIGNAL_SKIP_NVSCIBUF_MEMSYNC: Final = 0x1
_NOT_SUPPORTED: Final = 801
_E = TypeVar("_E", "Wait", "Signal")


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
    with :meth:`wait_value` / :meth:`wait_signaled`. Release it with ``aclose()``, ``close()``
    or ``async with``; a forgotten one is destroyed when collected, with a
    ``ResourceWarning``. Closing it wakes the tasks parked in its host waits with
    ``anyio.ClosedResourceError``. If its producer is gone, :meth:`abandon` releases the
    streams that wait on it.
    """

    __slots__ = ("_settle", "_type")
    _type: HandleType
    #: What must end before the semaphore is destroyed: the signals of abandon().
    _settle: list[Callable[[], None]]
    _factory = "use aiocudasem.import_semaphore() to import an external semaphore"
    _noun = "external semaphore"

    @classmethod
    def _create(cls, driver: Driver, device: int, handle: int, handle_type: HandleType) -> Self:
        self = object.__new__(cls)
        self._driver = driver
        self._device = device
        self._type = handle_type
        self._init_waits(binary=info(handle_type).sync == "binary")
        self._settle = []
        # The deferred release may run on an event loop's thread: destroy off it (see aclose).
        self._own(handle, partial(_destroy_in_thread, driver, handle, self._settle))
        return self

    def _describe(self) -> str:
        return (
            f"aiocudasem.ExternalSemaphore {self._handle:#x} ({self._type.name}, "
            f"device {self._device})"
        )

    def _release(self) -> None:
        _destroy_in_thread(self._driver, self._handle, self._settle)

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

    def close(self) -> None:
        """Destroy the imported semaphore without waiting: a worker thread destroys it as soon
        as the device allows (see :meth:`aclose`). Idempotent."""
        super().close()

    async def aclose(self) -> None:
        """Destroy the imported semaphore. Idempotent, and always a checkpoint.

        Waits and signals already enqueued must have completed: CUDA requires it. The
        semaphore's underlying object (the Vulkan one, say) is not affected.

        ``cuDestroyExternalSemaphore`` waits until the device has no blocked work (seen on an
        H200: it did not return while any stream waited on an external semaphore), so it runs
        in a thread of its own and this waits for it without blocking the event loop. Tasks
        parked in :meth:`wait_value` or :meth:`wait_signaled` are woken at once with
        ``anyio.ClosedResourceError``, but their GPU waits stay enqueued: if the producer is
        gone, call :meth:`abandon` first, or this waits for ever (it logs a WARNING that says
        so after a few seconds). Cancelling abandons the wait for the thread; the semaphore is
        still destroyed once the device allows it.
        """
        if not self._claim():
            await anyio.lowlevel.checkpoint()
            return
        await _release.in_worker(
            partial(_destroy, self._driver, self._handle, self._settle),
            self._describe(),
            partial(_destroy_in_thread, self._driver, self._handle, self._settle),
        )

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


def _destroy(driver: Driver, handle: int, settle: list[Callable[[], None]]) -> None:
    """Destroy once the signals of abandon() are done: CUDA requires every signal of a
    semaphore to have completed before it is destroyed."""
    while settle:
        settle.pop()()
    driver.destroy_semaphore(handle)


def _destroy_in_thread(driver: Driver, handle: int, settle: list[Callable[[], None]]) -> None:
    _release.in_thread(partial(_destroy, driver, handle, settle), "an ExternalSemaphore")


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
    :class:`CudaError` if the driver rejects the handle, and :class:`DriverUnavailableError`
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


@dataclass(frozen=True, slots=True)
class Wait:
    """One semaphore wait entry for :meth:`Stream.enqueue_wait`, hand-off sections and
    :func:`wait_external_semaphores`.

    - timeline/fence semaphores: ``value`` is the value to wait for (uint64), and is required:
      ``Wait(sem, n)``;
    - binary semaphores: no ``value``; the wait consumes one signal: ``Wait(sem)``;
    - keyed mutexes: no ``value``; ``key`` to acquire with and ``timeout_ms`` (``None`` waits
      forever);
    - NvSciSync: no ``value``; ``nvsci_fence`` is the address of an ``NvSciSyncFence``, and
      ``skip_nvscibuf_memsync`` skips the NvSciBuf memory synchronisation;
    - a :class:`HostTimeline`: ``value`` is required, in [0, 2**63): ``Wait(timeline, n)``.

    The entry is checked when it is made: ``TypeError`` for a field of the wrong type or a
    timeline wait without a value, ``ValueError`` for a field out of range or one that does not
    apply to the semaphore's type, and ``anyio.ClosedResourceError`` for a closed semaphore.
    A number is an ``int`` (a ``bool`` is refused).
    """

    #: The semaphore to wait on, or a :class:`HostTimeline`. The entry keeps it alive.
    semaphore: ExternalSemaphore | HostTimeline
    #: The value to wait for, in [0, 2**64) (a host timeline's in [0, 2**63)): required for
    #: timelines and fences, ``None`` for the other types.
    value: int | None = None
    #: The key to acquire a keyed mutex with, in [0, 2**64); 0 for the other types.
    key: int = 0
    #: How long a keyed mutex's acquire may wait, in milliseconds, in [0, 0xFFFFFFFF); ``None``
    #: waits forever. Keyed mutexes only.
    timeout_ms: int | None = None
    #: The address of an ``NvSciSyncFence``; NvSciSync only, 0 for the other types.
    nvsci_fence: int = 0
    #: Sets ``CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC``; NvSciSync only.
    skip_nvscibuf_memsync: bool = False

    def __post_init__(self) -> None:
        kind = _check_entry("Wait", self.semaphore, self.value, self.key, self.nvsci_fence)
        if self.timeout_ms is not None:
            if kind is None or info(kind).sync != "keyed_mutex":
                raise ValueError("timeout_ms applies to keyed mutexes only")
            check_uint("timeout_ms", self.timeout_ms, _INFINITE)
        _check_skip(kind, self.skip_nvscibuf_memsync)

    def _op(self) -> SemOp:
        return SemOp(
            self.semaphore.handle,
            value=self.value or 0,
            key=self.key,
            timeout_ms=_INFINITE if self.timeout_ms is None else self.timeout_ms,
            nvsci_fence=self.nvsci_fence,
            flags=_WAIT_SKIP_NVSCIBUF_MEMSYNC if self.skip_nvscibuf_memsync else 0,
        )


@dataclass(frozen=True, slots=True)
class Signal:
    """One semaphore signal entry for :meth:`Stream.enqueue_signal` and hand-off sections.

    Timeline/fence semaphores are set to ``value``, which is required: ``Signal(sem, n)``.
    Binary ones are signalled and take no value: ``Signal(sem)``. Keyed mutexes are released
    with ``key``; NvSciSync takes ``nvsci_fence``. A :class:`HostTimeline` is written
    ``value``, in [0, 2**63). Checked when made, as :class:`Wait` is:
    ``TypeError`` for a field of the wrong type or a timeline signal without a value,
    ``ValueError`` for a field out of range or one that does not apply to the semaphore's
    type, and ``anyio.ClosedResourceError`` for a closed semaphore.
    """

    #: The semaphore to signal, or a :class:`HostTimeline`. The entry keeps it alive.
    semaphore: ExternalSemaphore | HostTimeline
    #: The value to set, in [0, 2**64) (a host timeline's in [0, 2**63)): required for
    #: timelines and fences, ``None`` for the other types.
    value: int | None = None
    #: The key to release a keyed mutex with, in [0, 2**64); 0 for the other types.
    key: int = 0
    #: The address of an ``NvSciSyncFence``; NvSciSync only, 0 for the other types.
    nvsci_fence: int = 0
    #: Sets ``CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC``; NvSciSync only.
    skip_nvscibuf_memsync: bool = False

    def __post_init__(self) -> None:
        kind = _check_entry("Signal", self.semaphore, self.value, self.key, self.nvsci_fence)
        _check_skip(kind, self.skip_nvscibuf_memsync)

    def _op(self) -> SemOp:
        return SemOp(
            self.semaphore.handle,
            value=self.value or 0,
            key=self.key,
            nvsci_fence=self.nvsci_fence,
            flags=_SIGNAL_SKIP_NVSCIBUF_MEMSYNC if self.skip_nvscibuf_memsync else 0,
        )


def _check_entry(
    entry: str, sem: object, value: int | None, key: int, nvsci_fence: int
) -> HandleType | None:
    """Check an entry's fields against its semaphore; return the semaphore's handle type, or
    None for a host timeline."""
    if isinstance(sem, HostTimeline):
        sem._check_usable(f"{entry}()")
        if value is None:
            raise TypeError(
                f"a host timeline is a timeline: {entry}(timeline, value) needs the value to "
                + ("wait for" if entry == "Wait" else "set")
            )
        check_uint("a host timeline's value", value, LIMIT)
        if key or nvsci_fence:
            raise ValueError(f"key and nvsci_fence do not apply to a host timeline's {entry}")
        return None
    if not isinstance(sem, ExternalSemaphore):
        raise TypeError(
            f"{entry}() needs an ExternalSemaphore or a HostTimeline, not "
            f"{type(sem).__name__}: import one with aiocudasem.import_semaphore() or create "
            "one with aiocudasem.create_host_timeline()"
        )
    sem._check_usable(f"{entry}()")
    kind = sem.handle_type
    sync = info(kind).sync
    if sync == "fence":
        if value is None:
            raise TypeError(
                f"{kind.name} semaphores are timelines: {entry}(sem, value) needs the value "
                "to " + ("wait for" if entry == "Wait" else "set")
            )
        check_uint("value", value, _U64)
    elif value is not None:
        raise ValueError(
            f"{kind.name} semaphores take no value (only timelines and fences do): use {entry}(sem)"
        )
    check_uint("key", key, _U64)
    check_uint("nvsci_fence", nvsci_fence, _U64)
    if key and sync != "keyed_mutex":
        raise ValueError("key applies to keyed mutexes only")
    if nvsci_fence and sync != "nvscisync":
        raise ValueError("nvsci_fence applies to NVSCISYNC semaphores only")
    return kind


def _check_skip(kind: HandleType | None, skip: bool) -> None:
    if not isinstance(skip, bool):
        raise TypeError("skip_nvscibuf_memsync must be a bool")
    if skip and (kind is None or info(kind).sync != "nvscisync"):
        raise ValueError("skip_nvscibuf_memsync applies to NVSCISYNC semaphores only")


def driver_label(driver: Driver, other: Driver) -> str:
    """How an error message names ``driver`` beside ``other``: by name, and also by identity
    where both have the same name (two ``SimDriver()`` objects are both called "sim")."""
    if driver.name != other.name:
        return f"the {driver.name} driver"
    return f"the {driver.name} driver object at {id(driver):#x}"


def entry_list(where: str, given: tuple[object, ...], kind: type[_E]) -> tuple[_E, ...]:
    """The entries of a call that takes :class:`Wait` or :class:`Signal` entries, in one of
    its forms: one entry, several entries as separate arguments, or one sequence of them.
    ``where`` names the argument in the messages."""
    name = kind.__name__
    items = given
    if len(given) == 1 and isinstance(given[0], Sequence):
        items = tuple(given[0])
    entries: list[_E] = []
    for e in items:
        if not isinstance(e, kind):
            got = type(e).__name__
            if isinstance(e, Sequence) and items is given:
                got += " beside other entries (give separate entries or one list, not both)"
            raise TypeError(
                f"{where} takes aiocudasem.{name} entries: one {name}, several {name} entries "
                f"as separate arguments, or one list or tuple of them; got {got}"
            )
        entries.append(e)
    if not entries:
        raise ValueError(f"{where} needs at least one aiocudasem.{name} entry")
    return tuple(entries)


def check_same_device(entries: tuple[Wait | Signal, ...], driver: Driver, device: int) -> None:
    from ._errors import DeviceMismatchError

    for e in entries:
        sem = e.semaphore
        if sem._driver is not driver:
            raise DeviceMismatchError(
                f"{sem!r} belongs to {driver_label(sem._driver, driver)}, but the stream "
                f"belongs to {driver_label(driver, sem._driver)}: a stream and the semaphores "
                "it waits on or signals must come from one driver"
            )
        if sem._device != device:
            raise DeviceMismatchError(
                f"{sem!r} belongs to device {sem._device}, but the stream is on device "
                f"{device}: "
                + (
                    "open the host timeline on the stream's device"
                    if isinstance(sem, HostTimeline)
                    else "import the semaphore into the stream's device"
                )
            )


def split_entries(
    entries: tuple[Wait, ...] | tuple[Signal, ...],
) -> tuple[list[SemOp], list[tuple[HostTimeline, int]]]:
    """The entries' operations: those on external semaphores (one driver batch) and those on
    host timelines (one memory operation each)."""
    ops: list[SemOp] = []
    words: list[tuple[HostTimeline, int]] = []
    for e in entries:
        sem = e.semaphore
        if isinstance(sem, HostTimeline):
            words.append((sem, e.value or 0))
        else:
            ops.append(e._op())
    return ops, words


async def _host_wait(entries: list[Wait], key: object = None) -> None:
    sem = entries[0].semaphore
    drv = sem._driver
    ops = [e._op() for e in entries]

    def enqueue(stream: int) -> None:
        drv.enqueue_semaphore_waits(ops, stream)
        for e in entries:
            e.semaphore._note_wait(e.value, stream)

    await wait_private_stream(drv, sem._device, enqueue, key)
