"""Streams and hand-off sections (the events that a stream records are in ``_events``)."""

from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar, TypeVarTuple, Unpack, overload

import anyio
import anyio.lowlevel

from . import _log, _release
from ._checks import check_device, check_ordinal, resolve_driver
from ._driver import Driver, check_stream_handle, cuda_stream_handle
from ._entries import (
    _E,
    Signal,
    Wait,
    check_same_device,
    driver_label,
    entry_list,
    split_entries,
)
from ._errors import (
    AiocudasemError,
    CudaError,
    DeviceFaultError,
    DeviceMismatchError,
    UnsupportedFeatureError,
)
from ._events import BaseEvent, Event, RecordingStream
from ._hotpath import WaitComplete, WaitState
from ._hotpath import wait_complete as _wait_complete
from ._lifetime import OnDevice
from ._notifier import (
    History,
    current_notifier,
    destroy_stream,
    event_pool,
    mark_coroutine_function,
    prepare_new_stream,
    prepare_stream,
    side_streams,
)
from ._stages import HostStage, Stages, enqueue_stage
from ._timeline import enqueue_words

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Sequence
    from types import TracebackType
    from typing import Self

    from ._events import IpcEvent

__all__ = (
    "Event",
    "HandOff",
    "Stream",
    "expect_stream",
    "open_stream",
    "wait_external_semaphores",
    "wait_stream",
)

#: Handles 0, 1 and 2 (the default, legacy and per-thread default streams) are never waited
#: for with cuStreamQuery: an event recorded on the legacy stream also waits for the work of
#: every blocking stream, which cuStreamQuery of it may not.
_DEFAULT_STREAMS = 2
_WAITS_KEPT: Final = 8  # the last waits of a stream that a slow aclose() names

_T = TypeVar("_T")
_Args = TypeVarTuple("_Args")


