"""The prebuilt workload kernels match their source, kernels.cu and the header it includes
(scripts/build-kernels.sh rebuilds both)."""

from __future__ import annotations

import hashlib
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "aiocudasem" / "_workloads" / "kernels"
HEADER = KERNELS.parents[1] / "include" / "aiocudasem" / "progress.cuh"


def test_the_fatbin_was_built_from_this_source() -> None:
    source = (KERNELS / "kernels.cu").read_bytes() + HEADER.read_bytes()
    built_from = (KERNELS / "kernels.sha256").read_text().split()[0]
    assert built_from == hashlib.sha256(source).hexdigest(), (
        "kernels.cu or progress.cuh changed: run scripts/build-kernels.sh"
    )


def test_the_fatbin_is_a_fatbin_with_every_kernel() -> None:
    data = (KERNELS / "kernels.fatbin").read_bytes()
    assert data[:4] == bytes.fromhex("50ed55ba")  # the fatbin container's magic, little-endian
    names = (b"aiocudasem_spin", b"aiocudasem_check_frame", b"aiocudasem_trap")
    for name in (*names, b"aiocudasem_progress"):
        assert name in data
