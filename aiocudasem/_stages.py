"""Host stages: a coroutine that runs in a stream's order (``Stream.enqueue_host()``).

A stage is a position on a stream, held there by a GPU wait on a private host timeline of the
stream (``cuStreamWaitValue64`` of the stage's value). Just before that wait, the stage's
*point* is recorded (a pooled event) and armed in the stream (``Notifier.arm_in_stream()``):
the notifier's C host function, launched on the work stream itself, which takes no GIL. A task
of the library's own (the loop adapter's ``spawn()``) awaits the point as every wait of the
library does; no thread polls. Once the point has completed, everything enqueued before the
stage has, and the task runs the coroutine; when the coroutine ends, however it ends, the task
signals the stage's value from the host (an atomic store) and the stream goes on.

Why the point is armed when the stage is enqueued, and on the work stream: a point's host
function must not wait behind anything that waits for the stage. Armed later, in the task, it
could find a later point of the stream heading its chain, or that point's event wait ahead of
it on the side stream (a ``wait_complete()`` right after ``enqueue_host()`` that parked before
the task ran), whose work waits for the stage: neither would ever fire. Armed at once, it is
ahead of every later point. On the work stream it also needs no side stream, which a stream
whose side stream was evicted would have to make on the loop's thread while streams wait for
host timelines (docs/architecture.md, "The side stream"); the stall that a host function costs
the work stream is nothing beside a coroutine's run.

- **Values.** Each stream counts its stages 1, 2, 3, ... on one timeline, made at its first
  stage and released with the stream. A stage signals its value only once its turn has come
  (its event completed, so the stage before it was signalled already): values are signalled in
  order, and no signal releases the wait of a stage still to run. Two things release early,
  since nothing else would ever release the stream: closing the stream (it signals the highest
  value issued, then releases the timeline) and the end of the event loop (each stage still
  pending signals its own value: its task's cancellation, or, for a task that never ran, the
  notifier's ``at_close``).
- **Failure.** A stage that does not return (its coroutine raised, it was cancelled, its
  stream was closed or its loop ended) *abandons* the stages enqueued behind it on the stream
  so far: at its turn, each of them releases its position without running and raises
  :class:`~aiocudasem.AbandonedError`. A stage enqueued after the failure runs as usual.
- **One loop.** A stream's pending stages belong to one event loop: ``enqueue_host()`` from
  another, still running, raises ``anyio.BusyResourceError`` until they are done.
- **Never a crash.** The task catches everything into the stage's outcome: an exception of a
  trio system task would end the whole run, and one of an asyncio task nobody awaits would be
  logged as never retrieved. A stage that failed and that nobody awaited is logged (ERROR)
  when it is collected, as asyncio does for a task.
"""

from __future__ import annotations

import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import anyio
import anyio.lowlevel

from . import _log
from ._errors import (
    AbandonedError,
    AiocudasemError,
    CudaError,
    DeviceFaultError,
    StageCancelledError,
    UnsupportedFeatureError,
)
from ._loopcall import call_soon
from ._notifier import Notifier, Point, current_notifier, event_pool, give_back, record_pooled
from ._timeline import HostTimeline, _new_fd, enqueue_words

if TYPE_CHECKING:
    from anyio.lowlevel import EventLoopToken

    from ._driver import Driver
    from ._stream import Stream

__all__ = ("MAX_PENDING", "HostStage", "Stages", "enqueue_stage")

#: The most stages pending on one stream. Behind a pending stage the stream holds everything
#: enqueued after it, and the driver's queue of commands is finite: once it is full, the next
#: enqueue blocks the calling thread until the GPU drains some. On the event loop's thread
#: that is the loop that must run the stage, so it never drains: 1,000 stages enqueued at once
#: (four commands each, and a kernel between them) hung that way on an H100.
MAX_PENDING: Final = 32

_T = TypeVar("_T")


class _StagesTimeline(HostTimeline):
    """The private host timeline of one stream's stages. Released with its stream, and
    collected with it silently: a forgotten stream is reported already."""

    __slots__ = ()
    _warn_when_collected = False

    def _describe(self) -> str:
        return f"the host stages' timeline at {self._page.address:#x} (device {self._device})"


