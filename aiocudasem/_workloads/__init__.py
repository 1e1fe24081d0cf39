"""Workloads for the demo, the tests and the benchmarks: pinned memory and three small kernels.

They are not part of the device seam: the library itself never launches a kernel. Each driver
that can run them has an implementation here (``_cuda``: the prebuilt kernels of ``kernels/``;
``_sim``: Python callables on the simulated device), and :func:`workloads` picks it. Each
declares what it uses of its driver beside the ``Driver`` protocol (``CudaWorkloadDriver``,
``SimWorkloadDriver``) and uses nothing else. Users get them through :mod:`aiocudasem.testing`.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._driver import Driver
    from ._cuda import CudaWorkloads
    from ._sim import SimWorkloads

from ._common import SEEN, WeakDriver, Workloads, frame_word, frame_words

__all__ = ("SEEN", "WeakDriver", "Workloads", "frame_word", "frame_words", "workloads")


_lock = threading.Lock()
_made: weakref.WeakKeyDictionary[Driver, SimWorkloads | CudaWorkloads] = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    # A fork while another thread held the lock must not leave it held in the child; the
    # parent's drivers refuse every call there anyway.
    global _lock, _made
    _lock = threading.Lock()
    _made = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_after_fork_in_child)


def workloads(driver: Driver) -> Workloads:
    """The workloads of ``driver`` (one object per driver). Raises ``TypeError`` for a driver
    that has none.

    On the CUDA driver, get them before the first semaphore wait that can block a stream: their
    kernels then load before that wait is enqueued, never lazily behind it
    (docs/lazy-loading.md says why that matters).
    """
    from .._driver._cuda import CudaDriver
    from .._driver._sim import SimDriver

    if not isinstance(driver, (SimDriver, CudaDriver)):
        raise TypeError(f"{driver!r} has no workloads: they exist for the 'cuda' and 'sim' drivers")
    with _lock:
        made = _made.get(driver)
        if made is not None:
            return made
        made = _made[driver] = _new(driver)  # cheap: loads nothing
    made._attach()  # may load kernels: outside the table's lock
    return made


def _new(driver: Driver) -> SimWorkloads | CudaWorkloads:
    from .._driver._sim import SimDriver

    if isinstance(driver, SimDriver):
        from ._sim import SimWorkloads

        return SimWorkloads(driver)
    from .._driver._cuda import CudaDriver
    from ._cuda import CudaWorkloads

    assert isinstance(driver, CudaDriver)  # workloads() let no other driver through
    return CudaWorkloads(driver)
