"""A snapshot of the notifier's counters: :func:`statistics`, for tests, benchmarks and
diagnostics. Reading them creates no notifier and starts no thread."""

from __future__ import annotations

from dataclasses import dataclass

from .. import _log
from ._current import running_notifier
from ._loop import _live_notifiers
from ._pools import event_pool, side_streams
from ._watchdog import _watchdog

__all__ = ("Statistics", "statistics")


@dataclass(frozen=True, slots=True)
class Statistics:
    """The notifier's counters at one moment, from :func:`statistics`.

    The first fourteen describe the notifier of the event loop that :func:`statistics` was
    called in; they are all zero outside a running loop and in a loop that has no open notifier
    (none of its waits has needed one yet, or it is shutting down). The last six are
    process-wide.
    """

    #: Host functions that this loop's notifier armed and that have not returned yet,
    #: abandoned waits' included (one behind work that never completes stays pending).
    pending: int = 0
    #: Host functions armed by this loop that have returned (run), collected or not.
    fired: int = 0
    #: Writes to this loop's fd by its host functions: a burst of completions that arrives
    #: before the loop reads the fd costs one.
    wakeups: int = 0
    #: Points whose host function this loop armed and whose completion it has not collected
    #: yet (one per work stream, and one per pending host stage besides, whose host function
    #: is on the work stream itself). An abandoned wait's point counts until the loop
    #: collects its host function's notification, which it does once the GPU gets past it,
    #: whether or not a coroutine of the loop parks again.
    armed: int = 0
    #: Points of this loop parked in a chain (one chain per work stream), the armed ones
    #: included, until they are finished or nobody waits on an unarmed one any more.
    chained: int = 0
    #: Coroutines asleep on a point (the drainer included).
    parked: int = 0
    #: Coroutines spinning: querying their point between checkpoints.
    spinning: int = 0
    #: Devices (per driver) that coroutines of this loop are parked on, which the watchdog
    #: watches for this loop.
    watched: int = 0
    #: Times this loop found its fd readable and read it: its drainer, or the watcher of the
    #: fd that collects abandoned waits' notifications while no coroutine is parked.
    drainer_wakeups: int = 0
    #: Awaits of this loop on GPU work (``Stream.wait_complete()``, ``Event.wait()``, the
    #: semaphore and host-timeline waits, ``wait_event()``, ...) that returned normally, one
    #: per coroutine, whatever path each took (the first query, a spin, a park, a point
    #: shared with others). A cancelled or failed await does not count.
    completed: int = 0
    #: Points of this loop that a device fault ended with :class:`DeviceFaultError`, one per
    #: point however many coroutines waited on it (a wait whose first query reports the fault
    #: has no point and is not counted).
    faulted: int = 0
    #: Waits of this loop that woke ahead (docs/architecture.md, "Waking ahead") and whose
    #: spin then saw the work end: the prediction held.
    ahead_caught: int = 0
    #: Waits that woke ahead too late: the work was done before the alarm or at its first
    #: query, and the wait paid the parked wake-up (or nearly).
    ahead_early: int = 0
    #: Waits that woke ahead too early: the spin ran out with the work still running, and the
    #: wait parked again.
    ahead_late: int = 0
    #: Open notifiers in the process: one per event loop that has waited and not ended.
    notifiers: int = 0
    #: Side streams in the process, across drivers.
    side_streams: int = 0
    #: Events in the event pool, across drivers and devices.
    pooled_events: int = 0
    #: Running watchdog threads (one per device that coroutines are or were lately parked on).
    watchdog_threads: int = 0
    #: Devices (per driver) seen in a sticky error in this process; each is logged once.
    faults_seen: int = 0
    #: Streams and semaphores collected without ``close()`` or ``aclose()`` in this process,
    #: counted and logged when their release runs, at the library's next use.
    leaked: int = 0


def statistics() -> Statistics:
    """The notifier's counters now: those of the running event loop's notifier (zeros without
    one) and the process-wide ones. Callable from any thread, inside a loop or not."""
    process = {
        "notifiers": len(_live_notifiers),
        "side_streams": side_streams.total(),
        "pooled_events": event_pool.total(),
        "watchdog_threads": _watchdog.threads(),
        "faults_seen": _log.faults_seen(),
        "leaked": _log.leaks(),
    }
    n = running_notifier()
    if n is None:
        return Statistics(**process)
    return Statistics(**n.statistics(), **process)
