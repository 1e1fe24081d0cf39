"""Releasing a driver object from ``aclose()`` or from its ``weakref.finalize`` safety net."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from ._errors import AiocudasemError, DeviceFaultError


def release(destroy: Callable[[], None], what: str, collected: bool) -> None:
    """Run ``destroy``. After a device fault the context already took the object, so that
    is not an error. From a finalizer (``collected``), other failures become warnings, and a
    ``ResourceWarning`` follows the release, so that warnings-as-errors cannot skip it."""
    try:
        destroy()
    except DeviceFaultError:
        pass
    except AiocudasemError as exc:
        if not collected:
            raise
        warnings.warn(f"destroying {what} failed: {exc}", RuntimeWarning, stacklevel=2)
    if collected:
        warnings.warn(
            f"{what} was collected without aclose(); it was destroyed now",
            ResourceWarning,
            stacklevel=2,
        )
