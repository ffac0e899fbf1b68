"""The README's example runs as written, and the README stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150


def readme_example() -> str:
    """The README's first ```python block, exactly as written."""
    match = re.search(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines; keep it under {MAX_LINES}"


@pytest.mark.cluster
def test_readme_example_runs_as_written():
    env = {**os.environ, "ATLAS_HOME": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", readme_example()], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    hit = re.compile(r"-?\d+\.\d{4}  (episodic|semantic|procedural|catalog)\s+\S")
    assert lines and all(hit.match(line) for line in lines), f"not a line per hit:\n{done.stdout}"
    assert any(line.endswith("Sarah lives in Edinburgh") for line in lines), done.stdout
    assert any(line.endswith("My Lumio Hub v2 shows E-0x41 again") for line in lines), done.stdout
