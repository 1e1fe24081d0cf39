"""Host timelines: a timeline semaphore that lives in host memory, with no Vulkan.

A :class:`HostTimeline` is a 64-bit counter in one page of shared memory (a sealed memfd),
page-locked and mapped for the GPU. The GPU waits on it with ``cuStreamWaitValue64`` and
writes it with ``cuStreamWriteValue64``; the host signals it with an atomic compare-and-swap
and reads it with an atomic load. It takes part in :class:`~aiocudasem.Wait` and
:class:`~aiocudasem.Signal` entries like an imported timeline semaphore, and another process
maps the same page from an fd (:meth:`HostTimeline.export_fd`, :func:`open_host_timeline`).

Releasing it must not pull the page from under the GPU: every enqueued operation on it is
followed by an event on its stream (one per stream, re-recorded), and the release waits for
those events before it unregisters and unmaps the page.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import stat
import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from . import _hostword
from ._abandon import Abandonable
from ._checks import check_open_fd, check_uint, resolve_device
from ._errors import AiocudasemError, DeviceFaultError, DriverUnavailableError
from ._notifier import reserve_host_wait_stream, wait_private_stream

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Self

    from ._driver import Driver

__all__ = ("HostTimeline", "create_host_timeline", "enqueue_words", "open_host_timeline")

#: A timeline's values: the GPU compares them cyclically, ``(int64_t)(current - value) >= 0``,
#: which is ``current >= value`` for every pair of values below 2**63.
LIMIT: Final = 1 << 63
_SIZE: Final = mmap.PAGESIZE  # the whole shared file: the value, then the marker
_MARKER_AT: Final = 8
_MARKER: Final = b"aiocudasem host timeline 1\0"
# No one may resize the shared file, not even its creator: a shrunk file would turn every
# access to the page into SIGBUS, in every process that maps it.
_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# The pages of detached timelines: kept mapped and registered until the process ends.
_detached: list[_Page] = []
# A timeline keeps one event per stream it was used on; past this many it drops those whose
# work has completed (a stream destroyed after a cancelled host wait is never used again).
_FENCES_KEPT: Final = 64


class _Page:
    """The shared page of one timeline in this process, and what guards it.

    ``lock`` orders every access to the page (host signals and loads, GPU enqueues) against
    its release, which sets ``closed`` under it: nothing touches the page after that."""

    __slots__ = ("address", "closed", "fd", "fences", "lock", "map", "view")

    def __init__(self, fd: int) -> None:
        self.map = mmap.mmap(fd, _SIZE)  # MAP_SHARED, readable and writable
        self.view: ctypes.c_uint64 | None = ctypes.c_uint64.from_buffer(self.map)
        self.address = ctypes.addressof(self.view)
        self.fd = fd
        self.lock = threading.RLock()  # re-entrant: signal() from a signal handler
        self.closed = False
        #: stream handle -> an event recorded after this timeline's last operation on it
        self.fences: dict[int, int] = {}

    def close_map(self) -> None:
        self.view = None  # the buffer export must end before the map can close
        self.map.close()

    def unmap(self) -> None:
        self.close_map()
        os.close(self.fd)


class HostTimeline(Abandonable):
    """A timeline semaphore in host memory: a 64-bit value that a CPU thread (or another
    process) signals and the GPU waits on, or the GPU signals and the host awaits. No Vulkan
    and no other API is involved. Make one with :func:`create_host_timeline`, or open one that
    another process shares with :func:`open_host_timeline`.

    - On a stream, it takes part in :class:`~aiocudasem.Wait` and :class:`~aiocudasem.Signal`
      entries, hand-off sections and :func:`~aiocudasem.wait_external_semaphores` like an
      imported timeline semaphore: ``Wait(t, n)`` makes later work wait until the value is at
      least ``n`` (``cuStreamWaitValue64``), ``Signal(t, n)`` writes ``n`` once earlier work is
      done (``cuStreamWriteValue64``).
    - On the host, :meth:`signal` moves the value forward from any thread, without a driver
      call (it may briefly wait for the timeline's lock), and :meth:`wait_value` awaits a
      value without polling, as an external semaphore's does.
    - Values are in [0, 2**63): the GPU compares them as signed 64-bit differences.

    ``handle`` is the device address of the value. Release it with ``aclose()``, ``close()``
    or ``async with``: the page is unregistered and unmapped once every operation enqueued on
    it has completed, so releasing it never pulls it from under the GPU (other processes keep
    theirs). That wait blocks, so a thread of its own releases it: ``close()`` returns at once,
    and ``aclose()`` waits for that thread without blocking the event loop (cancelling it
    leaves the release to the thread). Once released, this object signals nothing: a pending
    wait must be satisfied by another process or another object opened on the same page. A
    wait that can never be satisfied (its producer is gone) would hold the page forever, and
    ``aclose()`` with it: :meth:`abandon` first. Closing it wakes the tasks parked in
    :meth:`wait_value` with ``anyio.ClosedResourceError``.
    """

    __slots__ = ("_page",)
    _page: _Page
    #: The highest value. Signalling it releases every wait, GPU and host: the way to unblock
    #: streams whose producer is gone before releasing them.
    MAX: Final = LIMIT - 1
    _factory = "use aiocudasem.create_host_timeline() or aiocudasem.open_host_timeline()"
    _noun = "host timeline"
    _destroy_blocks = True  # waits until the GPU is done with the page

    @staticmethod
    def _destroy(driver: Driver, page: _Page) -> None:
        _release_page(driver, page)

    @classmethod
    def _create(cls, driver: Driver, device: int, fd: int) -> Self:
        """Map and register the page of ``fd``, which the timeline owns on success only."""
        page = _Page(fd)
        try:
            devptr = driver.host_register(device, page.address, _SIZE)
        except BaseException:
            page.close_map()  # the fd is the caller's until the timeline is made
            raise
        self = object.__new__(cls)
        self._driver = driver
        self._device = device
        self._page = page
        self._init_waits()
        self._own(devptr, driver, page)
        return self

    def _describe(self) -> str:
        return f"aiocudasem.HostTimeline at {self._page.address:#x} (device {self._device})"

    def __repr__(self) -> str:
        try:
            return f"<HostTimeline device={self._device} value={self.value}>"
        except anyio.ClosedResourceError:
            return f"<HostTimeline device={self._device} closed>"

    # -------------------------------------------------------------- host side

    def _check_open(self, message: str) -> None:
        """Raise ``anyio.ClosedResourceError`` with ``message`` once closed. Called with the
        page's lock held: the release marks the page closed under it, so the page stays
        mapped until the caller lets go."""
        if self._page.closed or not self._finalizer.alive:
            raise anyio.ClosedResourceError(message)

    @property
    def value(self) -> int:
        """The current value, read atomically. Raises ``anyio.ClosedResourceError`` once
        closed."""
        page = self._page
        with page.lock:
            self._check_open("the host timeline is closed")
            return _hostword.load(page.address)

    def signal(self, value: int) -> None:
        """Set the value to ``value`` from the host: GPU waits for ``value`` or less may go on,
        and so may host waits. Thread-safe, and makes no driver call: an atomic
        compare-and-swap, under the timeline's lock, which an enqueue of one of its entries on
        another thread holds for the length of that driver call. A producer thread may call it;
        so may a signal handler (the lock is re-entrant).

        What this thread wrote to memory before the call is visible to whoever sees the new
        value. Signalling the current value again does nothing. Raises ``ValueError`` for a
        value lower than the current one (a timeline never goes back) or outside [0, 2**63),
        ``TypeError`` for a value that is not an int, and ``anyio.ClosedResourceError`` once
        closed.
        """
        target = _check_value(value)
        page = self._page
        with page.lock:
            self._check_open("signal() of a closed host timeline")
            seen = _hostword.advance(page.address, target)
        self._driver.notify_word(page.address)
        if seen > target:
            raise ValueError(
                f"the host timeline is at {seen} already, and a timeline never goes back: "
                f"signal({target}) needs a value of at least {seen}"
            )

    def _increment(self) -> int:
        """Add one to the value from the host, atomically across processes (a compare-and-swap
        loop: ``advance`` moves the value from ``seen`` to ``seen + 1`` only while no one else
        has), and return the new value. For a counter that several processes add to
        (:class:`~aiocudasem.IpcRecords` acknowledges this way); one at :attr:`MAX` (abandoned)
        stays there. Raises ``anyio.ClosedResourceError`` once closed."""
        page = self._page
        with page.lock:
            self._check_open("a host timeline's counter, closed")
            while True:
                seen = _hostword.load(page.address)
                if seen >= self.MAX:
                    return seen
                if _hostword.advance(page.address, seen + 1) == seen:
                    break
        self._driver.notify_word(page.address)
        return seen + 1

    async def wait_value(self, value: int) -> None:
        """Wait, from the host, until the value reaches ``value``.

        A value reached already returns after a checkpoint. Otherwise no thread blocks and
        nothing polls on the host: the wait is enqueued on a private stream of the device (the
        GPU watches the word), and the notifier reports when that stream passes it, as for
        :meth:`ExternalSemaphore.wait_value`. If cancelled, the GPU wait stays enqueued on a
        private stream that is then abandoned, and the timeline's release waits for it (see
        :meth:`abandon`). Raises ``TypeError``/``ValueError`` for a value as :meth:`signal`
        does, ``anyio.ClosedResourceError`` if the timeline is closed before or during the
        wait, and :class:`~aiocudasem.AbandonedError` if it is abandoned before or during it.
        """
        target = _check_value(value)
        self._check_waitable()
        if self.value >= target:
            await anyio.lowlevel.checkpoint()
            return
        driver = self._driver
        await self._park(
            partial(
                wait_private_stream,
                driver,
                self._device,
                lambda stream: enqueue_words(driver, stream, [(self, target)], write=False),
                # A retry of the same value may go behind an abandoned wait's stream.
                (weakref.ref(self), target),
            )
        )

    def abandon(self, value: int | None = None) -> None:
        """Give up on the producer: move the value to ``value`` (by default :attr:`MAX`) from
        the host, so that every wait on the timeline, GPU and host, in this process and in
        the others that share it, goes on without the producer; then mark the timeline
        *abandoned*.

        Tasks parked in :meth:`wait_value` raise :class:`~aiocudasem.AbandonedError` at once,
        and so do new ``Wait`` and ``Signal`` entries of it, new host waits, and the exit of a
        hand-off section that waited on it: the work behind those waits ran without the
        producer's data. ``aclose()`` then completes without the producer. A value already
        passed is left as it is. Synchronous, non-blocking, safe from any thread, and
        idempotent (a second call changes nothing). Raises ``anyio.ClosedResourceError`` once
        closed, and ``TypeError``/``ValueError`` for a value as :meth:`signal` does.
        """
        target = self.MAX if value is None else _check_value(value)
        page = self._page
        with page.lock:
            self._check_open("abandon() of a closed host timeline")
            if self.abandoned:
                return
            try:
                _hostword.advance(page.address, target)
            finally:
                self._give_up()
        self._driver.notify_word(page.address)

    def export_fd(self) -> int:
        """A new fd of the shared page, for another process: send it over a Unix socket
        (:func:`~aiocudasem.send_host_timeline`, or any ``SCM_RIGHTS`` channel) and open it
        there with :func:`open_host_timeline`. The caller owns the fd; it is not inherited by
        child processes. Raises ``anyio.ClosedResourceError`` once closed."""
        page = self._page
        with page.lock:
            self._check_open("export_fd() of a closed host timeline")
            return os.dup(page.fd)

    # -------------------------------------------------------------- release

    def detach(self) -> int:
        """Give the timeline up without releasing it and return the device address of its
        value: the page stays registered and mapped for the life of the process (it is leaked
        on purpose), and this object is closed. Raises ``anyio.ClosedResourceError`` if
        closed."""
        address = super().detach()
        _detached.append(self._page)
        return address


def _check_value(value: object) -> int:
    return check_uint("a host timeline's value", value, LIMIT)


def enqueue_words(
    driver: Driver, stream: int, entries: Sequence[tuple[HostTimeline, int]], *, write: bool
) -> None:
    """Enqueue GPU waits for (``write`` False) or writes of (True) host timeline values on
    ``stream``, each followed by the timeline's event on that stream. The entries' timelines
    and values are checked already; a timeline closed since raises
    ``anyio.ClosedResourceError``, and one of the entries before it stays enqueued."""
    call = driver.enqueue_write_value64 if write else driver.enqueue_wait_value64
    for timeline, value in entries:
        page = timeline._page
        with page.lock:
            timeline._check_open(f"{'Signal' if write else 'Wait'} of a closed host timeline")
            event = _fence_event(driver, timeline._device, page, stream)  # before the op
            call(stream, timeline._handle, value)
            driver.event_record(event, stream)


def _fence_event(driver: Driver, device: int, page: _Page, stream: int) -> int:
    """The page's event for ``stream``, made if need be, so that nothing can fail between an
    enqueued operation and its fence. Called with the page's lock held."""
    fences = page.fences
    event = fences.get(stream)
    if event is None:
        if len(fences) >= _FENCES_KEPT:
            for other, done in list(fences.items()):
                try:
                    finished = driver.event_query(done)
                except AiocudasemError:
                    finished = False
                if finished:
                    del fences[other]
                    driver.event_destroy(done)
        event = driver.event_create(device, blocking=True)  # the release sleeps, never spins
        fences[stream] = event
    return event


