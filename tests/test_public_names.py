"""Each public name has one home: the public module that exports it, which is also the module
that tracebacks, ``repr()`` and pickle show for its classes and functions."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from types import ModuleType

import pytest

import aiocudasem
import aiocudasem.lowlevel
import aiocudasem.testing
import aiocudasem.vulkan

PUBLIC: list[ModuleType] = [
    aiocudasem,
    aiocudasem.lowlevel,
    aiocudasem.testing,
    aiocudasem.vulkan,
]


def _defined(obj: object) -> bool:
    """A class or a Python function: what carries a ``__module__`` of its own."""
    return inspect.isclass(obj) or inspect.isfunction(obj)


@pytest.mark.parametrize("module", PUBLIC, ids=[m.__name__ for m in PUBLIC])
def test_every_public_class_and_function_names_its_public_module(module: ModuleType) -> None:
    wrong = {
        name: obj.__module__
        for name in module.__all__
        if _defined(obj := getattr(module, name)) and obj.__module__ != module.__name__
    }
    assert not wrong, f"{module.__name__}: __module__ of {wrong}"
    # Found again by that module and name, as pickle finds it.
    for name in module.__all__:
        obj = getattr(module, name)
        if _defined(obj):
            assert getattr(sys.modules[obj.__module__], obj.__qualname__) is obj, name


def test_no_name_is_exported_by_two_public_modules() -> None:
    homes: dict[str, list[str]] = {}
    objects: dict[int, list[str]] = {}
    for module in PUBLIC:
        for name in module.__all__:
            homes.setdefault(name, []).append(module.__name__)
            obj = getattr(module, name)
            if _defined(obj):
                objects.setdefault(id(obj), []).append(f"{module.__name__}.{name}")
    assert not {n: m for n, m in homes.items() if len(m) > 1}
    assert not [paths for paths in objects.values() if len(paths) > 1]


def test_the_names_that_left_lowlevel_are_at_the_top_level_only() -> None:
    for name in ("Driver", "get_driver", "DRIVER_ENV", "Tuning", "configure"):
        assert name in aiocudasem.__all__
        assert not hasattr(aiocudasem.lowlevel, name), name
    for name in ("VulkanError", "VulkanUnavailableError", "DeviceMismatchError"):
        assert name in aiocudasem.__all__
        assert not hasattr(aiocudasem.vulkan, name), name


def test_errors_show_the_top_level_and_pickle_by_it() -> None:
    err = aiocudasem.DriverUnavailableError("no driver here")
    assert repr(type(err)) == "<class 'aiocudasem.DriverUnavailableError'>"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is aiocudasem.DriverUnavailableError
    assert str(back) == "no driver here"


def test_a_traceback_names_the_public_module() -> None:
    code = "import aiocudasem; raise aiocudasem.DriverUnavailableError('gone')"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.rstrip().endswith("aiocudasem.DriverUnavailableError: gone"), proc.stderr


def test_reprs_and_pickles_of_public_values() -> None:
    tuning = aiocudasem.Tuning()
    assert repr(tuning).startswith("Tuning(")
    assert pickle.loads(pickle.dumps(tuning)) == tuning
    assert pickle.loads(pickle.dumps(aiocudasem.HandleType.OPAQUE_FD)) is (
        aiocudasem.HandleType.OPAQUE_FD
    )
    assert pickle.loads(pickle.dumps(aiocudasem.open_stream)) is aiocudasem.open_stream
    assert repr(aiocudasem.lowlevel.Statistics).startswith("<class 'aiocudasem.lowlevel.")
