"""Loading the Vulkan loader and its commands, and turning their results into exceptions.

The loader library is opened only when a device is opened, never at import, so that importing
aiocudasem.vulkan works on machines without Vulkan. The argument checks live here too: the
public API runs them before any Vulkan call, so bad values never reach the driver.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Callable
from typing import Any, Final

from .._errors import VulkanError, VulkanUnavailableError
from ._abi import (
    _FUNCTIONS,
    _RESULT_NAMES,
    _U64_MAX,
    VK_API_VERSION_1_2,
    VK_ERROR_INCOMPATIBLE_DRIVER,
    VK_ERROR_INITIALIZATION_FAILED,
    VK_ERROR_UNKNOWN,
    VK_UUID_SIZE,
    VkApplicationInfo,
    VkInstanceCreateInfo,
    _major_minor,
    _new,
    _ptr,
    _u32,
    _version_text,
)

# ---------------------------------------------------------------------------------------------
# Loader and errors.

_LOADER_ENV: Final = "AIOCUDASEM_VULKAN_LOADER"
#: Library names tried in order when AIOCUDASEM_VULKAN_LOADER is unset.
_LOADER_NAMES: tuple[str, ...] = ("libvulkan.so.1",)


def _load_loader() -> ctypes.CDLL:
    override = os.environ.get(_LOADER_ENV)
    names = (override,) if override else _LOADER_NAMES
    failures: list[str] = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            # dlopen's message names the library already ("libvulkan.so.1: cannot open ...").
            why = str(exc)
            failures.append(why if why.startswith(name) else f"{name}: {why}")
    raise VulkanUnavailableError(
        "cannot load the Vulkan loader ("
        + "; ".join(failures)
        + "); install the system's Vulkan loader (libvulkan1 on Debian and Ubuntu) and a "
        f"Vulkan driver, or set {_LOADER_ENV} to the loader library's path"
    )


def _result_name(result: int) -> str:
    return _RESULT_NAMES.get(result, f"VkResult({result})")


def _vk_error(command: str, result: int) -> VulkanError:
    name = _RESULT_NAMES.get(result, "")
    return VulkanError(f"{command} failed: {_result_name(result)}", status=result, name=name)


def _check(command: str, result: int) -> int:
    if result < 0:
        raise _vk_error(command, result)
    return result


# Instance creation and device enumeration report "no usable driver" with these codes.
_NO_DRIVER_RESULTS: Final = frozenset(
    {VK_ERROR_INCOMPATIBLE_DRIVER, VK_ERROR_INITIALIZATION_FAILED}
)
_NO_DRIVER_HINT: Final = (
    "install a Vulkan driver (ICD) for the device, or point VK_DRIVER_FILES (VK_ICD_FILENAMES on "
    "older loaders) at its ICD JSON file if it is installed outside the standard directories"
)


def _unavailable(command: str, result: int) -> VulkanUnavailableError:
    return VulkanUnavailableError(
        f"no usable Vulkan driver: {command} returned {_result_name(result)}; {_NO_DRIVER_HINT}",
        status=result,
    )


# ---------------------------------------------------------------------------------------------
# Commands, bound through the loader's and the driver's GetProcAddr.

_Fn = Callable[..., Any]


def _prototype(name: str) -> Any:
    (_, restype), params = _FUNCTIONS[name]
    return ctypes.CFUNCTYPE(restype, *(argtype for _, argtype in params))


def _bind(getter: _Fn, handle: int | None, name: str, lookup: str | None = None) -> _Fn:
    address = getter(handle, (lookup or name).encode("ascii"))
    if not address:
        raise VulkanUnavailableError(
            f"the Vulkan loader or driver does not provide {lookup or name}"
        )
    fn: _Fn = _prototype(name)(address)
    return fn


def _create_instance(gipa: _Fn) -> int:
    enumerate_version = gipa(None, b"vkEnumerateInstanceVersion")
    if not enumerate_version:
        raise VulkanUnavailableError(
            "the Vulkan loader supports only Vulkan 1.0; Vulkan 1.1 or newer is needed"
        )
    loader_version = _u32(0)
    _check(
        "vkEnumerateInstanceVersion",
        int(
            _prototype("vkEnumerateInstanceVersion")(enumerate_version)(
                ctypes.byref(loader_version)
            )
        ),
    )
    if _major_minor(loader_version.value) < (1, 1):
        raise VulkanUnavailableError(
            f"the Vulkan loader supports Vulkan {_version_text(loader_version.value)}; "
            "1.1 or newer is needed"
        )
    app = _new(
        VkApplicationInfo,
        pApplicationName=b"aiocudasem",
        pEngineName=b"aiocudasem",
        apiVersion=VK_API_VERSION_1_2,
    )
    info = _new(VkInstanceCreateInfo, pApplicationInfo=ctypes.pointer(app))
    instance = _ptr()
    create = _bind(gipa, None, "vkCreateInstance")
    result = int(create(ctypes.byref(info), None, ctypes.byref(instance)))
    if result in _NO_DRIVER_RESULTS:
        raise _unavailable("vkCreateInstance", result)
    _check("vkCreateInstance", result)
    if not instance.value:
        raise VulkanError("vkCreateInstance returned no instance", status=VK_ERROR_UNKNOWN)
    return int(instance.value)


# ---------------------------------------------------------------------------------------------
# Argument checks.


def _check_u64(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{what} must be in [0, 2**64 - 1], got {value}")
    return value


def _timeout_ns(timeout: object) -> int:
    if timeout is None:
        return _U64_MAX
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"timeout must be None (wait forever) or a number of seconds, got "
            f"{type(timeout).__name__}"
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, got {timeout}")
    if math.isinf(timeout):
        return _U64_MAX
    return min(int(timeout * 1_000_000_000), _U64_MAX)


def _check_uuid(uuid: object) -> bytes | None:
    if uuid is None:
        return None
    if not isinstance(uuid, bytes | bytearray | memoryview):
        raise TypeError(
            f"uuid must be 16 bytes (the CUDA device UUID) or None, got {type(uuid).__name__}"
        )
    raw = bytes(uuid)
    if len(raw) != VK_UUID_SIZE:
        raise ValueError(f"uuid must be exactly {VK_UUID_SIZE} bytes, got {len(raw)}")
    return raw