class Stages:
    """The host stages of one stream: its timeline, the values issued, the stages pending, and
    the failure that abandons the stages behind it. Guarded by ``lock``: a stream may be
    closed from any thread."""

    __slots__ = (
        "abandon_through",
        "closed",
        "failure",
        "issued",
        "lock",
        "notifier",
        "pending",
        "timeline",
    )

    def __init__(self, timeline: HostTimeline) -> None:
        self.timeline = timeline
        self.lock = threading.Lock()
        #: The value of the newest stage enqueued.
        self.issued = 0
        #: The stages not done yet, in their order on the stream.
        self.pending: dict[HostStage[Any], None] = {}
        #: The notifier of the loop that the pending stages belong to.
        self.notifier: weakref.ref[Notifier] | None = None
        #: Stages up to this value abandon their turn, because of ``failure``: the stage that
        #: failed (its description) and its error.
        self.abandon_through = 0
        self.failure: tuple[str, BaseException] | None = None
        self.closed = False

    def signal(self, value: int) -> None:
        """Release the stream's waits up to ``value``, from the host. Nothing happens if a
        release got there first (the stream's close, a later stage at the loop's end) or if
        the timeline was released with the stream, which released its waits before."""
        try:
            self.timeline.signal(value)
        except (ValueError, anyio.ClosedResourceError, AiocudasemError):
            pass  # AiocudasemError: the driver's notice of the store, after a fault

    def close(self) -> None:
        """The stream is being closed: release the waits of every stage at once, cancel the
        pending ones, and release the timeline (a thread of its own waits until the stream
        has passed its waits)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            pending = list(self.pending)
            issued = self.issued
        self.signal(issued)
        for stage in pending:
            stage._stop("its stream was closed")
        self.timeline.close()

    def describe_pending(self) -> list[str]:
        """The pending stages, as a slow ``aclose()`` names them."""
        with self.lock:
            return [repr(s) for s in self.pending]

    def _abandoned_by(self, value: int) -> tuple[str, BaseException] | None:
        with self.lock:
            return self.failure if value <= self.abandon_through else None

    def _settle(self, stage: HostStage[Any], error: BaseException | None) -> None:
        """``stage`` is over: release its position, and if it failed with ``error`` (and was
        not itself abandoned), abandon the stages enqueued behind it so far."""
        self.signal(stage._value)
        with self.lock:
            self.pending.pop(stage, None)
            behind = self.issued > max(stage._value, self.abandon_through)
            if error is not None and not stage._abandoned and behind:
                self.abandon_through = self.issued
                self.failure = (stage._name, error)
            elif stage._value >= self.abandon_through:
                self.failure = None  # no stage is left to abandon: drop the error's frames


class HostStage(Generic[_T]):
    """A coroutine that runs in a stream's order: what :meth:`Stream.enqueue_host` returns.

    The stage holds the stream at its position (a GPU wait on a host timeline); its coroutine
    runs once everything enqueued before the stage has completed, and the stream goes on when
    the coroutine ends. It runs whether or not anyone awaits it.

    - ``await stage`` waits for the stage to end and returns the coroutine's return value, or
      raises what it raised. A stage that did not run, or did not return, raises
      :class:`~aiocudasem.StageCancelledError` (cancelled: by :meth:`cancel`, by closing the
      stream, or by the end of the event loop) or :class:`~aiocudasem.AbandonedError` (a stage
      before it on the stream failed or was cancelled after it was enqueued; the ``__cause__``
      is that stage's error), and :class:`~aiocudasem.DeviceFaultError` if the device faults
      before its turn. Always a checkpoint. Cancelling the ``await`` abandons the wait only:
      the stage goes on. Await it in the event loop that enqueued it: from another,
      ``await`` raises ``RuntimeError``.
    - :meth:`done` says whether it has ended; :meth:`cancel` cancels it.
    """

    __slots__ = (
        "__weakref__",
        "_abandoned",
        "_args",
        "_done",
        "_error",
        "_finished",
        "_fn",
        "_handle",
        "_name",
        "_notifier",
        "_point",
        "_reason",
        "_result",
        "_retrieved",
        "_running",
        "_scope",
        "_stages",
        "_thread",
        "_token",
        "_value",
    )
    _stages: Stages
    _handle: int
    #: The coroutine function and its arguments, until the stage runs them.
    _fn: Callable[..., Awaitable[_T]] | None
    _args: tuple[object, ...]
    _name: str
    _value: int
    #: The point recorded before the stage's wait, armed in the stream: the stage's turn.
    _point: Point
    _notifier: weakref.ref[Notifier]
    _token: EventLoopToken
    _thread: int
    _scope: anyio.CancelScope
    _done: anyio.Event
    #: Why it was cancelled; None while it was not.
    _reason: str | None
    _running: bool
    _finished: bool
    #: It did not run because a stage before it failed.
    _abandoned: bool
    #: Someone awaited its outcome.
    _retrieved: bool
    _result: _T | None
    _error: BaseException | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use Stream.enqueue_host() to get a HostStage")

    @classmethod
    def _create(
        cls,
        stream: Stream,
        stages: Stages,
        notifier: Notifier,
        fn: Callable[..., Awaitable[_T]],
        args: tuple[object, ...],
        value: int,
        point: Point,
    ) -> HostStage[_T]:
        self: HostStage[_T] = object.__new__(cls)
        self._stages = stages
        self._handle = stream._handle
        self._point = point
        self._fn = fn
        self._args = args
        self._name = f"{getattr(fn, '__qualname__', type(fn).__name__)} (stage {value})"
        self._value = value
        self._notifier = weakref.ref(notifier)
        self._token = anyio.lowlevel.current_token()
        self._thread = threading.get_ident()
        self._scope = anyio.CancelScope()
        self._done = anyio.Event()
        self._reason = None
        self._running = False
        self._finished = False
        self._abandoned = False
        self._retrieved = False
        self._result = None
        self._error = None
        return self

    def __repr__(self) -> str:
        state = "done" if self._finished else "running" if self._running else "pending"
        return f"<HostStage {self._name} on stream {self._handle:#x}: {state}>"

    # -------------------------------------------------------------- public

    def done(self) -> bool:
        """True once the stage has ended (its coroutine returned or raised, or it was
        cancelled or abandoned) and released its position on the stream."""
        return self._finished

    def cancel(self) -> bool:
        """Cancel the stage. False if it has ended already, else True. From any thread.

        A running coroutine is cancelled. A stage still waiting for its turn never runs its
        coroutine, but keeps its position until the work before it has completed: the stream
        never runs ahead of that work. Either way ``await stage`` then raises
        :class:`~aiocudasem.StageCancelledError`, unless the coroutine caught the cancellation
        and returned, and the stages enqueued behind it so far are abandoned."""
        if self._finished:
            return False
        self._on_loop(partial(self._cancel, "HostStage.cancel() was called", turn=False))
        return True

    def __await__(self) -> Generator[Any, Any, _T]:
        """``await stage``: the coroutine's return value once the stage has ended, or what
        ended it raised (see the class). Always a checkpoint; cancelling it leaves the stage
        running."""
        return self._outcome().__await__()

    async def _outcome(self) -> _T:
        if self._finished:
            await anyio.lowlevel.checkpoint()
        else:
            if anyio.lowlevel.current_token() != self._token:
                raise RuntimeError(
                    f"await the host stage {self._name} in the event loop that enqueued it: "
                    "its end is announced there only"
                )
            await self._done.wait()
        self._retrieved = True
        error = self._error
        if error is not None:
            if isinstance(error, AiocudasemError):
                raise error._for_waiter()
            raise error
        return self._result  # type: ignore[return-value]

    # -------------------------------------------------------------- the task

    async def _run(self) -> None:
        """The stage's task: never raises (see the module)."""
        cause: BaseException | None = None
        try:
            result, error = await self._attempt()
        except BaseException as exc:
            # The loop's cancellation, from outside the stage's own scope: the loop cancels its
            # tasks as it ends (or closes the notifier under the wait for the stage's turn), or
            # the coroutine let out a cancellation that was not the stage's (chained below).
            cause = exc
        if cause is not None:
            why = (
                "a cancellation of the event loop that was not the stage's ended it (an ending "
                "loop cancels its tasks; or the coroutine let one out: see __cause__)"
            )
            result, error = None, self._cancelled(why)
            error.__cause__ = cause
        self._finish(result, error)

    async def _attempt(self) -> tuple[_T | None, BaseException | None]:
        with self._scope:
            try:
                await current_notifier().wait(self._point)  # the stage's turn
            except AiocudasemError as exc:  # DeviceFaultError, or the driver's failure
                return None, exc
            if self._reason is not None:
                return None, self._cancelled(self._reason)
            failure = self._stages._abandoned_by(self._value)
            if failure is not None:
                self._abandoned = True
                return None, _abandoned_error(self._name, *failure)
            fn, args = self._fn, self._args
            self._fn, self._args = None, ()
            assert fn is not None
            self._running = True
            try:
                coro = fn(*args)
                if not inspect.isawaitable(coro):
                    raise TypeError(
                        f"the host stage's function returned {type(coro).__name__}, not a "
                        "coroutine: enqueue_host() takes an async def"
                    )
                return await coro, None
            except anyio.get_cancelled_exc_class():
                raise  # the scope's own cancellation ends the scope; another ends the task
            except BaseException as exc:
                return None, exc
        return None, self._cancelled(self._reason or "it was cancelled")

    def _finish(self, result: _T | None, error: BaseException | None) -> None:
        if self._finished:
            return
        self._running = False
        self._fn, self._args = None, ()
        self._result, self._error = result, error
        self._finished = True
        self._stages._settle(self, error)
        notifier = self._notifier()
        if notifier is not None:
            notifier.at_close.pop(self, None)
        self._done.set()

    def _cancelled(self, why: str) -> StageCancelledError:
        ran = "while its coroutine ran" if self._running else "before its coroutine ran"
        return StageCancelledError(
            f"the host stage {self._name} was cancelled {ran}: {why}; the stream went on "
            "without it, and the stages enqueued behind it until then do not run"
        )

    # -------------------------------------------------------------- from outside the task

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` on the stage's loop: now if this is its thread, else soon (nothing if
        that loop has ended, which ended the stage)."""
        if threading.get_ident() == self._thread:
            fn()
        else:
            call_soon(self._token, fn)

    def _cancel(self, why: str, *, turn: bool) -> None:
        """Cancel the stage for ``why``. ``turn``: also while it waits for its turn (the
        stream is being closed and released its position already)."""
        if self._finished:
            return
        if self._reason is None:
            self._reason = why
        if turn or self._running:
            self._scope.cancel()

    def _stop(self, why: str) -> None:
        """The stream is being closed: cancel the stage, whatever it is doing."""
        self._on_loop(partial(self._cancel, why, turn=True))

    def _loop_ended(self) -> None:
        """The notifier's ``at_close``: the loop ends and the stage is still pending (its
        task never ran, as asyncio does to a task cancelled before its first step). The
        notifier forgets the point next, and gives its event back."""
        if self._finished:
            return
        self._finish(None, self._cancelled("its event loop ended"))

    def __del__(self) -> None:
        try:
            error = self._error
            if error is None or self._retrieved:
                return
            if isinstance(error, (AbandonedError, DeviceFaultError)):
                return  # reported where it happened: the failed stage, the fault's log
            _log.logger.error("%r failed and nobody awaited it", self, exc_info=error)
        except Exception:  # an object half made, or the interpreter's exit
            pass


def _abandoned_error(name: str, failed: str, cause: BaseException) -> AbandonedError:
    err = AbandonedError(
        f"the host stage {name} did not run: the stage {failed} before it on the stream "
        f"failed or was cancelled ({type(cause).__name__}), so the work between them ran "
        "without it"
    )
    err.__cause__ = cause
    return err


def _is_coroutine_function(fn: object) -> bool:
    """``inspect.iscoroutinefunction()``, or marked as asyncio marks one on Python 3.11
    (``Stream.wait_complete``), or an object whose ``__call__`` is one."""
    return (
        inspect.iscoroutinefunction(fn)
        or getattr(fn, "_is_coroutine", None) is not None
        or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))
    )


def check_function(fn: object) -> None:
    """Raise ``TypeError`` unless ``fn`` is a coroutine function (a coroutine object is
    closed, so that it does not warn that it was never awaited)."""
    if inspect.iscoroutine(fn):
        fn.close()
        raise TypeError(
            "enqueue_host() takes a coroutine function and its arguments, as anyio's "
            "start_soon() does: enqueue_host(fetch, url), not enqueue_host(fetch(url))"
        )
    if not callable(fn) or not _is_coroutine_function(fn):
        raise TypeError(
            f"enqueue_host() takes a coroutine function (an async def), not "
            f"{type(fn).__name__}: run synchronous host code in a coroutine of your own "
            "(anyio.to_thread.run_sync() for blocking code)"
        )


def _notifier_here() -> Notifier:
    try:
        return current_notifier()
    except RuntimeError:  # anyio's NoEventLoopError (sniffio's error): no loop runs here
        raise RuntimeError(
            "enqueue_host() runs the stage's coroutine on the event loop it is called from: "
            "call it in a task of a running asyncio, uvloop or trio event loop"
        ) from None


def _capturing(driver: Driver, handle: int) -> bool:
    try:
        return driver.stream_capturing(handle)
    except CudaError:
        return False


def _new_stages(driver: Driver, device: int) -> Stages:
    fd = _new_fd(0)
    try:
        timeline = _StagesTimeline._create(driver, device, fd)
    except BaseException:
        os.close(fd)
        raise
    return Stages(timeline)


def enqueue_stage(
    stream: Stream, fn: Callable[..., Awaitable[_T]], args: tuple[object, ...]
) -> HostStage[_T]:
    """:meth:`Stream.enqueue_host`: see there."""
    check_function(fn)
    handle = stream.handle  # raises ClosedResourceError once closed
    notifier = _notifier_here()
    driver, device = stream._driver, stream._device
    if _capturing(driver, handle):
        raise UnsupportedFeatureError(
            "a host stage cannot be captured into a CUDA graph: its coroutine runs once, on "
            "the event loop, not at each launch of the graph; enqueue it outside capture"
        )
    stages = stream._stages
    if stages is None:
        stages = stream._stages = _new_stages(driver, device)
        if not stream._open:  # closed by another thread meanwhile, which saw no stages
            stages.close()
    with stages.lock:
        if stages.closed:
            raise anyio.ClosedResourceError("the stream is closed")
        owner = stages.notifier() if stages.notifier is not None else None
        if stages.pending and owner is not None and owner is not notifier and not owner.closed:
            exc = anyio.BusyResourceError("running host stages of")
            exc.args = (
                "this stream has host stages pending on another event loop, which is still "
                "running: enqueue a stream's stages from one event loop at a time",
            )
            raise exc
        if len(stages.pending) >= MAX_PENDING:
            raise anyio.WouldBlock(
                f"{MAX_PENDING} host stages are pending on this stream, the most it takes: await "
                "an earlier stage before enqueuing another (the stream holds everything behind "
                "a pending stage, and a full queue of GPU commands would block the event loop "
                "that must run it)"
            )
        value = stages.issued + 1
        pool = event_pool.free_list(driver, device)
        event = record_pooled(driver, device, pool, handle)  # the work before the stage
        point = Point(driver, device, handle, event, pool, stream._history)
        try:
            notifier.arm_in_stream(point)
        except BaseException:
            give_back(driver, pool, event)
            raise
        # Armed: the notifier has the point now, and gives its event back once it fires.
        enqueue_words(driver, handle, [(stages.timeline, value)], write=False)
        stages.issued = value
        stages.notifier = weakref.ref(notifier)
        stage = HostStage._create(stream, stages, notifier, fn, args, value, point)
        stages.pending[stage] = None
    notifier.at_close[stage] = stage._loop_ended
    try:
        notifier.loop.spawn(stage._run, f"aiocudasem host stage {stage._name}")
    except BaseException:
        # No task will run it: release its position now (no stage can be pending before it,
        # since this loop cannot run one) and forget it.
        stage._loop_ended()
        raise
    return stage
