"""``python -m aiocudasem doctor``: what this machine offers."""

from __future__ import annotations

import importlib.metadata
import runpy
import sys
from pathlib import Path

from ._driver import DRIVER_ENV, get_driver
from ._errors import AiocudasemError


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    print(f"python {sys.version.split()[0]} on {sys.platform}")
    for dist in ("aiocudasem", "cuda-bindings", "anyio", "numpy", "trio", "uvloop"):
        print(f"{dist:>14}: {_version(dist)}")
    from . import _notify

    print(f"{'notifier':>14}: C extension loaded, host function at {_notify.HOST_FN:#x}")
    uuid = None
    try:
        drv = get_driver("cuda")
        for i in range(drv.device_count()):
            u = drv.device_uuid(i)
            uuid = uuid or u
            print(f"{'cuda':>14}: device {i}: {drv.device_name(i)} (UUID {u.hex()})")
    except AiocudasemError as exc:
        print(f"{'cuda':>14}: unavailable: {exc}")
    try:
        from .vulkan import VulkanDevice

        with VulkanDevice.open(uuid=uuid) as vk:
            print(f"{'vulkan':>14}: {vk.name} (UUID {vk.uuid.hex()})")
    except AiocudasemError as exc:
        print(f"{'vulkan':>14}: unavailable: {exc}")
    print(f"{'default':>14}: ${DRIVER_ENV} or 'cuda'; the simulated device is driver='sim'")
    return 0


def run_benchmarks(args: list[str]) -> int:
    """Run ``benchmarks/run.py`` of a source checkout."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
    if not script.is_file():
        print("the benchmarks live in the source checkout's benchmarks/ folder", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0
