"""Waking ahead (``_notifier/_ahead.py``): the timer fd, the prediction, and parked waits of
steady work that wake before the predicted end, on every loop, on the simulated device.

The simulated device cannot show the latency gained (its kernels end on a thread that needs the
GIL); these tests check what happens, not how fast: the GPU suite and the benchmark's curve
measure that."""

from __future__ import annotations

import math
import select
import time
from collections.abc import Iterator

import anyio
import pytest

import aiocudasem as acs
from aiocudasem import _hotpath, _notify
from aiocudasem._notifier import _ahead
from aiocudasem._notifier._current import current_notifier
from aiocudasem.lowlevel import statistics
from aiocudasem.testing import SimDriver, workloads
from tests.conftest import open_fds

pytestmark = pytest.mark.anyio

MS = 1_000_000  # ns


@pytest.fixture(autouse=True)
def _defaults() -> Iterator[None]:
    yield
    d = acs.Tuning()
    acs.configure(spin_limit=d.spin_limit, wake_ahead=d.wake_ahead)


# ---------------------------------------------------------------- the timer fd


def _readable(fd: int, timeout: float) -> bool:
    ep = select.epoll()
    try:
        ep.register(fd, select.EPOLLIN)
        return bool(ep.poll(timeout))
    finally:
        ep.close()


def test_alarm_fires_after_its_delay_and_clears() -> None:
    alarm = _notify.Alarm()
    try:
        assert not _readable(alarm.fileno(), 0)
        t0 = time.perf_counter()
        alarm.set(0.02)
        assert _readable(alarm.fileno(), 2.0)
        assert time.perf_counter() - t0 >= 0.0199
        assert alarm.clear() is True
        assert not _readable(alarm.fileno(), 0)
        assert alarm.clear() is False  # nothing to consume
    finally:
        alarm.close()


def test_alarm_set_none_disarms_and_past_delays_fire_at_once() -> None:
    alarm = _notify.Alarm()
    try:
        alarm.set(0.05)
        alarm.set(None)
        assert not _readable(alarm.fileno(), 0.1)
        alarm.set(-1.0)  # in the past: at once
        assert _readable(alarm.fileno(), 1.0)
        alarm.clear()
        alarm.set(0.0)
        assert _readable(alarm.fileno(), 1.0)
    finally:
        alarm.close()


