"""The host side of a simulated external semaphore."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._status import _uint

if TYPE_CHECKING:
    from ._model import _Semaphore
    from ._semaphores import _Semaphores


class SimProducer:
    """The host side of a simulated external semaphore: what a Vulkan renderer, a decoder or a
    peer process would do with its end. Thread-safe."""

    def __init__(self, driver: _Semaphores, sem: _Semaphore) -> None:
        self._driver = driver
        self._sem = sem

    @property
    def is_timeline(self) -> bool:
        """True for a timeline semaphore, False for a binary one."""
        return not self._sem.binary

    @property
    def value(self) -> int:
        """The timeline value, or 1 if a binary semaphore is signalled and 0 if not."""
        with self._driver._lock:
            return self._sem.value

    def export_fd(self) -> int:
        """A new fd for this semaphore; ``import_semaphore`` takes ownership of it."""
        return self._driver._export(self._sem)

    def signal(self, value: int | None = None) -> None:
        """Signal from the host: set a timeline to ``value`` or signal a binary semaphore
        (``value`` must then be ``None``). Never blocks. Raises ``TypeError`` for a timeline
        value that is not an int (``None`` included) and ``ValueError`` for one outside
        [0, 2**64) or for a value given to a binary semaphore."""
        sem = self._sem
        new = self._target(
            value,
            binary="a binary semaphore is signalled without a value: signal()",
            timeline="a timeline semaphore is signalled with a value: signal(n)",
        )
        drv = self._driver
        with drv._lock:
            if not sem.stuck:
                sem.value = new
                drv._settle([sem])

    def block_until(self, value: int | None = None, timeout: float | None = None) -> bool:
        """Block until a timeline reaches ``value`` (or a binary one is signalled, consuming
        the signal). Returns False after ``timeout`` seconds. Raises ``TypeError`` and
        ``ValueError`` for a ``value`` as :meth:`signal` does, and for a ``timeout`` that is not
        a number of seconds (or is NaN)."""
        sem = self._sem
        target = self._target(
            value,
            binary="a binary semaphore is waited for without a value",
            timeline="a timeline wait needs a value: block_until(n)",
        )
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(
                    f"timeout must be a number of seconds, not {type(timeout).__name__}"
                )
            if timeout != timeout:  # NaN
                raise ValueError("timeout must be a number of seconds, not NaN")
        with self._driver._lock:
            if not self._driver._sleep(lambda: sem.value >= target, sem, None, timeout):
                return False
            if sem.binary:
                sem.value = 0
            return True

    def _target(self, value: object, *, binary: str, timeline: str) -> int:
        """The value a host signal sets or a host wait waits for: 1 for a binary semaphore,
        which takes no ``value`` (``ValueError`` with ``binary``), else ``value`` as a uint64
        (``TypeError`` with ``timeline`` when it is missing)."""
        if self._sem.binary:
            if value is not None:
                raise ValueError(binary)
            return 1
        if value is None:
            raise TypeError(timeline)
        return _uint("a timeline value", value)

    def set_stuck(self, stuck: bool = True) -> None:
        """Model a producer that died: while stuck, no signal (host or GPU) changes the value."""
        with self._driver._lock:
            self._sem.stuck = stuck
