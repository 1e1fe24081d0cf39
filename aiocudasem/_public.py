"""The public home of each public class and function, as tracebacks, ``repr()`` and pickle show it.

Each public module (``aiocudasem``, ``aiocudasem.lowlevel``, ``aiocudasem.testing``,
``aiocudasem.vulkan``) calls :func:`publish` at its end, so that ``CudaError`` reads
``aiocudasem.CudaError`` rather than the private module that defines it, wherever it is shown.
Pickle finds a class or function by its module and name, so every name published here must be
importable from its public module, which ``__all__`` guarantees. ``tests/test_public_names.py``
checks the result.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping


def publish(module: str, namespace: Mapping[str, object], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` on each class and Python function among ``names``."""
    for name in names:
        obj = namespace[name]
        if isinstance(obj, type | types.FunctionType):
            obj.__module__ = module