def _release_page(driver: Driver, page: _Page) -> None:
    """Wait until the GPU is done with the page, then unregister and unmap it. Blocks."""
    with page.lock:
        if page.closed:
            return
        page.closed = True  # no signal, load or enqueue touches the page from now on
        fences = list(page.fences.values())
        page.fences.clear()
    try:
        for event in fences:
            driver.event_synchronize(event)
    except (DeviceFaultError, DriverUnavailableError):
        pass  # the context is gone (a fault) or not ours (a forked child): nothing runs
    for event in fences:
        try:
            driver.event_destroy(event)
        except AiocudasemError:
            pass
    try:
        driver.host_unregister(page.address)
    except DriverUnavailableError:
        pass  # a forked child: the registration is the parent's
    except DeviceFaultError:
        # Still registered in a dead context: keep the range mapped (leaked), so that no
        # later mapping at this address meets the stale registration.
        _detached.append(page)
        return
    except AiocudasemError:
        # Still registered: keep it mapped (leaked) rather than unmap memory the driver
        # still tracks. The release reports the error.
        raise
    page.unmap()


def _new_fd(initial: int) -> int:
    fd = os.memfd_create("aiocudasem-host-timeline", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, _SIZE)
        os.pwrite(fd, initial.to_bytes(8, "little") + _MARKER, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_fd(fd: object) -> int:
    """``fd`` as the fd of a host timeline's page: ``TypeError`` or ``ValueError`` otherwise."""
    fd, st = check_open_fd(fd)
    what = f"fd {fd} is not a host timeline's (one from HostTimeline.export_fd())"
    if not stat.S_ISREG(st.st_mode) or st.st_size != _SIZE:
        raise ValueError(f"{what}: not a file of {_SIZE} bytes")
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
        raise ValueError(
            f"fd {fd} is not open for reading and writing, as a host timeline's page must be"
        )
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        seals = 0
    if seals & _SEALS != _SEALS:
        raise ValueError(f"{what}: its size is not sealed")
    try:
        marker = os.pread(fd, len(_MARKER), _MARKER_AT)
    except OSError as exc:
        raise ValueError(f"{what}: its page cannot be read: {exc.strerror}") from None
    if marker != _MARKER:
        raise ValueError(f"{what}: it does not carry the marker")
    return fd


def create_host_timeline(
    initial: int = 0, *, device: int = 0, driver: Driver | str | None = None
) -> HostTimeline:
    """Create a host timeline on ``device``, starting at ``initial``. Synchronous.

    Raises ``TypeError``/``ValueError`` for bad arguments (``initial`` in [0, 2**63)),
    :class:`~aiocudasem.UnsupportedFeatureError` for a device without 64-bit stream memory
    operations, mapped host memory or host memory registration, and
    :class:`~aiocudasem.CudaError` if the driver cannot register the page.
    """
    start = _check_value(initial)
    drv, ordinal = resolve_device(device, driver)
    fd = _new_fd(start)
    try:
        timeline = HostTimeline._create(drv, ordinal, fd)
    except BaseException:
        os.close(fd)
        raise
    reserve_host_wait_stream(drv, ordinal)  # for its first host-side wait
    return timeline


def open_host_timeline(
    fd: int, *, device: int = 0, driver: Driver | str | None = None
) -> HostTimeline:
    """Open, on ``device``, the host timeline whose page ``fd`` refers to: one that
    :meth:`HostTimeline.export_fd` gave, here or in another process. Both ends then share one
    value. Synchronous.

    **fd ownership.** On success the timeline owns the fd and closes it when released. On
    failure the fd is still yours, open and unchanged.

    Raises ``TypeError``/``ValueError`` for an fd that is not an open host timeline's, and
    what :func:`create_host_timeline` raises.
    """
    _check_fd(fd)
    drv, ordinal = resolve_device(device, driver)
    timeline = HostTimeline._create(drv, ordinal, fd)
    reserve_host_wait_stream(drv, ordinal)  # for its first host-side wait
    return timeline
