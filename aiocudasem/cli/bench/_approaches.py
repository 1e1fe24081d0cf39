"""The approaches compared: each waits for everything enqueued so far on a raw stream
handle, as its users would write it."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import importlib.metadata
import itertools
import queue
import threading
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, ClassVar, Final

import anyio

import aiocudasem as acs
from aiocudasem import configure
from aiocudasem._notify import yield_once
from aiocudasem.lowlevel import HostNotifier

# ---------------------------------------------------------------- approaches
#
# Each approach waits for "everything enqueued so far on stream handle h" from a coroutine.
# `asyncio_only` ones use asyncio primitives directly, as their users would.


class Approach:
    name = ""
    label = ""
    asyncio_only = True
    available = True
    why_unavailable = ""

    def __init__(self, drv: acs.Driver) -> None:
        self.drv = drv

    async def wait(self, h: int) -> None:
        raise NotImplementedError

    def waiter(self, h: int) -> Callable[[], Awaitable[None]]:
        """What the throughput loop awaits for stream ``h``, made once per stream, as its
        users would hold it: a polling loop written out, a library's bound method. No
        approach pays a per-await lookup of the benchmark's own."""
        wait = self.wait
        return lambda: wait(h)

    def setup(self) -> None:
        """Called once before this approach's measurements."""

    def teardown(self) -> None:
        """Called once after them."""

    def close(self) -> None:
        """Called once the section that measures this approach is over: ends its threads."""


class BlockingSync(Approach):
    name, label = "sync", "blocking cuStreamSynchronize (floor; freezes the loop)"
    asyncio_only = False

    async def wait(self, h: int) -> None:
        self.drv.stream_synchronize(h)


class ToThread(Approach):
    name, label = "to_thread", "asyncio.to_thread(synchronize)"

    async def wait(self, h: int) -> None:
        await asyncio.to_thread(self.drv.stream_synchronize, h)


class PollSleep0(Approach):
    name, label = "poll0", "poll cuStreamQuery + sleep(0)"

    async def wait(self, h: int) -> None:
        q = self.drv.stream_query
        while not q(h):
            await asyncio.sleep(0)

    def waiter(self, h: int) -> Callable[[], Awaitable[None]]:
        q = self.drv.stream_query

        async def wait() -> None:
            while not q(h):
                await asyncio.sleep(0)

        return wait


class CheckpointFloor(Approach):
    """What any await that is a checkpoint costs, with no library around it: the loop's bare
    yield (the one that ``asyncio.sleep(0)`` makes, and the library's asyncio checkpoint), then
    one cuStreamQuery, repeated until the stream is idle. Unlike polling it yields before its
    first query, as every await of aiocudasem does (see docs/performance.md)."""

    name, label = (
        "checkpoint",
        "checkpoint + cuStreamQuery (an await that is a checkpoint; no library)",
    )

    #: The loop's checkpoint (``run_trio`` makes the trio one).
    checkpoint = staticmethod(yield_once)

    def wait(self, h: int) -> Coroutine[Any, Any, None]:
        return self.waiter(h)()  # that coroutine itself: no frame of the benchmark's around it

    def waiter(self, h: int) -> Callable[[], Coroutine[Any, Any, None]]:
        q, checkpoint = self.drv.stream_query, self.checkpoint

        async def wait() -> None:
            await checkpoint()
            while not q(h):
                await checkpoint()

        return wait


