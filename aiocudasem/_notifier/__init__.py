"""Waiting for a point in a stream without blocking the event loop.

A *point* is an event recorded on a work stream. Awaiting it goes through up to two phases:

1. **Spin** (short and adaptive): query the event between checkpoints. Only streams whose recent
   waits were short spin, for at most ``Tuning.spin_limit`` seconds, and only ``max_spinners``
   coroutines at a time, so long waits and crowds of waiters cost no CPU.
2. **Park**: arm the C host function. It runs on a *side stream* that waits for the event, so
   the work stream never stalls on a host function (the default wake strategy, see ``_wake``).
   The host function appends a token to the C queue and wakes the loop's one fd. One of the
   parked coroutines, the *drainer*, waits on the fd and wakes the others; when it leaves (done
   or cancelled) it first delivers whatever is queued, then hands the role to another. A
   cancelled drainer therefore loses nobody's wake-up. When the last parked coroutine leaves
   with host functions still armed (abandoned waits'), a watcher of the fd collects them as
   they fire, so that their points are released whether or not the loop parks again.
   A parked ``wait_complete()`` of steady work *wakes ahead* (``_ahead``): an alarm on a timer
   fd wakes it just before its stream's predicted end, it spins over the end, and parks again
   if the work runs on.

Apart from those alarms, a parked loop is woken by a completion or by a device fault, never by
a timer. CUDA never calls
a host function after a context error, so a *watchdog thread* per device that coroutines are
parked on sleeps in ``cuEventSynchronize`` behind their work, which returns at once if the
context faults (see :class:`_Watchdog`). It then flags the loops parked on that device and kicks
their fds; their drainers fail the affected points with :class:`DeviceFaultError`. The watchdog
is never the path by which an ordinary completion is noticed.

There is one :class:`Notifier` per event-loop run (an anyio ``RunVar``), with one fd. It is
closed when its loop ends (through the loop's async-generator finalization, which asyncio,
uvloop and trio all run at shutdown), not by the garbage collector.

The modules, each importing only those before it (import-linter's ``notifier`` contract in
``pyproject.toml``): ``_tuning`` (settings), ``_pools`` (events, side streams), ``_points``,
``_wake`` (wake strategies), ``_watchdog``, ``_loops`` (the event-loop seam: one adapter per
kind of loop) and ``_chains`` (host functions and their chains), ``_ahead`` (the alarms and the
prediction of waking ahead), ``_parking`` (sleepers and the drainer), ``_loop`` (the
:class:`Notifier`: waits, counters, lifetime), ``_current`` (:func:`current_notifier`, private-
stream waits) and ``_statistics``.
"""

from __future__ import annotations

from ._current import current_notifier, running_notifier, wait_private_stream
from ._loop import Notifier
from ._loops import LoopAdapter
from ._loops._asyncio import mark_coroutine_function
from ._points import History, Point
from ._pools import (
    destroy_stream,
    event_pool,
    give_back,
    host_wait_streams,
    record_pooled,
    side_streams,
)
from ._statistics import Statistics, statistics
from ._tuning import Tuning, configure
from ._wake import prepare_new_stream, prepare_stream, reserve_host_wait_stream

__all__ = (
    "History",
    "LoopAdapter",
    "Notifier",
    "Point",
    "Statistics",
    "Tuning",
    "configure",
    "current_notifier",
    "destroy_stream",
    "event_pool",
    "give_back",
    "mark_coroutine_function",
    "host_wait_streams",
    "prepare_new_stream",
    "prepare_stream",
    "record_pooled",
    "reserve_host_wait_stream",
    "running_notifier",
    "side_streams",
    "statistics",
    "wait_private_stream",
)
