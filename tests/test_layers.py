"""The package reads like the design: the layers contract holds, type-only imports included, with no cycle."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_layers_contract_holds():
    """`lint-imports` checks the contracts in pyproject.toml: layers, and no cycle at any level."""
    run = subprocess.run([BIN / "lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout


def test_the_contract_counts_imports_made_for_type_checking():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["exclude_type_checking_imports"] is False


def test_the_core_is_the_memory_layer_only():
    """No key, token, secrets-file or privacy code in the core, and it stays readable at one sitting."""
    core = ROOT / "atlas" / "core"
    names = {path.stem for path in core.glob("*.py")}
    assert not names & {"tenancy", "tokens", "privacy", "secrets", "connection"}, names
    text = {path.name: path.read_text() for path in core.glob("*.py")}
    for needle in ("create_api_key", "read_secret", "CREDENTIALS_SUFFIX", "TOKEN_"):
        assert not [name for name, body in text.items() if needle in body], needle
    assert sum(body.count("\n") for body in text.values()) < 2800
