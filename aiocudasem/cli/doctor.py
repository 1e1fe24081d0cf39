"""``aiocudasem doctor``: what this machine offers, and any problem in its configuration."""

from __future__ import annotations

import importlib.metadata
import os
import sys

from .. import AiocudasemError, DriverUnavailableError
from ..lowlevel import DRIVER_ENV, HOST_FUNCTION, get_driver
from ._common import DRIVERS, bad_env_message

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
    """Print the report. Returns 1 if it finds a problem in the configuration (an invalid
    ``$AIOCUDASEM_DRIVER``), which it also names on standard error, else 0: a machine without a
    GPU or without Vulkan is reported, not a problem."""
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
    except DriverUnavailableError as exc:
        # The reason alone: the library's message says how to pick the simulated device in
        # Python, and the "default" line below says it for the command line too.
        print(f"{'cuda':>14}: unavailable: {exc.reason}")
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
    problem = _print_default()
    if problem is None:
        return 0
    print(f"aiocudasem doctor: problem: {problem}", file=sys.stderr)
    return 1


def _print_default() -> str | None:
    """The default driver's line; returns the problem with ``$AIOCUDASEM_DRIVER``, if any."""
    sim = "the simulated device is --driver sim (driver='sim' in Python)"
    raw = os.environ.get(DRIVER_ENV, "")
    value = raw.strip()
    if not value:
        print(f"{'default':>14}: cuda (${DRIVER_ENV} is not set); {sim}")
        return None
    if value in DRIVERS:
        print(f"{'default':>14}: {value} ({DRIVER_ENV}={value}); {sim}")
        return None
    problem = f"{bad_env_message(raw, flag=False)}. Until then, library calls without driver= fail"
    print(f"{'default':>14}: PROBLEM: {problem}")
    return problem


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
