"""Waking ahead: a parked wait of steady work wakes just before the work's predicted end and
spins over it, so that a wait longer than the spin limit costs a short spin rather than a
parked wake-up (two sleeping threads woken by the operating system, which costs tens to
hundreds of microseconds).

The prediction is per stream, in its history (``History.expect`` and ``History.jitter``): the
duration of its long waits, from the wait's start to the end of the work, and the mean error of
that prediction. A parked wait of a stream whose prediction is steady sets an alarm for
``started + expect - lead``, where the lead covers the alarm's own lateness on this loop
(learnt too) and twice the prediction's error. Its host function is armed as always, so a
prediction that is wrong costs nothing but the spin: work that ends early wakes the wait as a
parked one, and work that runs past the spin parks it again.

What each way out teaches the prediction:

=====================================  ===============================================
the spin sees the work end             its duration, to within a query (exact)
the first query after the alarm finds  it ended before the alarm: aim one lead earlier
it done, or its host function woke
the wait before the alarm
the spin runs out (``spin_until``)     it ends later than that: aim there
a parked wait without an alarm         the duration plus the wake-up (an upper bound),
                                       which the next alarm corrects; the error fades
=====================================  ===============================================

The alarm is a timer fd (``_notify.Alarm``), watched by the loop like the notifier's own fd:
a loop's timers round their timeout up to the millisecond (``epoll_wait`` takes
milliseconds), which would cost a spin of up to a millisecond per wait. Where there is no timer
fd (not Linux) or no fd watcher (the generic adapter), no wait wakes ahead.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import TYPE_CHECKING, Final

from .. import _notify
from . import _tuning

if TYPE_CHECKING:
    from ._loops import FdWatcher, LoopAdapter, Sleeper
    from ._points import History

__all__ = ("Alarms", "Doze", "learn_caught", "learn_early", "learn_late", "learn_parked", "plan")

#: The alarm's lateness assumed before any was measured, in seconds.
LATE_DEFAULT: Final = 50e-6
#: The least lead, in seconds: the spin starts at least this long before the predicted end.
LEAD_MIN: Final = 10e-6
#: A prediction is steady enough to wake ahead on when the spin it expects is at most this
#: share of the wait (and within the spin limit).
SPIN_SHARE: Final = 0.5
#: The weight of each new observation in the moving averages.
WEIGHT: Final = 0.25
#: What a parked wait without an alarm leaves of the prediction's error.
JITTER_FADE: Final = 0.8


class Doze:
    """One parked wait's alarm: due at ``when`` (a ``time.perf_counter()``). ``due`` turns
    true when it fires; the parking layer then wakes the wait's coroutine (``wake``)."""

    __slots__ = ("due", "fired_at", "wake", "when")

    def __init__(self, when: float) -> None:
        self.when = when
        self.due = False
        self.fired_at = 0.0
        self.wake: Sleeper | None = None  # the parked coroutine's sleeper, while parked


