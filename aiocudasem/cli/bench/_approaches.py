"""The approaches compared: each waits for everything enqueued so far on a raw stream
handle, as its users would write it."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import importlib.metadata
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar

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
