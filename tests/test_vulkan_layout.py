"""The ctypes mirror of vulkan_core.h in aiocudasem.vulkan._abi, checked against the real header.

A C program generated from that module's registries (_STRUCTS, _CONSTANTS, _FUNCTIONS) prints
the size, alignment and field offsets of every structure, the value of every constant and the
size of every command parameter; it also fails to compile if a command's declared C signature
differs from the header's PFN_ type. The probe compiles against the pinned copy of the headers in
tests/vendor (its README says which version), never the system's. Needs a C compiler; skips with
the reason when there is none.
"""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import aiocudasem.vulkan
from aiocudasem.vulkan import _abi

_HEADER = "vulkan/vulkan_core.h"
_VENDOR = Path(__file__).resolve().parent / "vendor"


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) on PATH to build the layout probe")
    return cc


def _vendored_header() -> Path:
    header = _VENDOR / _HEADER
    assert header.is_file(), f"the vendored {_HEADER} is missing from {_VENDOR}"
    return header


def _struct_type_name(c_name: str) -> str:
    """VkPhysicalDeviceIDProperties -> VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES."""
    words = re.sub(
        r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[a-z])(?=[0-9])", "_", c_name[2:]
    )
    return "VK_STRUCTURE_TYPE_" + words.upper()


def _program() -> str:
    out = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <stdio.h>",
        f"#include <{_HEADER}>",
        "int main(void) {",
    ]

    def emit(fmt: str, *args: str) -> None:
        out.append(f'    printf("{fmt}\\n"{"".join(", " + a for a in args)});')

    for c_name, cls in _abi._STRUCTS:
        emit(f"struct {c_name}\\t%zu %zu", f"sizeof({c_name})", f"_Alignof({c_name})")
        for field_name, *_ in cls._fields_:
            emit(
                f"field {c_name}.{field_name}\\t%zu %zu",
                f"offsetof({c_name}, {field_name})",
                f"sizeof((({c_name} *)0)->{field_name})",
            )
    for c_name, cls in _abi._STRUCTS:
        if cls in _abi._STRUCTURE_TYPES:
            stype = _struct_type_name(c_name)
            emit(f"stype {c_name}\\t%lld", f"(long long)({stype})")
    for name, value in _abi._CONSTANTS:
        if isinstance(value, str):
            emit(f"const {name}\\t%s", name)
        else:
            emit(f"const {name}\\t%lld", f"(long long)({name})")
    for fn_name, ((c_ret, _), params) in _abi._FUNCTIONS.items():
        c_params = ", ".join(c_type for c_type, _ in params)
        # Initialising our signature from the header's PFN_ type is a compile error (with
        # -Werror=incompatible-pointer-types) unless return and parameter types all match.
        out.append(f"    {{ {c_ret} (*check)({c_params}) = (PFN_{fn_name})0; (void)check; }}")
        for index, (c_type, _) in enumerate(params):
            emit(f"param {fn_name} {index}\\t%zu", f"sizeof({c_type})")
        if c_ret != "void":
            emit(f"return {fn_name}\\t%zu", f"sizeof({c_ret})")
    out += ["    return 0;", "}", ""]
    return "\n".join(out)