class EventThread(Approach):
    """The floor of any wait that does not spin: a thread of its own, blocked in
    cuEventSynchronize on an event created with the blocking-sync flag
    (``CU_EVENT_BLOCKING_SYNC``: the driver puts the thread to sleep until the GPU's interrupt)
    and recorded behind the work, then wakes the loop the loop's own way (a future resolved
    with ``call_soon_threadsafe`` on asyncio and uvloop, a ``trio.Event`` set from the trio
    token on trio). No library, no pool of threads: the least a sleeping waiter can cost. One
    wait at a time per stream (its event is re-recorded by the next)."""

    name, label = (
        "event_thread",
        "a thread blocked in cuEventSynchronize, blocking-sync event (the floor without spinning)",
    )
    asyncio_only = False

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.jobs: queue.SimpleQueue[tuple[int, Callable[[BaseException | None], None]] | None]
        self.jobs = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.events: dict[int, int] = {}  # stream handle -> its blocking-sync event

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            event, done = job
            error: BaseException | None = None
            try:
                self.drv.event_synchronize(event)
            except BaseException as exc:  # handed to the waiter, which raises it
                error = exc
            done(error)

    def _event(self, h: int) -> int:
        ev = self.events.get(h)
        if ev is None:
            ev = self.events[h] = self.drv.event_create(0, blocking=True)
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name="event_thread", daemon=True)
            self.thread.start()
        return ev

    async def wait(self, h: int) -> None:
        ev = self._event(h)
        self.drv.event_record(ev, h)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: trio
            await self._wait_trio(ev)
            return
        fut: asyncio.Future[None] = loop.create_future()

        def resolve(error: BaseException | None) -> None:
            if not fut.done():
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)

        def done(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(resolve, error)

        self.jobs.put((ev, done))
        await fut

    async def _wait_trio(self, ev: int) -> None:
        import trio

        token = trio.lowlevel.current_trio_token()
        woken = trio.Event()
        errors: list[BaseException | None] = []

        def done(error: BaseException | None) -> None:
            errors.append(error)
            token.run_sync_soon(woken.set)

        self.jobs.put((ev, done))
        await woken.wait()
        if errors[0] is not None:
            raise errors[0]

    def close(self) -> None:
        if self.thread is not None:
            self.jobs.put(None)
            self.thread.join()
            self.thread = None
        for ev in self.events.values():
            self.drv.event_destroy(ev)
        self.events.clear()


class PollSleep1ms(Approach):
    name, label = "poll1ms", "poll cuStreamQuery + sleep(0.001)"

    async def wait(self, h: int) -> None:
        q = self.drv.stream_query
        while not q(h):
            await asyncio.sleep(0.001)


_PYCB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class PythonCallback(Approach):
    """numba-style: a Python host callback (it takes the GIL on the driver's thread) that
    resolves a future with call_soon_threadsafe."""

    name, label = "pycallback", "Python host callback, GIL (numba style)"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.futures: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = {}
        self.next = 1

        def cb(key: int | None) -> None:
            loop, fut = self.futures.pop(key or 0)
            loop.call_soon_threadsafe(fut.set_result, None)

        self.cfunc = _PYCB(cb)
        self.addr = ctypes.cast(self.cfunc, ctypes.c_void_p).value or 0

    def enqueue(self, h: int) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        key = self.next
        self.next += 1
        self.futures[key] = (loop, fut)
        self.drv.launch_host_func(h, self.addr, key)
        return fut

    async def wait(self, h: int) -> None:
        await self.enqueue(h)


class Aiocudasem(Approach):
    name, label = "aiocudasem", "aiocudasem (await stream.wait_complete())"
    asyncio_only = False
    #: Settings in force for this approach's measurements (``aiocudasem.configure``).
    settings: ClassVar[dict[str, Any]] = {}

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.streams: dict[int, acs.Stream] = {}
        self.saved = configure()

    def stream(self, h: int) -> acs.Stream:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = acs.Stream.adopt(h, driver=self.drv)
        return s

    def wait(self, h: int) -> Coroutine[Any, Any, None]:
        # The coroutine of wait_complete() itself, as its users await it: a coroutine of the
        # benchmark's around it would be one more frame for each waiter of a crowd to resume
        # (and one more object for each to keep), which the polling loop does not pay.
        return self.stream(h).wait_complete()

    def waiter(self, h: int) -> Callable[[], Awaitable[None]]:
        return self.stream(h).wait_complete

    def enqueue(self, h: int) -> acs.Event:
        """For the stall test: an event behind the work, which a task then awaits."""
        return self.stream(h).record()

    # Once for the whole approach: saving and restoring around each of 1,000 concurrent waits
    # would interleave and leave the settings wrong.
    def setup(self) -> None:
        self.saved = configure()
        if self.settings:
            configure(**self.settings)

    def teardown(self) -> None:
        configure(**dataclasses.asdict(self.saved))  # every setting, as it was


class AiocudasemParked(Aiocudasem):
    name, label = "aiocudasem_parked", "aiocudasem, spinning off (host function only)"
    settings: ClassVar[dict[str, Any]] = {"spin_limit": 0}


class CHostFnOnWorkStream(Approach):
    """The library's C host function and eventfd (``aiocudasem.lowlevel.HostNotifier``) with
    nothing around it, launched on the work stream itself: one host function per await, no
    side stream, no spinning, no chains. The design the library rejected, kept to show what
    the side stream buys, and the floor of a host-function notifier in Python."""

    name, label = "c_workstream", "C host function + eventfd on the work stream (no library)"
    asyncio_only = False

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        self.notifier: HostNotifier | None = None
        self.tokens = itertools.count(1)
        self.pending: set[int] = set()
        self.lock: anyio.Lock | None = None

    def setup(self) -> None:
        self.notifier, self.lock = HostNotifier(), anyio.Lock()

    def teardown(self) -> None:
        if self.notifier is not None:
            self.notifier.close()

    def enqueue(self, h: int) -> Coroutine[Any, Any, None]:
        """Launch the host function now; the returned coroutine awaits it."""
        assert self.notifier is not None
        token = next(self.tokens)
        self.notifier.launch(self.drv, h, token)
        self.pending.add(token)
        return self._reported(token)

    async def _reported(self, token: int) -> None:
        # Whoever holds the lock reads the fd for everyone; the others find their token gone.
        assert self.notifier is not None
        assert self.lock is not None
        async with self.lock:
            while token in self.pending:
                await anyio.wait_readable(self.notifier.fileno())
                self.pending.difference_update(self.notifier.drain())

    async def wait(self, h: int) -> None:
        await self.enqueue(h)


class CupyHostFunc(Approach):
    name, label = "cupy", "CuPy launch_host_func + call_soon_threadsafe"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            import cupy  # type: ignore[import-not-found]
            import cupy.cuda  # type: ignore[import-not-found]

            self.cp = cupy
            self.streams: dict[int, Any] = {}
            self.version = cupy.__version__
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    def enqueue(self, h: int) -> asyncio.Future[None]:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.cp.cuda.ExternalStream(h)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        s.launch_host_func(lambda _arg: loop.call_soon_threadsafe(fut.set_result, None), None)
        return fut

    async def wait(self, h: int) -> None:
        await self.enqueue(h)


class _Torch(Approach):
    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            import torch  # type: ignore[import-not-found]

            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda is not available")
            self.torch = torch
            self.streams: dict[int, Any] = {}
            self.version = torch.__version__
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    def record(self, h: int) -> Any:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.torch.cuda.ExternalStream(h)
        ev = self.torch.cuda.Event()
        ev.record(s)
        return ev


class TorchQuery1ms(_Torch):
    name, label = "torch_query", "PyTorch Event.query() + sleep(1 ms)"

    async def wait(self, h: int) -> None:
        ev = self.record(h)
        while not ev.query():
            await asyncio.sleep(0.001)


class TorchToThread(_Torch):
    name, label = "torch_to_thread", "PyTorch to_thread(Event.synchronize)"

    async def wait(self, h: int) -> None:
        ev = self.record(h)
        await asyncio.to_thread(ev.synchronize)


class NumbaAsyncDone(Approach):
    name, label = "numba", "numba-cuda Stream.async_done()"

    def __init__(self, drv: acs.Driver) -> None:
        super().__init__(drv)
        try:
            from numba import cuda  # type: ignore[import-not-found]

            self.cuda = cuda
            self.streams: dict[int, Any] = {}
            self.version = importlib.metadata.version("numba-cuda")
        except Exception as exc:
            self.available, self.why_unavailable = False, f"{type(exc).__name__}: {exc}"

    async def wait(self, h: int) -> None:
        s = self.streams.get(h)
        if s is None:
            s = self.streams[h] = self.cuda.external_stream(h)
        await s.async_done()


# ---------------------------------------------------------------- trio's own forms


class TrioPoll0(Approach):
    name, label = "poll0", "poll + trio.sleep(0)"
    asyncio_only = False

    async def wait(self, h: int) -> None:
        import trio

        q = self.drv.stream_query
        while not q(h):
            await trio.lowlevel.checkpoint()

    def waiter(self, h: int) -> Callable[[], Awaitable[None]]:
        import trio

        q, checkpoint = self.drv.stream_query, trio.lowlevel.checkpoint

        async def wait() -> None:
            while not q(h):
                await checkpoint()

        return wait


class TrioCheckpoint(CheckpointFloor):
    label = "trio.lowlevel.checkpoint() + cuStreamQuery (no library)"
    asyncio_only = False

    def __init__(self, drv: acs.Driver) -> None:
        import trio

        super().__init__(drv)
        self.checkpoint = trio.lowlevel.checkpoint


class TrioToThread(Approach):
    name, label = "to_thread", "trio.to_thread.run_sync(synchronize)"
    asyncio_only = False

    async def wait(self, h: int) -> None:
        import trio

        await trio.to_thread.run_sync(self.drv.stream_synchronize, h)


#: The approaches measured on uvloop and trio as well as on asyncio's own loop (by the names
#: of their asyncio forms): the floors, what people write by hand, the bare C host function
#: and the library; the peers' wrappers run on asyncio's own loop only.
LOOP_APPROACHES: Final = (
    "sync",
    "poll0",
    "checkpoint",
    "to_thread",
    "c_workstream",
    "aiocudasem_parked",
    "aiocudasem",
)


ALL = [
    BlockingSync,
    ToThread,
    PollSleep0,
    CheckpointFloor,
    PollSleep1ms,
    PythonCallback,
    CupyHostFunc,
    TorchQuery1ms,
    TorchToThread,
    NumbaAsyncDone,
    CHostFnOnWorkStream,
    AiocudasemParked,
    Aiocudasem,
]

#: trio's form of each approach that has one (the others run there as they are).
_TRIO = {"poll0": TrioPoll0, "checkpoint": TrioCheckpoint, "to_thread": TrioToThread}


def for_loop(loop: str, names: Collection[str] | None = None) -> list[type[Approach]]:
    """The approaches measured on ``loop`` ("asyncio", "uvloop" or "trio"), in the benchmark's
    order, those in ``names`` if given: every one on asyncio, :data:`LOOP_APPROACHES` on the
    others, in trio's form on trio."""
    out: list[type[Approach]] = []
    for cls in ALL:
        if names is not None and cls.name not in names:
            continue
        if loop != "asyncio" and cls.name not in LOOP_APPROACHES:
            continue
        out.append(_TRIO.get(cls.name, cls) if loop == "trio" else cls)
    return out