class Stream(OnDevice):
    """A CUDA stream, owned or borrowed.

    Owned streams come from :func:`open_stream` and are destroyed by ``aclose()`` (or
    ``async with``). Borrowed streams come from :meth:`Stream.adopt` (a PyTorch, CuPy,
    cuda.core or Numba stream, or a raw handle) and are never destroyed by us.

    Methods that enqueue work (``enqueue_wait``, ``enqueue_signal``, ``record``) are plain,
    synchronous and non-blocking. Methods that wait are ``async``, named ``wait_*`` and are
    always checkpoints.
    """

    __slots__ = ("_events", "_history", "_owned", "_stages", "_wait_state", "_waited_on")
    _events: list[int]
    #: The last waits enqueued on the stream, for the warning of an aclose() that waits long.
    _waited_on: collections.deque[Wait]
    _history: History
    #: What each wait_complete() takes: see _WaitHooks.
    _wait_state: WaitState
    _owned: bool
    #: Its host stages (enqueue_host()), from the first one on.
    _stages: Stages | None
    _factory = "use aiocudasem.open_stream() or Stream.adopt() to get a Stream"
    _noun = "stream"
    #: An owned stream is destroyed with its side stream; the driver frees it once its
    #: enqueued work completes, so destroying returns at once.
    _destroy = staticmethod(destroy_stream)

    @classmethod
    def _create(
        cls, driver: Driver, device: int, handle: int, owned: bool, prepare: bool = True
    ) -> Self:
        # The side stream that will carry this stream's host functions, made now rather than
        # at the first wait that parks, when making it could block (see side_streams.ensure).
        # ``prepare=False``: a Stream made for one wait (wait_stream()), which is about to run:
        # its side stream, if it parks, is made then, as it would be now.
        if prepare:
            (prepare_new_stream if owned else prepare_stream)(driver, device, handle)
        self = object.__new__(cls)
        self._driver = driver
        self._device = device
        self._owned = owned
        self._events = event_pool.free_list(driver, device)
        self._history = History()  # how long its waits take: how long they spin
        self._wait_state = WaitState(
            driver,
            device,
            handle,
            self._events,
            self._history,
            _HOOKS,
            current_notifier,
            record_first=handle <= _DEFAULT_STREAMS,
        )
        self._waited_on = collections.deque(maxlen=_WAITS_KEPT)
        self._stages = None
        if owned:
            self._own(handle, driver, handle)
        else:
            self._own(handle)  # borrowed: nothing to destroy
        return self

    def _describe(self) -> str:
        return f"aiocudasem.Stream {self._handle:#x} on device {self._device}"

    def _claim(self) -> bool:
        # A wait past its first checkpoint reads the closed state from the history, in C.
        self._history.closed = True
        claimed = super()._claim()
        if claimed and self._stages is not None:
            self._stages.close()  # releases the stages' positions, then their timeline
        return claimed

    @classmethod
    def adopt(cls, stream: object, *, driver: Driver | str | None = None) -> Stream:
        """Borrow a foreign stream: an object with ``__cuda_stream__`` (cuda.core, CuPy,
        PyTorch, Numba, or our own Stream) or a raw ``CUstream`` handle as an int.

        A foreign stream is borrowed: the result never destroys it, and ``aclose()`` only
        forgets it. Our own Stream is returned as it is, owned or not, so closing the result
        closes it. Raises ``TypeError`` for anything else (a ``bool`` included, or a
        ``__cuda_stream__`` that does not give a pair of ints); ``ValueError`` for a handle
        outside [0, 2**64) (a negative one included), given or from ``__cuda_stream__``, for a
        ``__cuda_stream__`` of a protocol version other than 0, or for one that raised
        (chained as the cause); ``anyio.ClosedResourceError`` for a closed Stream (and as it
        is from a ``__cuda_stream__`` that raised it);
        :class:`CudaError` if the driver rejects the handle; and :class:`DeviceMismatchError`
        for a stream outside a primary context or a Stream of another driver than ``driver``.
        """
        if isinstance(stream, Stream):
            stream.handle  # noqa: B018 - raises ClosedResourceError once closed
            if driver is not None:
                drv = resolve_driver(driver)
                if drv is not stream._driver:
                    raise DeviceMismatchError(
                        f"{stream!r} belongs to {driver_label(stream._driver, drv)}, not to "
                        f"{driver_label(drv, stream._driver)} given as driver="
                    )
            return stream
        return cls._adopt(stream, driver, prepare=True)

    @classmethod
    def _adopt(cls, stream: object, driver: Driver | str | None, prepare: bool) -> Stream:
        """:meth:`adopt` of anything but a Stream; ``prepare``: see :meth:`_create`."""
        handle = _stream_handle(stream)
        drv = resolve_driver(driver)
        _release.flush()
        device = drv.stream_device(handle)
        return cls._create(drv, device, handle, owned=False, prepare=prepare)

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        state = "closed" if self.closed else f"handle={self._handle:#x}"
        return f"<Stream {kind} device={self._device} {state} driver={self._driver.name}>"

    def __cuda_stream__(self) -> tuple[int, int]:
        """The cuda.core stream protocol: ``(version, handle)``."""
        return (0, self.handle)

    @property
    def owned(self) -> bool:
        """True for a stream of :func:`open_stream`, which the library destroys; False for a
        borrowed one (:meth:`adopt`)."""
        return self._owned

    # -------------------------------------------------------------- enqueue (sync)

    def query(self) -> bool:
        """True if all work enqueued so far has completed. Non-blocking."""
        return self._driver.stream_query(self.handle)

    def record(self) -> Event:
        """Record an event capturing everything enqueued so far. Non-blocking. Recorded while
        the stream captures a graph, the event is CUDA's captured kind, for other captured
        streams to wait on; awaiting it raises :class:`CudaError`."""
        handle = self.handle
        _release.flush()
        event = self._driver.event_create(self._device)
        try:
            self._driver.event_record(event, handle)
        except BaseException:
            self._driver.event_destroy(event)
            raise
        return Event._create(self, event)

    def enqueue_event_wait(self, event: Event | IpcEvent) -> None:
        """Make later work on this stream wait for ``event`` (on the GPU): an :class:`Event`,
        or an :class:`IpcEvent`'s most recent record, in whichever process. Non-blocking."""
        if not isinstance(event, BaseEvent):
            raise TypeError(f"expected an aiocudasem.Event or IpcEvent, not {type(event).__name__}")
        owner = event._event_driver
        if owner is not self._driver:
            raise DeviceMismatchError(
                f"the event belongs to {driver_label(owner, self._driver)}, "
                f"the stream to {driver_label(self._driver, owner)}"
            )
        self._driver.stream_wait_event(self.handle, event.handle)

    @overload
    def enqueue_wait(self, waits: Sequence[Wait], /) -> None: ...
    @overload
    def enqueue_wait(self, *waits: Wait) -> None: ...
    def enqueue_wait(self, *waits: Wait | Sequence[Wait]) -> None:
        """Enqueue GPU waits on external semaphores, all in one driver call
        (``cuWaitExternalSemaphoresAsync``), and on host timelines (one ``cuStreamWaitValue64``
        each). Later work on the stream runs after them. Non-blocking.

        Takes one :class:`Wait`, several as separate arguments, or one list or tuple of them:
        ``enqueue_wait(Wait(a, 1), Wait(b, 2))`` and ``enqueue_wait([Wait(a, 1), Wait(b, 2)])``
        are the same. Raises ``TypeError`` for another entry, ``ValueError`` for none,
        ``anyio.ClosedResourceError`` for a closed stream or semaphore, and
        :class:`DeviceMismatchError` for a semaphore of another device or driver.

        On a stream that is capturing a CUDA graph, the waits become the graph's external
        semaphore wait nodes (docs/graphs.md); a host timeline's entry then raises
        :class:`UnsupportedFeatureError` before anything is enqueued."""
        self._enqueue(self._entries("enqueue_wait()", waits, Wait), write=False)

    @overload
    def enqueue_signal(self, signals: Sequence[Signal], /) -> None: ...
    @overload
    def enqueue_signal(self, *signals: Signal) -> None: ...
    def enqueue_signal(self, *signals: Signal | Sequence[Signal]) -> None:
        """Enqueue signals of external semaphores, all in one driver call
        (``cuSignalExternalSemaphoresAsync``), and of host timelines (one
        ``cuStreamWriteValue64`` each); they fire when earlier work completes.
        Non-blocking. Takes one :class:`Signal`, several, or one list or tuple of them, and
        raises as :meth:`enqueue_wait` does."""
        self._enqueue(self._entries("enqueue_signal()", signals, Signal), write=True)

    def _enqueue(self, entries: tuple[Wait, ...] | tuple[Signal, ...], *, write: bool) -> None:
        """The entries' waits (``write`` False) or signals: those on external semaphores in
        one driver batch, then those on host timelines, one memory operation each."""
        ops, words = split_entries(entries)
        handle, drv = self.handle, self._driver
        if words and _capturing(drv, handle):
            raise UnsupportedFeatureError(
                "a host timeline's wait or signal cannot be captured into a CUDA graph: the "
                "graph would outlive what the timeline can track of its page; use an external "
                "semaphore in a captured section, or enqueue the host timeline outside capture"
            )
        if ops:
            (drv.enqueue_semaphore_signals if write else drv.enqueue_semaphore_waits)(ops, handle)
        if words:
            enqueue_words(drv, handle, words, write=write)
        # What abandon() of a semaphore needs to know, and what a slow aclose() names.
        if not write:
            for e in entries:
                e.semaphore._note_wait(e.value, handle)
            self._waited_on.extend(entries)  # type: ignore[arg-type]

    def _entries(self, where: str, given: tuple[object, ...], kind: type[_E]) -> tuple[_E, ...]:
        entries = entry_list(where, given, kind)
        self.handle  # noqa: B018 - raises ClosedResourceError once closed
        check_same_device(entries, self._driver, self._device)
        return entries

    def handoff(self, waits: Wait | Sequence[Wait], signals: Signal | Sequence[Signal]) -> HandOff:
        """A hand-off section: ``async with stream.handoff(Wait(a, n), Signal(b, n)):``.

        ``waits`` (the :class:`Wait` entries) come first, then ``signals`` (the
        :class:`Signal` entries); each is one entry or a list or tuple of them, and may be
        empty: ``handoff(Wait(a, n), [])`` waits for a producer and signals nothing,
        ``handoff([], Signal(b, n))`` signals a consumer and waits for nothing. Entering
        enqueues the waits; the body enqueues GPU work; a normal exit enqueues the signals and
        waits until the stream has passed them and the body's work (on a stream that is
        capturing a CUDA graph it does not wait: the section becomes the graph's nodes; see
        :class:`HandOff`). A section is entered once: make a new one for each.

        The entries are checked now, and nothing is enqueued until the section is entered:
        raises ``TypeError`` for an entry of the wrong kind (a :class:`Signal` among the waits
        or a :class:`Wait` among the signals included), ``anyio.ClosedResourceError`` for a
        closed stream or semaphore and :class:`DeviceMismatchError` for a semaphore of another
        device or driver; a semaphore closed after its entry was made is found when the
        section enqueues. See :class:`HandOff` for errors and cancellation.
        """
        return HandOff(self, waits, signals)

    def enqueue_host(
        self, async_fn: Callable[[Unpack[_Args]], Awaitable[_T]], *args: *_Args
    ) -> HostStage[_T]:
        """Enqueue a host stage: ``async_fn(*args)`` runs on the event loop in this stream's
        order. Returns its :class:`HostStage`. Synchronous, and not a checkpoint (a stream's
        first stage also maps and registers the page of its private host timeline); call it in
        a task of the event loop that is to run the coroutine.

        The stream waits, on the GPU, at the stage's position. Once everything enqueued on the
        stream before the stage has completed, the event loop runs the coroutine (network I/O,
        a file, anything async); when the coroutine ends, the stream goes on to the work
        enqueued behind the stage. ``await stage`` returns the coroutine's value. The stage
        runs whether or not anyone awaits it. Pass keyword arguments with
        ``functools.partial``.

        - If the coroutine raises, or the stage is cancelled (:meth:`HostStage.cancel`), the
          stream goes on all the same. ``await stage`` raises the coroutine's exception, or
          :class:`StageCancelledError`; the stages enqueued behind it up to then do not run,
          and each raises :class:`AbandonedError` at its ``await``. GPU work between them runs
          regardless: :meth:`wait_complete` reports the stream's progress only, as it does
          behind an abandoned semaphore, and raises none of these.
        - :meth:`aclose` waits for pending stages (and the slow-close WARNING names them);
          :meth:`close`, ``detach()`` and an exit of ``async with`` by an exception cancel
          them and release their positions at once. An event loop that ends with stages
          pending releases them too, so that no stream is left blocked.
        - A stage must not wait for its own stream (:meth:`wait_complete`, :meth:`aclose`, a
          hand-off section's exit): the stream waits for the stage.

        Raises ``TypeError`` for anything but a coroutine function (a coroutine object
        included), ``anyio.ClosedResourceError`` for a closed stream, ``RuntimeError`` outside
        a running event loop, ``anyio.WouldBlock`` while 32 stages of this stream are pending
        (await one first: the stream holds everything behind a pending stage, and a full queue
        of GPU commands would block the event loop that must run it; keep the GPU work between
        stages to a few hundred launches for the same reason),
        ``anyio.BusyResourceError`` while stages of this stream are pending on another event
        loop that still runs, :class:`UnsupportedFeatureError` on a
        stream that is capturing a CUDA graph, on a device without host timelines (see
        :func:`create_host_timeline`) and on an event loop other than asyncio, uvloop and
        trio, and :class:`CudaError` if the driver fails. See docs/stages.md.
        """
        return enqueue_stage(self, async_fn, args)

    # -------------------------------------------------------------- wait (async)

    def wait_complete(self) -> Coroutine[Any, Any, None]:
        """Wait until all work enqueued so far on this stream has completed:
        ``await stream.wait_complete()``.

        A checkpoint. Cancelling abandons the wait only: the GPU work goes on and the stream
        stays usable. Raises :class:`DeviceFaultError` if the device faults meanwhile, and
        ``anyio.ClosedResourceError`` if the stream is closed when the wait begins, or if
        another task closes (or detaches) it during the wait's first checkpoint; closed later,
        the wait goes on to its end.

        The wait may also cover work that other tasks enqueue on the stream during its first
        checkpoint, never later work: it never ends early, and ends late by at most that.

        It returns a coroutine (a ``collections.abc.Coroutine``, awaited once), which
        ``asyncio.create_task()`` and the task groups of anyio and trio accept as they accept
        that of an ``async def``. On asyncio, on the streams that the library waits for with a
        query (all but the default streams), it is C: an await whose work is done by its first
        query runs no Python. On trio it is a small ``async def`` that runs the same steps.
        """
        # The hot path of the library, the wait algorithm in C (_hotpath.wait_complete(): see
        # docs/architecture.md, "The hot path in C"): the checkpoint first, then one
        # cuStreamQuery. Most short work is done by then, and such an await costs no event.
        if self._handle > _DEFAULT_STREAMS:
            return _wait_complete(self._wait_state)
        return self._wait_default()

    async def _wait_default(self) -> None:
        """:meth:`wait_complete` on a default stream, which always records its event first,
        before its checkpoint: an event recorded on the legacy stream also waits for the work
        of every blocking stream, which cuStreamQuery may not. The same algorithm in C, told
        so by the state's ``record_first``."""
        if not self._open:
            raise self._closed_error()
        drv, handle = self._driver, self._handle
        if handle == _PER_THREAD_STREAM and _capturing(drv, handle):
            # The one default stream that can capture: its event would be a captured one,
            # which CUDA refuses to query (CUDA_ERROR_CAPTURED_EVENT).
            raise _capturing_error(None)
        await _wait_complete(self._wait_state)

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Release the stream now, without waiting. Idempotent; not a checkpoint. An owned
        stream is destroyed, with the library's side stream that serves it: the driver frees
        it once its enqueued work completes, which still runs. A driver failure raises
        :class:`CudaError`, and the stream is closed all the same; after a device fault it
        succeeds quietly. A borrowed stream is only forgotten."""
        super().close()

    def detach(self) -> int:
        """Give the stream up without destroying it and return its handle, which is the
        caller's from now on. The library forgets its side stream for that handle, so that a
        later stream that CUDA gives the same handle does not inherit it."""
        handle = super().detach()
        with contextlib.suppress(AiocudasemError):  # a faulted context took it already
            side_streams.drop(self._driver, handle)
        return handle

    async def aclose(self) -> None:
        """Release the stream. Idempotent, and always a checkpoint.

        An owned stream first waits for its enqueued work, then is destroyed; if that wait is
        cancelled or fails, the stream is destroyed anyway (the driver frees it once its work
        completes) and the exception propagates. A borrowed stream is only forgotten; while host
        stages of it (:meth:`enqueue_host`) are pending, it first waits for all the work
        enqueued on it so far, as an owned one does, which covers them. Pending host stages
        run to their end first; if the wait is cancelled, they are cancelled. Work
        blocked on a wait whose producer is gone never completes: after a few seconds this
        logs a WARNING that names the stream's last waits, and goes on waiting (see
        ``ExternalSemaphore.abandon()`` and ``HostTimeline.abandon()``).

        ``async with`` calls this on a normal exit; when an exception leaves the block, it
        calls :meth:`close` instead (no wait).
        """
        if not self._finalizer.alive:
            await anyio.lowlevel.checkpoint()
            return
        try:
            # A borrowed stream waits only for its host stages, which are the library's to run
            # (and which wait_complete() covers, with whatever else is enqueued before them).
            if self._owned or (self._stages is not None and self._stages.pending):
                try:
                    with anyio.move_on_after(_log.CLOSE_WARNING_S) as scope:
                        await self.wait_complete()
                    if scope.cancelled_caught:
                        self._warn_slow_close()
                        await self.wait_complete()
                except anyio.ClosedResourceError:
                    if self._open:
                        raise  # the event loop's notifier, not this stream
                    # Closed by another task meanwhile: released already, as asked.
            else:
                await anyio.lowlevel.checkpoint()
        finally:
            self.close()

    def _warn_slow_close(self) -> None:
        pending = [
            w
            for w in dict.fromkeys(self._waited_on)
            if not w.semaphore.closed and not w.semaphore.abandoned
        ]
        stuck = ""
        if pending:
            stuck = "; its last waits were on " + ", ".join(
                f"{w.semaphore!r}" + ("" if w.value is None else f" for {w.value}") for w in pending
            )
        stages = [] if self._stages is None else self._stages.describe_pending()
        if stages:
            stuck += "; its pending host stages are " + ", ".join(stages)
        _log.slow_close(
            self._describe(),
            _log.CLOSE_WARNING_S,
            stuck,
            "If its producer is gone, call abandon() on the semaphore or host timeline it "
            "waits on (the stream then goes on); if a host stage hangs, cancel() it; to "
            "release the stream without waiting, call close(), or leave the async with block "
            "by an exception.",
        )


# It returns a coroutine, as an async def does, and says so to those that ask the function.
mark_coroutine_function(Stream.wait_complete)


class _WaitHooks:
    """The Python that the wait in C calls back, by these names, with the stream's
    :class:`WaitState` (the contract: docs/architecture.md, "The hot path in C"). One object
    serves every stream."""

    __slots__ = ()

    @staticmethod
    def closed_error() -> BaseException:
        """What a wait on a closed stream raises (``Stream._closed_error()``)."""
        return anyio.ClosedResourceError(f"the {Stream._noun} is closed")

    @staticmethod
    def query_failed(state: WaitState, exc: BaseException) -> NoReturn:
        """Raise what :meth:`Stream.wait_complete` raises when its first query raised
        ``exc``."""
        if isinstance(exc, DeviceFaultError):
            # Reported as the notifier reports a fault it finds (once per device): a program
            # whose waits all end here would otherwise raise it unlogged.
            _log.device_fault(state.driver, state.device, exc)
        elif isinstance(exc, CudaError) and exc.status in _CAPTURE_STATUSES:
            raise _capturing_error(exc) from None
        raise exc

    @staticmethod
    async def drive(wait: WaitComplete) -> None:
        """The wait's steps, from Python: for a loop whose checkpoint is a coroutine (trio),
        which runs inline here rather than entering the interpreter anew for each of its steps
        from C. The steps themselves, and every decision, are the C ones. (``wait.step()`` is
        called as a method each time: a bound ``step`` kept in a local would be one more object
        made per await, which shows on trio's cost per await.)"""
        try:
            todo = wait.step()
            while todo is not None:
                await todo
                todo = wait.step()
        except BaseException:
            wait.close()
            raise


_HOOKS: Final = _WaitHooks()


def _stream_handle(obj: object) -> int:
    handle = cuda_stream_handle(obj)
    if handle is not None:
        return handle
    if isinstance(obj, int) and not isinstance(obj, bool):
        return check_stream_handle(obj, f"the stream handle {obj} is out of range")
    raise TypeError(
        f"cannot use {type(obj).__name__} as a CUDA stream: pass an object with "
        "__cuda_stream__ (cuda.core, CuPy, PyTorch, Numba) or a raw CUstream handle "
        "(for example torch.cuda.Stream().cuda_stream or cupy.cuda.Stream().ptr)"
    )


# cuStreamQuery on a capturing stream: refused (and the capture invalidated), or refused
# because the capture was invalidated before.
_CAPTURE_STATUSES: Final = frozenset({900, 901})
_CAPTURE_UNSUPPORTED: Final = 900
_PER_THREAD_STREAM: Final = 2  # CU_STREAM_PER_THREAD


def _capturing(drv: Driver, handle: int) -> bool:
    """Whether ``handle`` is capturing; False where the driver cannot say (the per-thread
    stream of a thread with no current context, which captures nothing)."""
    try:
        return drv.stream_capturing(handle)
    except CudaError:
        return False


def _capturing_error(exc: CudaError | None) -> CudaError:
    """The error for an await of a capturing stream: ``exc`` is the query's, which has
    invalidated the capture; None where the library asked first."""
    what = "the query has invalidated the capture"
    if exc is None:
        what = "the capture is intact"
        exc = CudaError(
            "the stream is capturing", _CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        )
    return exc._explained(
        "the stream is capturing a CUDA graph, so nothing on it runs until the graph is "
        f"launched, and there is nothing to await ({what}). End the capture, instantiate the "
        "graph and await aiocudasem.launch_graph() instead"
    )


RecordingStream.register(Stream)  # what IpcEvent.record() takes

#: What a hand-off's error says of an entry given on the wrong side.
_ORDER: Final = "handoff(waits, signals) takes the waits first"


class HandOff:
    """``async with stream.handoff(waits, signals):`` - a section of GPU work between an
    external producer's signal and our signal back.

    - Entering enqueues the waits (not a checkpoint).
    - The body enqueues GPU work on the stream.
    - A normal exit enqueues the signals and waits until the stream has passed them.
    - Either list may be empty: with no waits the body's work starts without waiting for a
      producer, with no signals nothing is signalled back, and the exit still waits for the
      body's work. Entering and exiting enqueue nothing for an empty list, but still raise
      ``anyio.ClosedResourceError`` for a closed stream.
    - On a stream that is capturing a CUDA graph, the waits and signals become the graph's
      external semaphore nodes, and a normal exit does not wait (it is a checkpoint only):
      the section runs each time the graph is launched. Host timelines cannot be captured.
    - If the body raises (cancellation included), the signals are still enqueued, so that the
      peer waiting for them is not left hanging, and the exception propagates at once,
      without waiting for the GPU. GPU work already enqueued cannot be undone.
    - If the exit's wait is cancelled, the signals are already enqueued and will fire; only
      the observation is abandoned.
    - If one of the semaphores it waits on is abandoned (``abandon()``) before the exit's
      wait ends, the exit raises :class:`~aiocudasem.AbandonedError` once the stream has
      passed the section: its work ran without the producer's data.
    - A section is entered once: entering it again raises ``anyio.ClosedResourceError`` (it
      would enqueue its waits and signals a second time). Make one per section.

    Entering and exiting raise what :meth:`Stream.enqueue_wait`, :meth:`Stream.enqueue_signal`
    and :meth:`Stream.wait_complete` raise. When the body raised, a failure to enqueue the
    signals is suppressed in favour of the body's exception.
    """

    __slots__ = ("_entered", "_signals", "_stream", "_waits")

    def __init__(
        self, stream: Stream, waits: Wait | Sequence[Wait], signals: Signal | Sequence[Signal]
    ) -> None:
        if not isinstance(stream, Stream):
            raise TypeError(f"expected an aiocudasem.Stream, not {type(stream).__name__}")
        self._stream = stream
        self._waits = entry_list("handoff() waits", (waits,), Wait, empty=True, swapped=_ORDER)
        self._signals = entry_list(
            "handoff() signals", (signals,), Signal, empty=True, swapped=_ORDER
        )
        stream.handle  # noqa: B018 - raises ClosedResourceError once closed
        check_same_device(self._waits + self._signals, stream._driver, stream._device)
        self._entered = False

    def __enter__(self) -> NoReturn:
        raise TypeError("a hand-off section is asynchronous: use 'async with stream.handoff(...)'")

    def __exit__(self, *exc_info: object) -> None:  # never reached: __enter__ raises
        pass

    def __await__(self) -> NoReturn:
        raise TypeError(
            "a hand-off section is not awaited: use 'async with stream.handoff(...)' around the "
            "GPU work it hands off"
        )

    async def __aenter__(self) -> Stream:
        if self._entered:
            raise anyio.ClosedResourceError(
                "this hand-off section was entered already, and a section is entered once: "
                "make a new one with stream.handoff(waits, signals) for each section"
            )
        self._entered = True
        if self._waits:
            self._stream.enqueue_wait(self._waits)
        else:
            self._stream.handle  # noqa: B018 - raises ClosedResourceError once closed
        return self._stream

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stream = self._stream
        if exc_type is not None:
            try:
                if self._signals:
                    stream.enqueue_signal(self._signals)
            except (AiocudasemError, anyio.ClosedResourceError):
                pass  # the body's exception is the one to report
            return
        if self._signals:
            stream.enqueue_signal(self._signals)
        else:
            stream.handle  # noqa: B018 - raises ClosedResourceError once closed
        if _capturing(stream._driver, stream._handle):
            # The section went into the graph being captured, and runs when that graph is
            # launched: nothing on the stream runs now, so there is nothing to wait for.
            await anyio.lowlevel.checkpoint()
            return
        await stream.wait_complete()
        for w in self._waits:
            if w.semaphore.abandoned:
                raise w.semaphore._abandoned()


def open_stream(
    device: int = 0,
    *,
    priority: int = 0,
    non_blocking: bool = True,
    driver: Driver | str | None = None,
) -> Stream:
    """Create a stream on ``device``. Use it as ``async with open_stream() as stream:``.

    Creation is synchronous and non-blocking. ``priority`` follows CUDA (lower is higher
    priority; out-of-range values are clamped by the driver); ``non_blocking`` streams do not
    synchronise with the legacy default stream. Raises ``TypeError`` for a ``device`` or
    ``priority`` that is not an ``int`` (a ``bool`` included) or a ``non_blocking`` that is not
    a ``bool``, ``ValueError`` for a device that does not exist,
    :class:`DriverUnavailableError` if the driver cannot run, and :class:`CudaError` (or
    :class:`DeviceFaultError` after a device fault) if the driver fails to create the stream.
    """
    check_ordinal(device)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"priority must be an int, not {type(priority).__name__}")
    if not isinstance(non_blocking, bool):
        raise TypeError("non_blocking must be a bool")
    drv = resolve_driver(driver)
    _release.flush()
    check_device(drv, device)
    handle = drv.stream_create(device, non_blocking, priority)
    return Stream._create(drv, device, handle, owned=True)


