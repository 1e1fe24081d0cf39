"""``python -m aiocudasem doctor``: what this machine offers."""

from __future__ import annotations

import importlib.metadata
import os
import sys

from .. import AiocudasemError
from ..lowlevel import DRIVER_ENV, HOST_FUNCTION, get_driver

#: What ``doctor`` advises under lazy module loading, CUDA's default.
LAZY_LOADING_HINT = (
    "hand-offs: launch or load each kernel once before its first hand-off, or set "
    "CUDA_MODULE_LOADING=EAGER; see docs/lazy-loading.md"
)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    print(f"python {sys.version.split()[0]} on {sys.platform}")
    for dist in ("aiocudasem", "cuda-bindings", "anyio", "numpy", "trio", "uvloop"):
        print(f"{dist:>14}: {_version(dist)}")
    print(f"{'notifier':>14}: C extension loaded, host function at {HOST_FUNCTION:#x}")
    uuid = None
    drv = None
    try:
        drv = get_driver("cuda")
        for i in range(drv.device_count()):
            u = drv.device_uuid(i)
            uuid = uuid or u
            print(f"{'cuda':>14}: device {i}: {drv.device_name(i)} (UUID {u.hex()})")
    except AiocudasemError as exc:
        print(f"{'cuda':>14}: unavailable: {exc}")
    if drv is not None:
        _print_loading_mode(drv)
    try:
        from ..vulkan import VulkanDevice

        with VulkanDevice.open(uuid=uuid) as vk:
            print(f"{'vulkan':>14}: {vk.name} (UUID {vk.uuid.hex()})")
    except AiocudasemError as exc:
        print(f"{'vulkan':>14}: unavailable: {exc}")
    print(f"{'default':>14}: ${DRIVER_ENV} or 'cuda'; the simulated device is driver='sim'")
    return 0


def _print_loading_mode(drv: object) -> None:
    # Only the real driver has a loading mode; it is not part of the Driver protocol.
    query = getattr(drv, "module_loading_mode", None)
    if query is None:
        return
    try:
        mode = str(query())
    except AiocudasemError as exc:
        print(f"{'module loading':>14}: unknown: {exc}")
        return
    setting = os.environ.get("CUDA_MODULE_LOADING")
    source = f"CUDA_MODULE_LOADING={setting}" if setting else "CUDA's default"
    print(f"{'module loading':>14}: {mode} ({source})")
    if mode == "lazy":
        print(f"{'':>14}  {LAZY_LOADING_HINT}")
