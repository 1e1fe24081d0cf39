"""The wait strategy's settings: :class:`Tuning` and :func:`configure`.

The settings in force are the module attribute ``current``, which :func:`configure` replaces
with a new frozen :class:`Tuning`. Read them as ``_tuning.current`` at the time of use: a name
bound to the object (``from ._tuning import current``) would keep the settings of the moment it
was imported. The spin limit is also handed to the C wait history (``_hotpath.History``),
which reads it on every await: :func:`configure` does both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from .. import _hotpath

__all__ = ("Tuning", "configure")


@dataclass(frozen=True, slots=True)
class Tuning:
    """Knobs of the wait strategy. Change them with :func:`aiocudasem.configure`."""

    #: Longest a coroutine spins (queries between checkpoints) before parking, in seconds.
    #: Streams whose recent waits took longer than this spin on one wait in 16 only (to notice
    #: when they become short again). 0 disables spinning. On asyncio's own loops (not uvloop)
    #: a spinning ``wait_complete()`` queries without yielding while the loop has nothing else
    #: ready, for up to 20 us at a time (``_hotpath.IDLE_SPIN``).
    spin_limit: float = 250e-6
    #: At most this many coroutines per event loop spin at once; the rest park at once.
    max_spinners: int = 8
    #: Whether a parked wait of steady work (a stream whose long waits take about the same
    #: time) wakes just before the predicted end and spins over it, for at most ``spin_limit``,
    #: rather than waiting for the parked wake-up. Needs a timer fd (Linux) and an asyncio or
    #: trio loop; off with spinning (``spin_limit=0``).
    wake_ahead: bool = True
    #: The fault watchdog's pace on a busy device, in seconds. Its thread sleeps in the driver
    #: behind parked work (a fault wakes it at once; a parked device costs nothing); when that
    #: work completes it moves behind other parked work at most once per period, or asks the
    #: driver once per period if it finds none. It never wakes an event loop but for a fault.
    watchdog: float = 0.08
    #: How an armed point's completion reaches the event loop: ``"side_stream"``, the host
    #: function runs on a side stream that waits for the point's event, so the work stream never
    #: waits for it; or ``"work_stream"``, on the work stream itself, which stalls it (about
    #: 41 us per await on an H200): the rejected design, kept to measure the difference.
    wake: str = "side_stream"


current = Tuning()
_hotpath.set_spin_limit(current.spin_limit)

_SPIN_LIMIT_MAX: Final = 60.0
_SPINNERS_MAX: Final = 1 << 16
_WATCHDOG_RANGE: Final = (0.001, 60.0)
_WAKE_CHOICES: Final = ("side_stream", "work_stream")  # see _wake.STRATEGIES


def _seconds(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise ValueError(f"{name} must be in [{low:g}, {high:g}] seconds, got {value!r}")
    return seconds


def configure(
    *,
    spin_limit: float | None = None,
    max_spinners: int | None = None,
    wake_ahead: bool | None = None,
    watchdog: float | None = None,
    wake: str | None = None,
) -> Tuning:
    """Change the wait strategy for the whole process and return the new settings.

    Unset arguments keep their value. ``spin_limit`` is in [0, 60] seconds, ``max_spinners`` an
    int in [0, 65536], ``wake_ahead`` a bool, ``watchdog`` in [0.001, 60] seconds and ``wake``
    ``"side_stream"`` or ``"work_stream"``. Raises ``TypeError`` for a value of the wrong type
    (a bool included, but for ``wake_ahead``) and ``ValueError`` for one out of range.
    """
    global current
    new = current
    if spin_limit is not None:
        new = replace(new, spin_limit=_seconds("spin_limit", spin_limit, 0.0, _SPIN_LIMIT_MAX))
    if max_spinners is not None:
        if isinstance(max_spinners, bool) or not isinstance(max_spinners, int):
            raise TypeError(f"max_spinners must be an int, not {type(max_spinners).__name__}")
        if not 0 <= max_spinners <= _SPINNERS_MAX:
            raise ValueError(f"max_spinners must be in [0, {_SPINNERS_MAX}], got {max_spinners}")
        new = replace(new, max_spinners=max_spinners)
    if wake_ahead is not None:
        if not isinstance(wake_ahead, bool):
            raise TypeError(f"wake_ahead must be a bool, not {type(wake_ahead).__name__}")
        new = replace(new, wake_ahead=wake_ahead)
    if watchdog is not None:
        new = replace(new, watchdog=_seconds("watchdog", watchdog, *_WATCHDOG_RANGE))
    if wake is not None:
        if not isinstance(wake, str):
            raise TypeError(f"wake must be a str, not {type(wake).__name__}")
        if wake not in _WAKE_CHOICES:
            choices = " or ".join(map(repr, _WAKE_CHOICES))
            raise ValueError(f"wake must be {choices}, got {wake!r}")
        new = replace(new, wake=wake)
    _hotpath.set_spin_limit(new.spin_limit)
    current = new
    return new
