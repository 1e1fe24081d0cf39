"""The simulated device: ``SimDriver`` and ``SimProducer`` (``_core``)."""

from __future__ import annotations

from ._core import SimDriver, SimProducer

__all__ = ("SimDriver", "SimProducer")
