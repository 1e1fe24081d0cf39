"""The prebuilt workload kernels match their source (scripts/build-kernels.sh rebuilds both)."""

from __future__ import annotations

import hashlib
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "aiocudasem" / "_workloads" / "kernels"


def test_the_fatbin_was_built_from_this_source() -> None:
    source = hashlib.sha256((KERNELS / "kernels.cu").read_bytes()).hexdigest()
    built_from = (KERNELS / "kernels.sha256").read_text().split()[0]
    assert built_from == source, "kernels.cu changed: run scripts/build-kernels.sh"


def test_the_fatbin_is_a_fatbin_with_every_kernel() -> None:
    data = (KERNELS / "kernels.fatbin").read_bytes()
    assert data[:4] == bytes.fromhex("50ed55ba")  # the fatbin container's magic, little-endian
    for name in (b"aiocudasem_spin", b"aiocudasem_check_frame", b"aiocudasem_trap"):
        assert name in data