@pytest.fixture(scope="module")
def header_facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Compile and run the generated probe; map each printed key to its values. The key
    "included" lists the headers the compiler read (from its -H output)."""
    cc = _compiler()
    _vendored_header()
    tmp = tmp_path_factory.mktemp("vulkan_layout")
    source = tmp / "layout.c"
    source.write_text(_program())
    binary = tmp / "layout"
    built = subprocess.run(
        [
            cc,
            "-std=c11",
            "-Wall",
            "-Werror=incompatible-pointer-types",
            # -I comes before the system include path, so a system copy of the headers, of
            # whatever version, is never read.
            f"-I{_VENDOR}",
            "-H",
            str(source),
            "-o",
            str(binary),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    # -H prints each header it opens on stderr, one a line, after a dot for each level of nesting.
    included = re.compile(r"^\.+ (.+)$", re.MULTILINE)
    assert built.returncode == 0, (
        f"the layout probe does not compile against <{_HEADER}>: a declared C type or "
        f"command signature in aiocudasem.vulkan._abi is wrong\n{included.sub('', built.stderr)}"
    )
    ran = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    facts: dict[str, list[str]] = {}
    for line in ran.stdout.splitlines():
        key, _, values = line.partition("\t")
        facts[key] = values.split(" ")
    facts["included"] = [match[1] for match in included.finditer(built.stderr)]
    return facts


def _package_modules() -> list[ModuleType]:
    """aiocudasem.vulkan and every module in it."""
    package = aiocudasem.vulkan
    return [package] + [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
    ]


def _ctype_size(ctype: Any) -> int | None:
    return None if ctype is None else ctypes.sizeof(ctype)


def test_every_structure_is_registered() -> None:
    defined = {
        obj
        for module in _package_modules()
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, ctypes.Structure)
        and obj.__module__ == module.__name__
    }
    registered = {cls for _, cls in _abi._STRUCTS}
    assert defined == registered, (
        f"not in _STRUCTS: {sorted(c.__name__ for c in defined - registered)}"
    )
    assert all(c_name == cls.__name__ for c_name, cls in _abi._STRUCTS)


def test_the_probe_reads_the_vendored_headers(header_facts: dict[str, list[str]]) -> None:
    included = [Path(path).resolve() for path in header_facts["included"]]
    vulkan = [path for path in included if path.name.startswith(("vulkan", "vk_"))]
    assert _vendored_header() in vulkan, vulkan
    outside = [path for path in vulkan if not path.is_relative_to(_VENDOR)]
    assert not outside, f"Vulkan headers read from outside {_VENDOR}: {outside}"


def test_without_a_compiler_the_probe_skips_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="no C compiler"):
        _compiler()


def test_struct_layouts_match_header(header_facts: dict[str, list[str]]) -> None:
    mismatches: list[str] = []
    for c_name, cls in _abi._STRUCTS:
        size, align = (int(v) for v in header_facts[f"struct {c_name}"])
        if (ctypes.sizeof(cls), ctypes.alignment(cls)) != (size, align):
            mismatches.append(
                f"{c_name}: sizeof/alignof C={size}/{align} "
                f"ctypes={ctypes.sizeof(cls)}/{ctypes.alignment(cls)}"
            )
        for field_name, *_ in cls._fields_:
            offset, field_size = (int(v) for v in header_facts[f"field {c_name}.{field_name}"])
            descriptor = getattr(cls, field_name)
            if (descriptor.offset, descriptor.size) != (offset, field_size):
                mismatches.append(
                    f"{c_name}.{field_name}: offset/size C={offset}/{field_size} "
                    f"ctypes={descriptor.offset}/{descriptor.size}"
                )
    assert not mismatches, "ctypes layouts differ from vulkan_core.h:\n" + "\n".join(mismatches)


def test_structure_types_match_header(header_facts: dict[str, list[str]]) -> None:
    mismatches = [
        f"{c_name}: sType C={header_facts[f'stype {c_name}'][0]} "
        f"python={_abi._STRUCTURE_TYPES[cls]}"
        for c_name, cls in _abi._STRUCTS
        if cls in _abi._STRUCTURE_TYPES
        and int(header_facts[f"stype {c_name}"][0]) != _abi._STRUCTURE_TYPES[cls]
    ]
    assert not mismatches, "wrong sType for:\n" + "\n".join(mismatches)
    # Every structure that starts with sType must have an entry, or _new() leaves it at 0.
    missing = [
        c_name
        for c_name, cls in _abi._STRUCTS
        if cls._fields_[0][0] == "sType" and cls not in _abi._STRUCTURE_TYPES
    ]
    assert not missing, f"structures without an sType entry: {missing}"


def test_constants_match_header(header_facts: dict[str, list[str]]) -> None:
    mismatches: list[str] = []
    for name, value in _abi._CONSTANTS:
        printed = " ".join(header_facts[f"const {name}"])
        expected = value if isinstance(value, str) else int(printed)
        if expected != value or (isinstance(value, str) and printed != value):
            mismatches.append(f"{name}: C={printed!r} python={value!r}")
        assert getattr(_abi, name) == value
    assert not mismatches, "constants differ from vulkan_core.h:\n" + "\n".join(mismatches)


def test_command_parameter_sizes_match_header(header_facts: dict[str, list[str]]) -> None:
    mismatches: list[str] = []
    for fn_name, ((c_ret, ret_ctype), params) in _abi._FUNCTIONS.items():
        for index, (c_type, ctype) in enumerate(params):
            size = int(header_facts[f"param {fn_name} {index}"][0])
            if _ctype_size(ctype) != size:
                mismatches.append(
                    f"{fn_name} parameter {index} ({c_type}): C={size} ctypes={_ctype_size(ctype)}"
                )
        if c_ret != "void":
            size = int(header_facts[f"return {fn_name}"][0])
            if _ctype_size(ret_ctype) != size:
                mismatches.append(f"{fn_name} return ({c_ret}): C={size}")
        elif ret_ctype is not None:
            mismatches.append(f"{fn_name} returns void but has restype {ret_ctype}")
    assert not mismatches, "command signatures differ from vulkan_core.h:\n" + "\n".join(mismatches)


def test_structure_pointer_parameters_point_to_that_structure() -> None:
    # Sizes cannot tell a pointer to one structure from a pointer to another.
    structs = dict(_abi._STRUCTS)
    wrong: list[str] = []
    for fn_name, (_, params) in _abi._FUNCTIONS.items():
        for index, (c_type, ctype) in enumerate(params):
            base = c_type.removeprefix("const ").removesuffix("*")
            if base in structs and ctype is not ctypes.POINTER(structs[base]):
                wrong.append(f"{fn_name} parameter {index}: {c_type} declared as {ctype}")
    for c_name, cls in _abi._STRUCTS:
        for field_name, ctype, *_ in cls._fields_:
            target = getattr(ctype, "_type_", None)
            if isinstance(target, type) and issubclass(target, ctypes.Structure):
                assert (target.__name__, target) in _abi._STRUCTS, f"{c_name}.{field_name}"
    assert not wrong, "\n".join(wrong)


def test_every_command_used_is_declared() -> None:
    used = set(_abi._INSTANCE_COMMANDS) | set(_abi._DEVICE_COMMANDS) | set(_abi._TIMELINE_COMMANDS)
    used |= {
        "vkGetInstanceProcAddr",
        "vkEnumerateInstanceVersion",
        "vkCreateInstance",
        "vkGetSemaphoreFdKHR",
    }
    assert used <= set(_abi._FUNCTIONS), sorted(used - set(_abi._FUNCTIONS))
    source = "".join(Path(str(module.__file__)).read_text() for module in _package_modules())
    called = set(re.findall(r'"(vk[A-Z][A-Za-z0-9]+)"', source))
    assert called <= set(_abi._FUNCTIONS), sorted(called - set(_abi._FUNCTIONS))


def test_struct_type_name_rule() -> None:
    # The naming rule the sType check relies on, on the awkward cases.
    assert _struct_type_name("VkPhysicalDeviceIDProperties") == (
        "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES"
    )
    assert _struct_type_name("VkPhysicalDeviceFeatures2") == (
        "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2"
    )
    assert _struct_type_name("VkSemaphoreGetFdInfoKHR") == (
        "VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR"
    )
