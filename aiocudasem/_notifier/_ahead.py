"""Waking ahead: a parked wait of steady work wakes just before the work's predicted end and
spins over it, so that a wait longer than the spin limit costs a short spin rather than a
parked wake-up (two sleeping threads woken by the operating system, which costs tens to
hundreds of microseconds).

The prediction is per stream, in its history: ``expect``, the duration of its long waits from
the wait's start to the work's end, and ``jitter``, that prediction's mean error; ``lead``, how
long before the predicted end its alarm is set; ``spun``, how long its waits spin after their
alarms. A parked wait of a stream whose prediction is steady sets an alarm for
``started + expect - lead`` and spins from when it rings until the work ends, for at most
``2 x jitter + 10 us`` past the predicted end and never longer than the spin limit. Its host
function is armed as always, so a prediction that is wrong costs nothing but the spin: work that
ends early wakes the wait as a parked one, and work that runs past the spin parks it again.

The lead absorbs the alarm's lateness, which depends on the host and on how long the thread
slept (a core that idles longer sleeps deeper and wakes later), hence one per stream, steered
by what each alarm shows:

=====================================  ===============================================
the spin sees the work end             its duration, to within a query (exact); the lead
                                       shrinks towards a spin of the error margin
the first query after the alarm finds  it ended before that: the prediction comes down to
it done, or its host function woke     the time seen, and the lead grows by half
the wait before the alarm
the spin runs out                      it ends later than that: the prediction moves there
a parked wait without an alarm         the duration plus the wake-up (an upper bound),
                                       which the next alarm corrects; the error, the spins
                                       remembered and the lead fade, so a stream found
                                       unsteady tries again after a few parked waits
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

__all__ = (
    "Alarms",
    "Doze",
    "learn_caught",
    "learn_early",
    "learn_late",
    "learn_overran",
    "learn_parked",
    "plan",
)

#: The alarm's lateness assumed before any was measured, in seconds.
LATE_DEFAULT: Final = 50e-6
#: The least lead, in seconds, and the margin past the predicted end that a spin covers beyond
#: twice the prediction's error.
LEAD_MIN: Final = 10e-6
#: A stream wakes ahead while its waits spin at most this share of the wait after their alarms
#: (and within the spin limit), and its lead is at most this share of the wait.
SPIN_SHARE: Final = 0.5
#: The weight of each new observation in the moving averages.
WEIGHT: Final = 0.25
#: What a parked wait without an alarm leaves of the prediction's error, the spins and the lead.
FADE: Final = 0.8
#: How the lead grows when an alarm came too late.
LEAD_GROWTH: Final = 1.5


class Doze:
    """One parked wait's alarm: due at ``when`` (a ``time.perf_counter()``). ``due`` turns
    true when it fires; the parking layer then wakes the wait's coroutine (``wake``)."""

    __slots__ = ("due", "wake", "when")

    def __init__(self, when: float) -> None:
        self.when = when
        self.due = False
        self.wake: Sleeper | None = None  # the parked coroutine's sleeper, while parked


class Alarms:
    """The alarms of one loop's parked waits, on one timer fd set to the earliest of them, and
    the lateness of its wake-ups on this loop."""

    def __init__(self, adapter: LoopAdapter) -> None:
        self._adapter: LoopAdapter | None = adapter
        # The timer fd and its watcher, made when a wait first wakes ahead: a loop that never
        # does holds no fd for it. None again once closed (close() drops what it closes).
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
        return None if alarm is None else alarm.fileno()

    def first_lead(self) -> float:
        """The lead of a stream's first alarm: this loop's alarms' lateness so far."""
        return max(LEAD_MIN, self.late + 2.0 * self.late_dev)

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
        if alarm is None:
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
        if alarm is not None:
            alarm.set(None)
            alarm.clear()

    def _fire(self) -> bool:
        """The timer fd is readable: wake the waits whose alarms are due. Returns whether to
        keep watching: until close()."""
        alarm = self._alarm
        if alarm is None:
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
    until when it may then spin, and the most it may spin: ``(wake_at, spin_until,
    spin_max)``, or None to park only (no prediction yet, an unsteady one, spinning off, or no
    alarm on this loop)."""
    expect = history.expect
    tuning = _tuning.current
    limit = tuning.spin_limit
    if expect <= 0 or not tuning.wake_ahead or limit <= 0 or not alarms.available:
        return None
    lead = history.lead
    if lead <= 0:
        lead = history.lead = alarms.first_lead()
    if history.spun > min(limit, SPIN_SHARE * expect) or lead > SPIN_SHARE * expect:
        return None
    end = started + expect
    return end - lead, end + 2.0 * history.jitter + LEAD_MIN, limit


def learn_caught(history: History, took: float, spun: float) -> None:
    """The spin saw the work end ``took`` seconds after the wait began, having spun ``spun``
    seconds since the alarm rang: the prediction learns the duration, and the lead moves
    towards a spin of the error margin."""
    _learn(history, took)
    _learn_spin(history, spun)
    target = 2.0 * history.jitter + LEAD_MIN
    history.lead = max(LEAD_MIN, history.lead - WEIGHT * (spun - target))


def learn_early(history: History, bound: float) -> None:
    """The work was done when the wait looked, ``bound`` seconds after it began, before the
    alarm or at its first query: the alarm came too late."""
    if history.expect <= 0 or bound < history.expect:
        _learn(history, bound)
    history.lead = min(history.lead * LEAD_GROWTH + LEAD_MIN, SPIN_SHARE * history.expect)


def learn_late(history: History, bound: float, spun: float) -> None:
    """The spin ran out ``bound`` seconds after the wait began, after ``spun`` seconds, the
    work still running."""
    _learn(history, max(history.expect, bound))
    _learn_spin(history, spun)


def learn_overran(history: History, took: float) -> None:
    """After a spin that ran out (:func:`learn_late`), the wait parked again and ended
    ``took`` seconds after it began, its wake-up included. The spin only showed that the
    work ran past its window; this shows by how much, as an upper bound. Without it a stream
    whose work grew moves its prediction by little more than its spin window per wait, its
    error swelling as it goes: run through these rules, a stream that predicted 3 ms and now
    runs 10 ms took 27 waits, each a spin that runs out and a parked wake-up, and ended with
    an error of 4 ms. With it, 11 waits and 0.1 ms. The alarms that follow correct the
    wake-up's excess downwards (:func:`learn_early`)."""
    if took > history.expect:
        history.expect += WEIGHT * (took - history.expect)


def learn_parked(history: History, took: float) -> None:
    """A parked wait without an alarm ended ``took`` seconds after it began, its wake-up
    included: an upper bound, which the alarms that follow correct downwards. Its error says
    nothing of the work's (the wake-up's own varies), so the prediction's error, the spins
    remembered and the lead fade instead: a stream found unsteady tries again after some parked
    waits."""
    expect = history.expect
    history.expect = took if expect <= 0 else expect + WEIGHT * (took - expect)
    history.jitter *= FADE
    history.spun *= FADE
    history.lead *= FADE


def _learn(history: History, took: float) -> None:
    expect = history.expect
    if expect <= 0:
        history.expect = took
        history.jitter = 0.0
        return
    err = took - expect
    history.jitter += WEIGHT * (abs(err) - history.jitter)
    history.expect = max(expect + WEIGHT * err, 1e-6)


def _learn_spin(history: History, spun: float) -> None:
    history.spun += WEIGHT * (spun - history.spun)
