"""The package reads like the design: the layers contract holds and no package has an import cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_layers_contract_holds():
    """`lint-imports` checks the contracts in pyproject.toml: layers, and no cycle at any level."""
    run = subprocess.run([BIN / "lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout


def test_import_graph_script_finds_no_cycle():
    run = subprocess.run([sys.executable, "scripts/import_graph.py", "--layers"], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "atlas.core -> -" in run.stdout, "the core imports no other part of Atlas"


def test_cycle_detection_finds_a_cycle():
    """The script's cycle finder is what the second test relies on: it must see a planted cycle."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from import_graph import cycles
    finally:
        sys.path.pop(0)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