def test_alarm_bad_input_and_closed() -> None:
    alarm = _notify.Alarm()
    with pytest.raises(TypeError):
        alarm.set("soon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        alarm.set(math.nan)
    with pytest.raises(TypeError):
        _notify.Alarm(1)  # type: ignore[call-arg]
    fd = alarm.fileno()
    alarm.close()
    alarm.close()  # idempotent
    assert alarm.closed
    assert fd not in open_fds()
    for call in (lambda: alarm.set(0.1), alarm.clear, alarm.fileno):
        with pytest.raises(ValueError, match="closed"):
            call()


# ---------------------------------------------------------------- the prediction


class _Adapter:
    """An adapter with an fd watcher that is never started (the plan only asks for one)."""

    def fd_watcher(self, fd: int, on_readable: object) -> object:
        return self

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _alarms() -> _ahead.Alarms:
    return _ahead.Alarms(_Adapter())  # type: ignore[arg-type]


def test_no_plan_without_a_prediction_or_with_spinning_or_waking_ahead_off() -> None:
    alarms, h = _alarms(), _hotpath.History()
    assert h.expect < 0 and h.jitter == 0 and h.lead == 0 and h.spun == 0
    assert _ahead.plan(alarms, h, 0.0) is None  # nothing learnt yet
    _ahead.learn_parked(h, 0.005)
    assert h.expect == pytest.approx(0.005)
    wake_at, spin_until, spin_max = _ahead.plan(alarms, h, 10.0)  # type: ignore[misc]
    assert h.lead == alarms.first_lead() >= _ahead.LEAD_MIN  # the first lead: the loop's
    assert wake_at == pytest.approx(10.005 - h.lead)
    assert spin_until == pytest.approx(10.005 + _ahead.LEAD_MIN)
    assert spin_max == acs.Tuning().spin_limit
    acs.configure(wake_ahead=False)
    assert _ahead.plan(alarms, h, 10.0) is None
    acs.configure(wake_ahead=True, spin_limit=0)
    assert _ahead.plan(alarms, h, 10.0) is None
    acs.configure(spin_limit=250e-6)
    alarms.close()
    assert _ahead.plan(alarms, h, 10.0) is None  # a closed loop's alarms


def test_no_plan_while_the_spins_are_long_until_they_fade() -> None:
    alarms, h = _alarms(), _hotpath.History()
    _ahead.learn_parked(h, 0.001)
    assert _ahead.plan(alarms, h, 0.0) is not None
    h.spun = 0.0006  # more than half the wait
    assert _ahead.plan(alarms, h, 0.0) is None
    _ahead.learn_parked(h, 0.100)  # a long wait: within the share, past the spin limit
    assert h.spun > acs.Tuning().spin_limit
    assert _ahead.plan(alarms, h, 0.0) is None
    for _ in range(12):  # parked waits let the spins remembered fade
        _ahead.learn_parked(h, 0.100)
    assert _ahead.plan(alarms, h, 0.0) is not None
    h.lead = 0.06  # a lead of more than half the wait
    assert _ahead.plan(alarms, h, 0.0) is None


def test_learning_converges_and_steers_the_lead() -> None:
    h = _hotpath.History()
    _ahead.learn_parked(h, 0.0030)  # the first: an upper bound, taken as it is
    h.lead = 400e-6
    late = 30e-6  # the alarm rings this late; the work takes 2 ms exactly
    for _ in range(60):
        _ahead.learn_caught(h, 0.0020, max(0.0, h.lead - late))
    assert h.expect == pytest.approx(0.0020, rel=1e-3)
    assert h.jitter < 1e-6
    # The lead settles where the spin is the margin past the predicted end.
    assert h.lead == pytest.approx(late + _ahead.LEAD_MIN, abs=2e-6)
    assert h.spun == pytest.approx(_ahead.LEAD_MIN, abs=2e-6)
    # The work was done at the alarm: the lead grows, the prediction comes down to the bound.
    lead = h.lead
    _ahead.learn_early(h, 0.0019)
    assert h.lead == pytest.approx(lead * _ahead.LEAD_GROWTH + _ahead.LEAD_MIN)
    assert h.expect < 0.0020
    before = h.expect
    # The spin ran out with the work still running: move towards the bound.
    _ahead.learn_late(h, 0.0030, 200e-6)
    assert h.expect > before
    assert h.jitter > 1e-5
    h.jitter, lead = 1e-3, h.lead
    _ahead.learn_parked(h, 0.0020)
    assert h.jitter == pytest.approx(1e-3 * _ahead.FADE)
    assert h.lead == pytest.approx(lead * _ahead.FADE)


def test_a_stream_whose_work_grew_learns_it_within_a_few_waits() -> None:
    """A stream that predicted 3 ms and now runs 10 ms: each wait's alarm comes early, its
    spin runs out, and it parks again; what the parked end shows moves the prediction most of
    the way within a dozen waits (a spin window per wait would take hundreds)."""
    h = _hotpath.History()
    _ahead.learn_parked(h, 0.0030)
    h.lead = 50e-6
    waits = 0
    while h.expect < 0.0099 and waits < 100:
        spin_until = h.expect + 2 * h.jitter + _ahead.LEAD_MIN
        _ahead.learn_late(h, spin_until, spin_until - (h.expect - h.lead))
        _ahead.learn_overran(h, 0.0102)  # the parked wake-up ended it 200 us late
        waits += 1
    assert waits <= 16
    _ahead.learn_overran(h, 0.0)  # an end before the prediction teaches nothing here
    assert h.expect >= 0.0099


def test_config_rejects_a_non_bool() -> None:
    with pytest.raises(TypeError, match="wake_ahead must be a bool"):
        acs.configure(wake_ahead=1)  # type: ignore[arg-type]
    assert acs.configure().wake_ahead is True


# ---------------------------------------------------------------- on a loop


async def _steady(sim: SimDriver, stream: acs.Stream, ns: int, n: int) -> None:
    work = workloads(sim)
    for _ in range(n):
        work.launch_spin(stream, ns)
        await stream.wait_complete()


# The simulated device's kernels end late by a varying amount (their thread needs the GIL),
# which with the default spin limit keeps many of its waits from waking ahead; a GPU's do not.
# These tests let the waits spin longer, to see them wake ahead every time.
NOISY_SPIN_LIMIT = 0.002


async def test_steady_long_waits_wake_ahead(sim: SimDriver) -> None:
    acs.configure(spin_limit=NOISY_SPIN_LIMIT)
    async with acs.open_stream(driver=sim) as stream:
        await _steady(sim, stream, 5 * MS, 16)
        notifier = current_notifier()
        assert notifier._alarms.fired >= 3  # of 16; fewer on a loaded machine
        assert 0.004 < stream._history.expect < 0.010
        s = statistics()  # how the waits that woke ahead ended, one count each
        assert s.ahead_caught + s.ahead_early + s.ahead_late >= 3
        assert s.ahead_caught >= 1
        assert notifier.statistics()["spinning"] == 0
        assert not notifier._alarms._heap  # nothing left set


async def test_no_alarm_when_waking_ahead_is_off(sim: SimDriver) -> None:
    acs.configure(wake_ahead=False)
    async with acs.open_stream(driver=sim) as stream:
        await _steady(sim, stream, 3 * MS, 8)
        assert current_notifier()._alarms.fired == 0
        assert current_notifier()._alarms._alarm is None  # no timer fd made


async def test_work_that_ends_early_wakes_the_wait_as_a_parked_one(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        stream._history.expect, stream._history.jitter = 5.0, 0.0
        workloads(sim).launch_spin(stream, 20 * MS)
        t0 = time.perf_counter()
        with anyio.fail_after(3):  # not the 5 s predicted
            await stream.wait_complete()
        assert time.perf_counter() - t0 < 3
        notifier = current_notifier()
        assert notifier._alarms.fired == 0
        assert (statistics().ahead_early, statistics().ahead_late) == (1, 0)
        assert not notifier._alarms._heap  # its alarm was taken back
        assert stream._history.expect < 5.0  # learnt: aim earlier


async def test_work_that_runs_long_parks_again_after_the_spin(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        stream._history.expect, stream._history.jitter = 0.02, 0.0
        workloads(sim).launch_spin(stream, 300 * MS)
        t0 = time.perf_counter()
        with anyio.fail_after(10):
            await stream.wait_complete()
        assert time.perf_counter() - t0 >= 0.29
        notifier = current_notifier()
        assert notifier._alarms.fired == 1
        assert (statistics().ahead_caught, statistics().ahead_late) == (0, 1)
        # Learnt by how much it ran past, not only that it did (the spin's 2 ms window).
        assert stream._history.expect > 0.02 + 0.2 * (0.29 - 0.02)
        assert notifier.statistics()["spinning"] == 0


async def test_cancelled_while_dozing(sim: SimDriver) -> None:
    async with acs.open_stream(driver=sim) as stream:
        stream._history.expect, stream._history.jitter = 0.2, 0.0
        workloads(sim).launch_spin(stream, 400 * MS)
        with anyio.move_on_after(0.05) as scope:
            await stream.wait_complete()
        assert scope.cancelled_caught
        notifier = current_notifier()
        assert not notifier._alarms._heap
        await anyio.sleep(0.25)  # past the alarm it had: nothing wakes, nothing fails
        assert notifier._alarms.fired == 0
        assert notifier.statistics()["parked"] == 0
        with anyio.fail_after(5):
            await stream.wait_complete()  # the work completes for the next wait


async def test_several_streams_wake_ahead_each_in_turn(sim: SimDriver) -> None:
    acs.configure(spin_limit=NOISY_SPIN_LIMIT)
    async with (
        acs.open_stream(driver=sim) as a,
        acs.open_stream(driver=sim) as b,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(_steady, sim, a, 5 * MS, 16)
        tg.start_soon(_steady, sim, b, 9 * MS, 10)
    notifier = current_notifier()
    assert notifier._alarms.fired >= 3
    assert a._history.expect < b._history.expect
    assert not notifier._alarms._heap


def test_the_timer_fd_goes_with_the_loop(sim: SimDriver, anyio_backend: object) -> None:
    backend, options = anyio_backend  # type: ignore[misc]
    before = open_fds()

    async def main() -> None:
        async with acs.open_stream(driver=sim) as stream:
            await _steady(sim, stream, 2 * MS, 8)
            assert current_notifier()._alarms._alarm is not None

    anyio.run(main, backend=backend, backend_options=options)
    assert open_fds() - before == set()