async def wait_stream(stream: object, *, driver: Driver | str | None = None) -> None:
    """Wait until everything enqueued so far on ``stream`` has completed.

    ``stream`` is anything :meth:`Stream.adopt` takes, for example
    ``await aiocudasem.wait_stream(torch.cuda.current_stream())``.
    """
    if isinstance(stream, Stream):
        stream = Stream.adopt(stream, driver=driver)  # the closed and driver checks
    else:
        # Adopted for this one wait: its side stream, if it parks, is made then, and a
        # foreign stream awaited once and destroyed leaves none behind.
        stream = Stream._adopt(stream, driver, prepare=False)
    await stream.wait_complete()


async def wait_external_semaphores(waits: Wait | Sequence[Wait], stream: object) -> None:
    """The async form of ``cuWaitExternalSemaphoresAsync``: enqueue the waits on ``stream``
    in one driver call, then wait until the stream has passed them (and everything enqueued
    before them). ``waits`` is one :class:`Wait` or a list or tuple of them; an empty one
    enqueues nothing and waits for the stream, as :meth:`Stream.wait_complete` does.
    ``stream`` is a :class:`Stream` or anything :meth:`Stream.adopt` takes; a foreign stream
    uses the driver of the first semaphore (with no waits, the default driver, as
    :func:`wait_stream` does).

    A checkpoint. If cancelled, the waits stay enqueued: the stream does not go past them
    until they are satisfied. Raises ``TypeError`` for an entry that is not a :class:`Wait`
    (a :class:`Signal` included), and what :meth:`Stream.adopt`, :meth:`Stream.enqueue_wait`
    and :meth:`Stream.wait_complete` raise."""
    entries = entry_list(
        "wait_external_semaphores() waits",
        (waits,),
        Wait,
        empty=True,
        swapped="wait_external_semaphores() only waits: enqueue signals with "
        "stream.enqueue_signal(), or use a hand-off section",
    )
    if not isinstance(stream, Stream):
        driver = entries[0].semaphore.driver if entries else None
        stream = Stream._adopt(stream, driver, prepare=False)
    if entries:
        stream.enqueue_wait(entries)
    await stream.wait_complete()


def expect_stream(stream: object, where: str) -> Stream:
    """``stream``, if it is a :class:`Stream`; else ``TypeError`` that ``where`` (a call, as
    ``"record()"``) takes one, and how to adopt a foreign stream."""
    if not isinstance(stream, Stream):
        raise TypeError(
            f"{where} takes an aiocudasem.Stream, not {type(stream).__name__}: adopt a foreign "
            "stream with aiocudasem.Stream.adopt()"
        )
    return stream
