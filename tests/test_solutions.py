"""Each lesson ends with two or three exercises; their solutions run end to end with papermill.

A lesson `notebooks/NN_*.ipynb` ends with a markdown cell `## Exercises` (after its cleanup cell): two or three
numbered exercises and a link to `solutions/NN_solutions.ipynb`. A solution notebook opens with its title, a cell
tagged `parameters` (`INDEX_PREFIX = "sol-NN"`, `NOW`, `OUT_DIR`), answers each exercise with an assertion
where the answer is a fact of the data, and drops its prefix in its last code cell. The test runs it on a fresh
prefix (`sol-NN-<random>`) and requires nothing to be left behind. Solutions are short: a few seconds of work
beyond the kernel's start, since they run in `make test`. They are committed without outputs and nbval does not
check them (`make test` ignores the folder): their assertions are the check.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import nbformat
import pytest

from atlas.notebook.runner import KERNEL, discover, number, run_notebook

# `test_solution_runs` takes the `es` fixture, so tests/conftest.py marks it `cluster`; the others read files.
pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[1] / "notebooks"
LESSONS = discover(ROOT) + discover(ROOT / "cluster")
SOLUTIONS = discover(ROOT / "solutions")
EXERCISE = re.compile(r"^\d+\. ", re.MULTILINE)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_ends_with_exercises_and_their_solutions(path):
    nb = nbformat.read(path, as_version=4)
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## Exercises"), \
        "the last cell is the markdown `## Exercises`"
    assert 2 <= len(EXERCISE.findall(last.source)) <= 3, "two or three numbered exercises"
    link = f"solutions/{number(path)}_solutions.ipynb"
    assert link in last.source, f"the exercises link {link}"
    assert (ROOT / link).is_file(), f"{link} does not exist"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_follows_conventions(path):
    nb = nbformat.read(path, as_version=4)
    nn = number(path)
    assert path.name == f"{nn}_solutions.ipynb"
    assert any(p.name.startswith(f"{nn}_") for p in LESSONS), f"no lesson {nn} for {path.name}"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# Solutions to {nn}")
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged `parameters`"
    for words in (f'INDEX_PREFIX = "sol-{nn}"', "NOW =", "OUT_DIR ="):
        assert words in params[0].source, f"the parameters cell does not set {words}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert ".drop()" in code[-1].source or "drop_indices" in code[-1].source, "the last code cell drops the prefix"
    assert not any(c.get("outputs") for c in code), "solutions are committed without outputs"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_runs(path, tmp_path, es):
    """End to end with papermill on a fresh `sol-NN-<random>` prefix; its assertions pass; nothing left behind."""
    prefix = f"sol-{number(path)}-{secrets.token_hex(3)}"
    result = run_notebook(path, tmp_path / "notebooks", outputs_dir=tmp_path, prefix=prefix, timeout=300)
    assert result.ok, f"{path.name} failed: {result.error} (executed copy: {result.output})"
    leftovers = es.indices.get(index=f"{prefix}-*", allow_no_indices=True, expand_wildcards="all")
    assert not leftovers, f"{path.name} left indices behind: {sorted(leftovers)}"
