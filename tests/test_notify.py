"""The C completion notifier (``aiocudasem._notify``, the core of
``aiocudasem.lowlevel.HostNotifier``), driven directly.

The host function is called here the way the CUDA driver calls it: through its C address, from
threads that are not the event loop's, with the GIL released (ctypes ``CFUNCTYPE`` foreign calls
release the GIL). No event loop is involved.

Never pass a made-up integer to ``disarm()`` or to the host function: both dereference it.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from collections.abc import Iterator

import pytest

from aiocudasem._notify import HOST_FN as HOST_FUNCTION
from aiocudasem._notify import Notifier

HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
#: The C host function, called with the GIL released (a ctypes foreign call).
host_fn = HostFn(HOST_FUNCTION)

TIMEOUT = 10.0  # seconds: the bound on every blocking call, so a bug cannot hang the suite


def readable(fd: int) -> bool:
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)


def open_fds() -> set[int]:
    """The process's open fds, without the transient one that lists them."""
    return {int(n) for n in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{n}")}


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def notifier() -> Iterator[Notifier]:
    n = Notifier()
    yield n
    n.close()


# ------------------------------------------------------------------------------ basics


def test_host_fn_is_a_nonzero_address() -> None:
    assert isinstance(HOST_FUNCTION, int)
    assert HOST_FUNCTION != 0


def test_constructor_takes_no_arguments() -> None:
    with pytest.raises(TypeError):
        Notifier(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Notifier(x=1)  # type: ignore[call-arg]


def test_queued_says_whether_a_completion_waits_and_reads_nothing(notifier: Notifier) -> None:
    assert notifier.queued() is False
    host_fn(notifier.arm(1))
    assert notifier.queued() is True
    assert readable(notifier.fileno())  # queued() left the wake-up for drain() to consume
    assert notifier.queued() is True
    assert notifier.drain() == [1]
    assert notifier.queued() is False
    assert notifier.kick()  # a wake-up without a completion queues nothing
    assert notifier.queued() is False
    host_fn(notifier.arm(2))
    notifier.close()
    assert notifier.queued() is False  # closed: nothing will be delivered


def test_arm_returns_distinct_nonzero_user_data(notifier: Notifier) -> None:
    users = [notifier.arm(i) for i in range(50)]
    assert all(isinstance(u, int) and u != 0 for u in users)
    assert len(set(users)) == len(users)
    assert notifier.stats()["pending"] == 50
    for u in users:
        notifier.disarm(u)
    assert notifier.stats()["pending"] == 0


def test_arm_rejects_tokens_outside_u64(notifier: Notifier) -> None:
    with pytest.raises(OverflowError):
        notifier.arm(-1)
    with pytest.raises(OverflowError):
        notifier.arm(1 << 64)
    with pytest.raises(TypeError):
        notifier.arm("1")  # type: ignore[arg-type]
    assert notifier.stats()["pending"] == 0


def test_host_call_delivers_token_and_wakes_fd(notifier: Notifier) -> None:
    fd = notifier.fileno()
    assert not readable(fd)
    assert notifier.drain() == []
    user = notifier.arm(1234)
    assert not readable(fd)  # arming alone wakes nobody
    host_fn(user)
    assert readable(fd)
    assert notifier.stats() == {"pending": 0, "wakeups": 1, "fired": 1}
    assert notifier.drain() == [1234]
    assert not readable(fd)
    assert notifier.drain() == []


def test_token_extremes_round_trip(notifier: Notifier) -> None:
    tokens = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    for t in tokens:
        host_fn(notifier.arm(t))
    assert notifier.drain() == tokens


def test_drain_returns_tokens_oldest_first(notifier: Notifier) -> None:
    users = {t: notifier.arm(t) for t in (10, 20, 30, 40, 50)}
    order = [30, 10, 50, 20, 40]  # completion order, not arming order
    for t in order:
        host_fn(users[t])
    assert notifier.drain() == order


def test_every_drain_rearms_the_wakeup(notifier: Notifier) -> None:
    fd = notifier.fileno()
    for i in range(5):
        host_fn(notifier.arm(i))
        assert readable(fd)
        assert notifier.drain() == [i]
        assert not readable(fd)
    assert notifier.stats() == {"pending": 0, "wakeups": 5, "fired": 5}


def test_burst_coalesces_into_one_wakeup(notifier: Notifier) -> None:
    fd = notifier.fileno()
    users = [notifier.arm(i) for i in range(100)]
    for u in users:
        host_fn(u)
    assert readable(fd)
    stats = notifier.stats()
    assert stats["wakeups"] == 1
    assert stats["fired"] == 100
    assert stats["pending"] == 0
    assert notifier.drain() == list(range(100))
    assert not readable(fd)


# ------------------------------------------------------------------------------ concurrency


def test_no_completion_lost_under_concurrency(notifier: Notifier) -> None:
    threads_n, per_thread = 8, 1500
    fd = notifier.fileno()
    start = threading.Barrier(threads_n + 1, timeout=TIMEOUT)

    def producer(k: int) -> None:
        # arm() needs the GIL; the host function is called with the GIL released, so host
        # calls of different threads and the main thread's drain() really run at once.
        users = [notifier.arm(k * 1_000_000 + i) for i in range(per_thread)]
        start.wait()
        for u in users:
            host_fn(u)

    threads = [threading.Thread(target=producer, args=(k,), daemon=True) for k in range(threads_n)]
    for t in threads:
        t.start()
    start.wait()

    got: list[int] = []
    drains = 0
    deadline = time.monotonic() + TIMEOUT
    total = threads_n * per_thread
    while len(got) < total and time.monotonic() < deadline:
        select.select([fd], [], [], 0.5)
        got.extend(notifier.drain())
        drains += 1
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    got.extend(notifier.drain())  # nothing should be left, but don't lose what is

    assert len(got) == total, f"{total - len(got)} completions missing"
    assert len(set(got)) == total, "a completion was delivered twice"
    assert set(got) == {k * 1_000_000 + i for k in range(threads_n) for i in range(per_thread)}
    # The queue is FIFO: each producer's completions arrive in the order it made them.
    for k in range(threads_n):
        mine = [t - k * 1_000_000 for t in got if t // 1_000_000 == k]
        assert mine == list(range(per_thread))
    stats = notifier.stats()
    assert stats["pending"] == 0
    assert stats["fired"] == total
    assert 1 <= stats["wakeups"] <= total
    assert not readable(fd) or notifier.drain() == []  # at most a spurious wake-up is left


# ------------------------------------------------------------------------------ disarm


def test_disarm_releases_the_node(notifier: Notifier) -> None:
    a = notifier.arm(1)
    b = notifier.arm(2)
    assert notifier.stats()["pending"] == 2
    notifier.disarm(a)
    assert notifier.stats()["pending"] == 1
    host_fn(b)
    assert notifier.drain() == [2]  # the disarmed node never shows up
    assert notifier.stats() == {"pending": 0, "wakeups": 1, "fired": 1}


def test_disarm_of_another_notifiers_node_raises() -> None:
    a, b = Notifier(), Notifier()
    try:
        user = a.arm(7)
        with pytest.raises(ValueError, match="not a node armed by this notifier"):
            b.disarm(user)
        assert a.stats()["pending"] == 1
        assert b.stats()["pending"] == 0
        a.disarm(user)  # still A's, and still valid
        assert a.stats()["pending"] == 0
    finally:
        a.close()
        b.close()


def test_disarm_of_null_or_non_int_raises(notifier: Notifier) -> None:
    # NULL is checked before any dereference; a str fails the int conversion.
    with pytest.raises(ValueError, match="not a node armed by this notifier"):
        notifier.disarm(0)
    with pytest.raises(TypeError):
        notifier.disarm("x")  # type: ignore[arg-type]
    assert notifier.stats()["pending"] == 0


# ------------------------------------------------------------------------------ close


def test_close_is_idempotent_and_later_calls_raise() -> None:
    n = Notifier()
    fd = n.fileno()
    assert not n.closed
    n.close()
    assert n.closed
    n.close()
    assert n.closed
    assert not fd_is_open(fd)  # nothing pending: the fd goes at once
    for call in (n.fileno, n.drain, n.stats, lambda: n.arm(1), lambda: n.disarm(1)):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_close_discards_queued_completions() -> None:
    n = Notifier()
    fd = n.fileno()
    for i in range(10):
        host_fn(n.arm(i))
    n.close()  # frees the queued nodes; none pending, so the fd is closed now
    assert n.closed
    assert not fd_is_open(fd)


def _late_host_calls_write_nothing(fd: int, users: list[int]) -> None:
    """Give the closed notifier's fd number to a new eventfd, run the outstanding host
    functions, and check that none of them wrote into the fd that now has that number."""
    reused = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        if reused != fd:
            pytest.skip(f"fd {fd} was not reused (got {reused}); another thread opened fds")
        for user in users:
            host_fn(user)  # the last one frees the state
        with pytest.raises(BlockingIOError):
            os.read(reused, 8)
    finally:
        os.close(reused)


def test_close_with_pending_nodes_closes_fd_now_and_late_host_calls_write_nothing() -> None:
    n = Notifier()
    fd = n.fileno()
    a = n.arm(1)
    b = n.arm(2)
    host_fn(n.arm(3))  # queued but undrained: freed by close()
    n.close()
    assert n.closed
    # The loop's fd goes with the loop, even with host functions outstanding (a cancelled wait
    # on a semaphore that is never signalled keeps one outstanding forever).
    assert not fd_is_open(fd)
    # A late host function must not write into the fd number, which someone else now owns.
    _late_host_calls_write_nothing(fd, [a, b])


def test_dealloc_with_pending_node_closes_fd_and_state_outlives_it() -> None:
    n = Notifier()
    fd = n.fileno()
    user = n.arm(5)
    del n  # tp_dealloc closes; the state outlives the object, the fd does not
    assert not fd_is_open(fd)
    _late_host_calls_write_nothing(fd, [user])


def test_kick_wakes_the_fd_without_a_completion() -> None:
    n = Notifier()
    try:
        assert not readable(n.fileno())
        assert n.kick() is True
        assert readable(n.fileno())
        assert n.drain() == []
        assert not readable(n.fileno())
    finally:
        n.close()
    assert n.kick() is False  # closed: ignored


def test_host_call_racing_close_from_threads() -> None:
    # Many notifiers are closed while other threads are calling their host functions; each fd
    # must be closed exactly once, after its last host function (no crash, no leak).
    before = open_fds()
    rounds = 200
    for _ in range(rounds):
        n = Notifier()
        users = [n.arm(i) for i in range(20)]
        go = threading.Event()

        def fire(us: list[int], go: threading.Event = go) -> None:
            go.wait(TIMEOUT)
            for u in us:
                host_fn(u)

        threads = [
            threading.Thread(target=fire, args=(users[i::2],), daemon=True) for i in range(2)
        ]
        for t in threads:
            t.start()
        go.set()
        n.close()
        for t in threads:
            t.join(TIMEOUT)
            assert not t.is_alive()
    assert open_fds() == before


# ------------------------------------------------------------------------------ the GIL


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def _run_in_c_thread_holding_the_gil(fn: int, arg: int | None, timeout: float) -> int:
    """Start ``fn(arg)`` on a plain C thread (``pthread_create``; the thread is never known to
    Python) and join it with ``pthread_timedjoin_np`` called through ``ctypes.PyDLL``, whose
    foreign calls keep the GIL (unlike ``CDLL``'s). Returns the join's status: 0 if ``fn``
    finished within ``timeout`` while this thread held the GIL, ETIMEDOUT if it did not.

    Starting a ``void fn(void *)`` as a pthread start routine relies on the platform ABI (its
    garbage return value is never read), which holds on x86-64 and AArch64 Linux."""
    libc = ctypes.CDLL(None)  # calls release the GIL
    libc_gil = ctypes.PyDLL(None)  # calls keep the GIL
    if not hasattr(libc_gil, "pthread_timedjoin_np"):
        pytest.skip("needs glibc's pthread_timedjoin_np")
    # Created with the GIL held: through CDLL the new thread could take the GIL and finish
    # before the timed join starts, and a function that needs the GIL would look GIL-free.
    pthread_create = libc_gil.pthread_create
    pthread_create.argtypes = (
        ctypes.POINTER(ctypes.c_ulong),
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    )
    pthread_create.restype = ctypes.c_int
    timedjoin = libc_gil.pthread_timedjoin_np
    timedjoin.argtypes = (ctypes.c_ulong, ctypes.c_void_p, ctypes.POINTER(_Timespec))
    timedjoin.restype = ctypes.c_int
    pthread_join = libc.pthread_join
    pthread_join.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
    pthread_join.restype = ctypes.c_int

    tid = ctypes.c_ulong()
    assert pthread_create(ctypes.byref(tid), None, fn, arg) == 0
    deadline = time.time() + timeout
    ts = _Timespec(int(deadline), int((deadline % 1) * 1e9))
    rc = timedjoin(tid.value, None, ctypes.byref(ts))  # holds the GIL while it waits
    if rc != 0:
        assert pthread_join(tid.value, None) == 0  # releases the GIL: let the thread finish
    return int(rc)


def test_gil_probe_detects_a_function_that_takes_the_gil() -> None:
    # Control for the test below: a ctypes callback (which takes the GIL to run Python) cannot
    # finish while the joining thread holds the GIL, so the probe reports ETIMEDOUT.
    import errno

    called: list[int] = []
    cb = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _p: called.append(1))
    rc = _run_in_c_thread_holding_the_gil(ctypes.cast(cb, ctypes.c_void_p).value, None, 0.5)
    assert rc == errno.ETIMEDOUT
    assert called == [1]  # it did run, once the GIL was released


def test_host_fn_runs_to_completion_while_another_thread_holds_the_gil() -> None:
    """Proves: the host function completes on a thread that has no Python thread state while
    the main thread holds the GIL the whole time; had it taken the GIL it could not return
    before the bounded join gave the GIL up (see the control test above). Not proven: that no
    path under other timing (say, a close() racing the call) takes the GIL; this covers the
    live-notifier path and, in the next call, the closed-notifier path."""
    n = Notifier()
    fd = n.fileno()
    try:
        user = n.arm(99)
        rc = _run_in_c_thread_holding_the_gil(HOST_FUNCTION, user, TIMEOUT)
        assert rc == 0, f"pthread_timedjoin_np returned {rc}: the host function needed the GIL"
        assert readable(fd)
        assert n.drain() == [99]
        assert n.stats() == {"pending": 0, "wakeups": 1, "fired": 1}
        last = n.arm(100)
    finally:
        n.close()
    # The closed path: the fd is gone with close(); the last host function frees the state.
    assert not fd_is_open(fd)
    assert _run_in_c_thread_holding_the_gil(HOST_FUNCTION, last, TIMEOUT) == 0
    assert n.closed


def test_host_fn_from_threads_while_main_thread_runs_python(notifier: Notifier) -> None:
    """Weaker, but the way the library runs: ctypes threads call the host function while the
    main thread keeps executing Python (and so keeps taking the GIL back). Proves only that this
    mix delivers every completion; the GIL-free property is the test above."""
    users = [notifier.arm(i) for i in range(2000)]
    done = threading.Event()

    def fire() -> None:
        for u in users:
            host_fn(u)
        done.set()

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    spins = 0
    while not done.is_set():
        spins += sum(range(100))  # pure Python work between the host calls
    t.join(TIMEOUT)
    assert not t.is_alive()
    assert notifier.drain() == list(range(2000))
    assert notifier.stats()["pending"] == 0


# ------------------------------------------------------------------------------ fds


def test_create_and_close_leaks_no_fd() -> None:
    before = open_fds()
    for _ in range(200):
        n = Notifier()
        host_fn(n.arm(1))
        n.close()
    for _ in range(200):
        n = Notifier()
        n.fileno()
        del n  # closed by tp_dealloc
    assert open_fds() == before


def test_fd_is_nonblocking_and_cloexec(notifier: Notifier) -> None:
    import fcntl

    fd = notifier.fileno()
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert not os.get_inheritable(fd)


# ------------------------------------------------------------------ the asyncio checkpoint


def test_yield_once_yields_none_once_and_is_not_tracked_by_the_collector() -> None:
    import gc
    import inspect

    from aiocudasem._notify import yield_once

    y = yield_once()
    assert not gc.is_tracked(y)  # an await that passes it leaves nothing for the collector
    assert inspect.isawaitable(y)
    it = y.__await__()
    assert it is y
    assert next(it) is None  # the bare yield an asyncio task takes as "run me again"
    with pytest.raises(StopIteration) as stop:
        next(it)
    assert stop.value.value is None
    with pytest.raises(StopIteration):
        next(it)  # and stays exhausted
    assert yield_once() is not yield_once()  # a fresh one each: no state shared between awaits


def test_yield_once_is_a_checkpoint_of_an_asyncio_task() -> None:
    """Each await lets the other tasks run once, as ``asyncio.sleep(0)`` does; a cancellation
    meanwhile is raised at the await, inside the awaiting coroutine."""
    import asyncio

    from aiocudasem._notify import yield_once

    async def main() -> None:
        order: list[str] = []

        async def a() -> None:
            for i in range(3):
                order.append(f"a{i}")
                await yield_once()

        async def b() -> None:
            for i in range(3):
                order.append(f"b{i}")
                await asyncio.sleep(0)

        await asyncio.gather(a(), b())
        assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]

        seen: list[str] = []

        async def parked() -> None:
            try:
                await yield_once()
            except asyncio.CancelledError:
                seen.append("raised at the await")
                raise

        task = asyncio.ensure_future(parked())
        await asyncio.sleep(0)  # the task now sits at its yield
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["raised at the await"]

    asyncio.run(main())


def test_yield_once_takes_a_sent_value_and_a_close_as_a_generator_does() -> None:
    """The interpreter calls send() for a value other than None (3.12 and later always, earlier
    ones while tracing), and a coroutine's close() calls close(): both as for the bare yield of
    a generator."""
    from aiocudasem._notify import yield_once

    async def waiter() -> str:
        await yield_once()
        return "done"

    coro = waiter()
    assert coro.send(None) is None  # at the yield
    with pytest.raises(StopIteration) as stop:
        coro.send("ignored")
    assert stop.value.value == "done"

    coro = waiter()
    coro.send(None)
    coro.close()  # no error, and the coroutine is finished
    with pytest.raises(RuntimeError, match="cannot reuse"):
        coro.send(None)

    y = yield_once()
    assert y.send(42) is None
    with pytest.raises(StopIteration):
        y.send(None)
    y2 = yield_once()
    y2.close()
    with pytest.raises(StopIteration):
        next(y2)
