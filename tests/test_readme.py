"""The README's examples run as written, and the README stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from atlas.core.store import Store
from atlas.security.tokens import create_user
from atlas.serve.mcp_server import BackgroundServer, create_app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150


def readme_example(heading: str) -> str:
    """The first ```python block under the README's `### heading`, exactly as written."""
    section = README.read_text(encoding="utf-8").split(f"\n### {heading}\n", 1)
    assert len(section) == 2, f"README.md has no '### {heading}' section"
    match = re.search(r"^```python\n(.*?)^```", section[1], re.S | re.M)
    assert match, f"README.md's '{heading}' section has no ```python block"
    return match.group(1)


def run_example(code: str) -> list[str]:
    """The example's printed lines, run in a fresh interpreter as a reader would run it."""
    env = {**os.environ, "ATLAS_HOME": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.strip()]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines; keep it under {MAX_LINES}"


@pytest.mark.cluster
def test_the_python_example_runs_as_written():
    lines = run_example(readme_example("Python"))
    hit = re.compile(r"-?\d+\.\d{4}  (episodic|semantic|procedural|catalog)\s+\S")
    assert lines and all(hit.match(line) for line in lines), f"not a line per hit:\n{lines}"
    assert any(line.endswith("Sarah lives in Edinburgh") for line in lines), lines
    assert any(line.endswith("My Lumio Hub v2 shows E-0x41 again") for line in lines), lines


def test_the_mcp_example_runs_against_a_server(store: Store, tmp_path, monkeypatch):
    """The example with this test's server URL and a token issued here in place of the README's two placeholders."""
    monkeypatch.setenv("ATLAS_HOME", str(tmp_path))
    store.settings = replace(store.settings, home=tmp_path)
    issued = create_user(store, "sarah")
    code = readme_example("MCP")
    placeholders = ('"http://127.0.0.1:8765/api/atlas/mcp/sarah"', '"atl_..."')
    assert all(p in code for p in placeholders), "the README's MCP example names the URL and token it is run with"
    with BackgroundServer(create_app(store)) as server:  # the store fixture's drop invalidates the prefix's keys
        for placeholder, value in zip(placeholders, (server.url("sarah"), issued.secret), strict=True):
            code = code.replace(placeholder, repr(value))
        assert run_example(code) == ["Sarah lives in Edinburgh"]


@pytest.mark.cluster
def test_the_langgraph_example_runs_as_written():
    lines = run_example(readme_example("LangGraph and LangMem"))
    assert lines and "Zigbee channel 25" in lines[0], lines
