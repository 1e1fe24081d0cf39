"""Finding the running loop's notifier (:func:`current_notifier`, on every await), and
waiting on one of the library's private streams through it (:func:`wait_private_stream`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from .. import _hotpath, _release
from ._loop import Notifier, _live_notifiers
from ._points import Point
from ._pools import event_pool, host_wait_streams, record_pooled

if TYPE_CHECKING:
    from .._driver import Driver

__all__ = ("current_notifier", "running_notifier", "wait_private_stream")

_NOTIFIER: anyio.lowlevel.RunVar[Notifier] = anyio.lowlevel.RunVar("aiocudasem_notifier")


async def wait_private_stream(
    driver: Driver, device: int, enqueue: Callable[[int], object], key: object = None
) -> None:
    """Take a private stream of ``device`` (the host-wait pool), let ``enqueue(stream)`` put
    GPU work or waits on it, and wait until the stream has passed them. A checkpoint. Used by
    host-side semaphore waits, interprocess events and ``ready()``.

    A stream whose wait completed goes back to the pool. One whose wait was cancelled or
    failed may stay blocked: it is parked until the driver reports it idle, with its side
    stream and the host function already queued there, rather than destroyed, since the next
    wait would otherwise create two streams (see ``_HostWaitStreams``). ``key``, hashable:
    what the wait waits for, if a later wait with an equal key may go behind this one's
    abandoned GPU wait (it waits for no less). A cancelled wait with a key leaves its stream
    to such a retry, which then enqueues behind it and shares its host function."""
    await anyio.lowlevel.checkpoint_if_cancelled()
    notifier = current_notifier()
    stream = host_wait_streams.take(driver, device, key)
    try:
        enqueue(stream)
        pool = event_pool.free_list(driver, device)
        event = record_pooled(driver, device, pool, stream)
        history = notifier.history(driver, stream)
        await notifier.wait(Point(driver, device, stream, event, pool, history))
    except BaseException as exc:
        # Only a cancelled wait's GPU wait is worth a retry's sharing: a failed one's stream
        # may belong to a faulted device, which the next look finds and destroys.
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        host_wait_streams.park(driver, device, stream, key if cancelled else None)
        raise
    host_wait_streams.give(driver, device, stream)
    host_wait_streams.sweep(driver, device)


def running_notifier() -> Notifier | None:
    """The running event loop's notifier if it has an open one, else None (also outside a
    running loop). Creates nothing."""
    try:
        n = _NOTIFIER.get(None)
    except RuntimeError:  # no event loop is running in this thread
        return None
    return None if n is None or n.closed else n


class _Here(threading.local):
    #: The notifier this thread used last: found again without anyio's backend lookup.
    notifier: Notifier | None = None


_here = _Here()
_deferred = _release._deferred  # releases that wait for a loop to run them (see _release)


def _find_notifier() -> Notifier:
    """:func:`current_notifier` the long way: after deferred releases, through anyio."""
    if _deferred:
        _release.flush()
    n = _here.notifier
    if n is not None and n.serves_running_loop():
        return n
    # anyio finds the running backend with sniffio on every call (about 0.5 us, and every
    # anyio.lowlevel.checkpoint() or anyio.Event() makes one): a notifier looks its backend up
    # once and calls it directly (the public anyio.abc.AsyncBackend interface).
    found = anyio.lowlevel.current_token()
    backend, token = found.backend_class, found.native_token
    try:
        n = _NOTIFIER.get()
        if n.closed:
            n = None
    except LookupError:
        n = None
    if n is None:
        n = Notifier(backend, token)
        n._bind_to_loop()
        _NOTIFIER.set(n)
    _here.notifier = n
    return n


#: current_notifier() -> Notifier: the notifier of the running event loop, created on first use
#: and closed when the loop ends. In C, as Finder: the notifier this thread used last
#: (``_here.notifier``), if no release waits for a loop and it still serves the running loop;
#: else _find_notifier(). It holds these three objects from import on: replacing the module's
#: names later does not reach it.
current_notifier: Callable[[], Notifier] = _hotpath.Finder(_here, _deferred, _find_notifier)


def _after_fork_in_child() -> None:
    """CUDA cannot be used in a forked child. The drivers refuse every call (see
    ``_driver``), the pools forget the parent's handles (see ``_pools``) and the watchdog its
    threads (see ``_watchdog``); here loops that were parked in the parent are woken so that
    their waiters fail with the driver's error instead of hanging."""
    for n in list(_live_notifiers):
        n._fault_detected()


os.register_at_fork(after_in_child=_after_fork_in_child)
