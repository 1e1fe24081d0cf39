"""The entries of GPU-side waits and signals, :class:`Wait` and :class:`Signal`, checked when
they are made, and what a stream does with a call's entries: one entry, several, or one list of
them; the same driver and device as the stream; one driver batch for the external semaphores
and one memory operation per host timeline.

An entry names an external semaphore or a host timeline, the two kinds of
``_abandon.Abandonable``. ``_semaphore`` imports this module (its host waits are entries, and
``_graphs`` finds the entries there), so this one tells the two apart by that base and by
``HostTimeline``, and imports ``ExternalSemaphore`` for type checking only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar, cast

from ._abandon import Abandonable
from ._checks import check_uint
from ._driver import SemOp
from ._errors import DeviceMismatchError
from ._handles import HandleType, info
from ._timeline import LIMIT, HostTimeline

if TYPE_CHECKING:
    from ._driver import Driver
    from ._semaphore import ExternalSemaphore

__all__ = (
    "Signal",
    "Wait",
    "check_same_device",
    "driver_label",
    "entry_list",
    "split_entries",
)

_U64: Final = 1 << 64
_INFINITE: Final = 0xFFFFFFFF  # Windows' INFINITE, the keyed mutex's "never time out"
_WAIT_SKIP_NVSCIBUF_MEMSYNC: Final = 0x2
_SIGNAL_SKIP_NVSCIBUF_MEMSYNC: Final = 0x1
_E = TypeVar("_E", "Wait", "Signal")


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
    if not isinstance(sem, Abandonable):
        raise TypeError(
            f"{entry}() needs an ExternalSemaphore or a HostTimeline, not "
            f"{type(sem).__name__}: import one with aiocudasem.import_semaphore() or create "
            "one with aiocudasem.create_host_timeline()"
        )
    # The base's one other kind (see the module's docstring).
    sem = cast("ExternalSemaphore", sem)
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


def entry_list(
    where: str,
    given: tuple[object, ...],
    kind: type[_E],
    *,
    separate: bool = False,
    empty: bool = False,
    swapped: str = "",
) -> tuple[_E, ...]:
    """The entries of a call that takes :class:`Wait` or :class:`Signal` entries, in one of
    its forms: one entry or one sequence of them, and, where the call takes them
    (``separate``, or more than one given), several entries as separate arguments.

    ``where`` names the argument in the messages. ``empty`` lets the call take no entries
    (else ``ValueError``). ``swapped`` is said when an entry of the other kind is given, a
    :class:`Signal` among waits or a :class:`Wait` among signals."""
    name = kind.__name__
    items = given
    if len(given) == 1 and isinstance(given[0], Sequence):
        items = tuple(given[0])
    forms = (
        f"one {name}, several as separate arguments, or one list or tuple of them"
        if separate or len(given) > 1
        else f"one {name} or one list or tuple of them"
    )
    entries: list[_E] = []
    for e in items:
        if not isinstance(e, kind):
            got = _got(e, kind, items is given, swapped)
            raise TypeError(f"{where} takes aiocudasem.{name} entries: {forms}; {got}")
        entries.append(e)
    if not entries and not empty:
        raise ValueError(f"{where} needs at least one aiocudasem.{name} entry")
    return tuple(entries)


def _got(e: object, kind: type[Wait | Signal], beside: bool, swapped: str) -> str:
    """What an entry of the wrong type was, and what to do about it."""
    name = kind.__name__
    got = type(e).__name__
    if isinstance(e, (Wait, Signal)):
        role = "wait" if kind is Wait else "signal"
        return f"a {got} was given as a {role}" + (f": {swapped}" if swapped else "")
    if isinstance(e, HostTimeline):
        return f"got a HostTimeline: make an entry of it, aiocudasem.{name}(timeline, value)"
    if isinstance(e, Abandonable):  # an ExternalSemaphore (see the module's docstring)
        return (
            f"got {got}: make an entry of it, aiocudasem.{name}(sem, value) for a timeline "
            f"semaphore or aiocudasem.{name}(sem) for a binary one"
        )
    if isinstance(e, Sequence) and beside:
        return f"got {got} beside other entries (give separate entries or one list, not both)"
    return f"got {got}"


def check_same_device(entries: tuple[Wait | Signal, ...], driver: Driver, device: int) -> None:
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