class Alarms:
    """The alarms of one loop's parked waits, on one timer fd set to the earliest of them, and
    the lateness of its wake-ups on this loop."""

    def __init__(self, adapter: LoopAdapter) -> None:
        self._adapter: LoopAdapter | None = adapter
        # The timer fd and its watcher, made when a wait first wakes ahead: a loop that never
        # does holds no fd for it.
        self._alarm: _notify.Alarm | None = None
        self._watcher: FdWatcher | None = None
        self._heap: list[tuple[float, int, Doze]] = []
        self._order = itertools.count()
        self._set_for: float | None = None  # the `when` that the timer fd is set for
        #: The alarm's lateness on this loop (a moving average and its mean deviation), from
        #: the time set to the time the loop ran the wake-up, in seconds.
        self.late = LATE_DEFAULT
        self.late_dev = 0.0
        self.fired = 0  # alarms that woke a wait
        #: Called with a doze that fired (the parking layer's wake-up); set by the notifier.
        self.on_due = _ignore

    @property
    def available(self) -> bool:
        """Whether waits may wake ahead here: the loop has an fd watcher, and no timer fd
        failed to open (not Linux); False once closed."""
        return self._adapter is not None

    def _open(self) -> bool:
        if self._alarm is not None:
            return True
        adapter = self._adapter
        if adapter is None:
            return False
        try:
            alarm = _notify.Alarm()
        except OSError:
            self._adapter = None
            return False
        watcher = adapter.fd_watcher(alarm.fileno(), self._fire)
        if watcher is None:
            alarm.close()
            self._adapter = None
            return False
        self._alarm, self._watcher = alarm, watcher
        return True

    def fileno(self) -> int | None:
        """The timer fd, once a wait has woken ahead on this loop; else None."""
        alarm = self._alarm
        return None if alarm is None or alarm.closed else alarm.fileno()

    def lead(self, history: History) -> float:
        """How long before the predicted end a wait of ``history``'s stream starts to spin."""
        return max(LEAD_MIN, self.late + 2.0 * self.late_dev + 2.0 * history.jitter)

    def add(self, doze: Doze) -> bool:
        """Set ``doze``'s alarm; False where no alarm can be set (see :attr:`available`)."""
        if not self._open():
            return False
        heap = self._heap
        heapq.heappush(heap, (doze.when, next(self._order), doze))
        if self._set_for is None or doze.when < self._set_for:
            self._arm(doze.when)
        return True

    def discard(self, doze: Doze) -> None:
        """``doze``'s wait no longer needs it (done, cancelled, or it fired)."""
        doze.wake = None
        if doze.due:
            return
        doze.due = True  # never fires now; it leaves the heap when it reaches the top
        heap = self._heap
        while heap and heap[0][2].due:
            heapq.heappop(heap)
        if not heap:
            self._disarm()
        elif heap[0][0] != self._set_for:
            self._arm(heap[0][0])

    def close(self) -> None:
        """The loop ends: stop watching and close the timer fd. Idempotent."""
        self._adapter = None
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._alarm is not None:
            self._alarm.close()
            self._alarm = None
        self._heap.clear()

    def _arm(self, when: float) -> None:
        alarm = self._alarm
        if alarm is None or alarm.closed:
            return
        alarm.set(when - time.perf_counter())
        self._set_for = when
        if self._watcher is not None:
            self._watcher.start()

    def _disarm(self) -> None:
        # The watcher keeps watching the quiet fd (which costs nothing) until close(): starting
        # it is what costs (a system task on trio).
        alarm = self._alarm
        self._set_for = None
        if alarm is not None and not alarm.closed:
            alarm.set(None)
            alarm.clear()

    def _fire(self) -> bool:
        """The timer fd is readable: wake the waits whose alarms are due. Returns whether to
        keep watching: until close()."""
        alarm = self._alarm
        if alarm is None or alarm.closed:
            return False
        alarm.clear()
        now = time.perf_counter()
        heap = self._heap
        learnt = False
        while heap and heap[0][0] <= now:
            when, _, doze = heapq.heappop(heap)
            if doze.due:
                continue
            doze.due = True
            doze.fired_at = now
            self.fired += 1
            if not learnt:  # the earliest one: how late the loop ran it
                learnt = True
                late = now - when
                self.late_dev += WEIGHT * (abs(late - self.late) - self.late_dev)
                self.late += WEIGHT * (late - self.late)
            self.on_due(doze)
        if heap:
            self._arm(heap[0][0])
        else:
            self._set_for = None
        return True


def _ignore(doze: Doze) -> None:
    pass


def plan(alarms: Alarms, history: History, started: float) -> tuple[float, float, float] | None:
    """When a parked wait of ``history``'s stream that began at ``started`` should wake ahead,
    until when it may then spin, and the lead (how long before the predicted end it wakes):
    ``(wake_at, spin_until, lead)``, or None to park only (no prediction yet, an unsteady one,
    spinning off, or no alarm on this loop)."""
    expect = history.expect
    tuning = _tuning.current
    if expect <= 0 or not tuning.wake_ahead or tuning.spin_limit <= 0 or not alarms.available:
        return None
    lead = alarms.lead(history)  # before the predicted end
    margin = 2.0 * history.jitter + LEAD_MIN  # after it
    # The spin expected once the alarm rings (it rings about `late` after it was set for):
    # within the spin limit, and a small share of the wait.
    spin = lead - alarms.late + margin
    if spin > tuning.spin_limit or spin > SPIN_SHARE * expect:
        return None
    end = started + expect
    return end - lead, end + margin, lead


def learn_caught(history: History, took: float) -> None:
    """The spin saw the work end ``took`` seconds after the wait began."""
    _learn(history, took)


def learn_early(history: History, bound: float, lead: float) -> None:
    """The first query after the alarm found the work done: it took at most ``bound``. Aim a
    lead earlier than that."""
    expect = history.expect
    _learn(history, min(expect, bound) - lead if expect > 0 else bound)


def learn_late(history: History, bound: float) -> None:
    """The spin ran out ``bound`` seconds after the wait began, the work still running."""
    _learn(history, max(history.expect, bound))


def learn_parked(history: History, took: float) -> None:
    """A parked wait without an alarm ended ``took`` seconds after it began, its wake-up
    included: an upper bound, which the alarms that follow correct downwards. Its error says
    nothing of the work's (the wake-up's own varies), so the prediction's error is left to
    fade instead: a stream found unsteady tries again after some parked waits."""
    expect = history.expect
    history.expect = took if expect <= 0 else expect + WEIGHT * (took - expect)
    history.jitter *= JITTER_FADE


def _learn(history: History, took: float) -> None:
    expect = history.expect
    if expect <= 0:
        history.expect = took
        history.jitter = 0.0
        return
    err = took - expect
    history.jitter += WEIGHT * (abs(err) - history.jitter)
    history.expect = max(expect + WEIGHT * err, 1e-6)
