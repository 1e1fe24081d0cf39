"""A snapshot of the notifier's counters: :func:`statistics`, for tests, benchmarks and
diagnostics. Reading them creates no notifier and starts no thread."""

from __future__ import annotations

from dataclasses import dataclass

from .. import _log
from ._loop import _live_notifiers, running_notifier
from ._pools import event_pool, side_streams
from ._watchdog import _watchdog

__all__ = ("Statistics", "statistics")


@dataclass(frozen=True, slots=True)
class Statistics:
    """The notifier's counters at one moment, from :func:`statistics`.

    The first eleven describe the notifier of the event loop that :func:`statistics` was
    called in; they are all zero outside a running loop and in a loop that has no open notifier
    (none of its waits has needed one yet, or it is shutting down). The last six are
    process-wide.
    """

    #: Host functions armed in this loop that have not returned yet, abandoned waits included
    #: (a host function behind work that never completes stays pending).
    pending: int = 0
    #: Host functions that have run for this loop.
    fired: int = 0
    #: Writes to this loop's fd by host functions: a burst of completions costs one.
    wakeups: int = 0
    #: Points with a host function outstanding (at most one per work stream).
    armed: int = 0
    #: Parked points, grouped per work stream into chains, armed ones included.
    chained: int = 0
    #: Coroutines asleep on a point (the drainer included).
    parked: int = 0
    #: Coroutines spinning: querying their point between checkpoints.
    spinning: int = 0
    #: Devices (per driver) that coroutines of this loop are parked on, which the watchdog
    #: watches for this loop.
    watched: int = 0
    #: Times this loop's drainer woke from its fd.
    drainer_wakeups: int = 0
    #: Waits of this loop that saw their work complete, an await of an idle stream included (a
    #: point awaited by several coroutines counts once).
    completed: int = 0
    #: Points of this loop that a device fault ended with :class:`DeviceFaultError`.
    faulted: int = 0
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
    c = n._c.stats()
    return Statistics(
        pending=c["pending"],
        fired=c["fired"],
        wakeups=c["wakeups"],
        armed=len(n._armed),
        chained=sum(len(chain) for chain in n._chains.values()),
        parked=n._asleep,
        spinning=n._spinners,
        watched=len(n._watched),
        drainer_wakeups=n._wakeups,
        completed=n._completed,
        faulted=n._faulted,
        **process,
    )
