"""The simulated device: the driver Protocol in pure Python plus threads.

It follows CUDA's semantics closely enough to test the library and users' pipelines without a
GPU:

- each stream is a FIFO; its kernels and host functions run on its own worker thread, which
  ends when it has had none to run for a while, and its waits, signals, records and memory writes
  complete under the simulator's lock as soon as they can, from whichever thread made that
  possible (so a blocked stream costs no thread, and a change wakes only what waits on it); an
  event captures "everything enqueued so far" on its stream;
- a timeline semaphore wait completes when the value is >= N; a binary (opaque) wait consumes one
  signal;
- host functions are real C function pointers, called through ctypes from the worker thread, the
  way the driver calls them, so the real C notifier runs in CI;
- faults can be injected: a sticky context error (every later call fails, pending work and host
  functions are dropped, as after a trapped kernel) and a semaphore whose producer is stuck.

One module per concern: ``_core`` (the state and the thread model; its docstring says how the
classes chain), ``_devices``, ``_graphs``, ``_streams``, ``_semaphores``, ``_memory``, ``_ipc``;
the objects they work on in ``_model``, ``_steps`` and ``_page``; ``_producer``'s
``SimProducer``; statuses in ``_status``.
"""

from __future__ import annotations

from .._protocol import track
from ._ipc import _Ipc
from ._producer import SimProducer

__all__ = ("SimDriver", "SimProducer")


class SimDriver(_Ipc):
    """A simulated CUDA device. ``devices`` is the number of simulated GPUs (an int >= 1);
    ``name`` is the driver's name in messages. Raises ``TypeError`` for a value of the wrong
    type and ``ValueError`` for ``devices`` < 1.

    Prefer a fresh one per test to the process-wide ``get_driver("sim")``: an injected fault
    is sticky for the life of the driver, so a shared one faulted by one test fails the
    next.

    ``stream_mem_ops=False`` models a device without 64-bit stream memory operations: host
    timelines are refused on it, as the real driver refuses them on such a GPU.

    ``queue_depth`` (an attribute, 4,096 by default) is how many operations a stream holds:
    an enqueue past that blocks the calling thread until the stream drains one or its device
    faults, as a GPU's full queue of commands does. A test may lower it."""

    simulated = True

    def __init__(self, devices: int = 2, name: str = "sim", *, stream_mem_ops: bool = True) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int):
            raise TypeError(f"devices must be an int >= 1, not {type(devices).__name__}")
        if devices < 1:
            raise ValueError(f"devices must be an int >= 1, not {devices}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        if not isinstance(stream_mem_ops, bool):
            raise TypeError(f"stream_mem_ops must be a bool, not {type(stream_mem_ops).__name__}")
        super().__init__(devices, name, stream_mem_ops)
        track(self)

    def __repr__(self) -> str:
        return f"<SimDriver {self.name!r} devices={self._devices} at {id(self):#x}>"
