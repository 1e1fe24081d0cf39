"""The public surface: its names are re-exports, and importing it loads no CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiocudasem


def test_all_names_exist_and_are_reexports() -> None:
    public = {n for n in dir(aiocudasem) if not n.startswith("_")}
    assert set(aiocudasem.__all__) <= public
    for name in aiocudasem.__all__:
        obj = getattr(aiocudasem, name)
        mod = getattr(obj, "__module__", "aiocudasem")
        assert mod.startswith("aiocudasem"), name


def test_import_loads_no_cuda_and_no_vulkan() -> None:
    code = (
        "import sys, aiocudasem, aiocudasem.testing, aiocudasem.vulkan;"
        "bad = [m for m in sys.modules if m.startswith('cuda')];"
        "assert not bad, bad;"
        "import ctypes.util;"
        "maps = open('/proc/self/maps').read();"
        "assert 'libvulkan' not in maps and 'libcuda' not in maps"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_stub_and_marker_ship() -> None:
    root = Path(aiocudasem.__file__).parent
    assert (root / "py.typed").is_file()
    assert (root / "_notify.pyi").is_file()
