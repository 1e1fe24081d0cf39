"""The README's usage example runs as written, on the GPU with Vulkan."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.gpu
def test_readme_usage_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    example = blocks[0]
    assert "anyio.run(main)" in example
    proc = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
