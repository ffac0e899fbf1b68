"""Every numbered notebook runs end to end with papermill, on its own index prefix (`-m notebooks`).

The notebooks are found by `atlas.notebook.runner.discover`, so a new `notebooks/NN_*.ipynb` is tested
without touching this file. nbval (`make test`) separately checks the committed outputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from atlas.notebook.runner import KERNEL, discover, run_notebook, unique_prefix

pytestmark = [pytest.mark.notebooks, pytest.mark.cluster]

NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks")
#: Notebooks that need the local three-node cluster: run by `make test-cluster` (nbval), checked here for form only.
CLUSTER_NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks" / "cluster")
ALL = NOTEBOOKS + CLUSTER_NOTEBOOKS


def test_notebooks_are_found():
    assert NOTEBOOKS and CLUSTER_NOTEBOOKS, "no notebooks/NN_*.ipynb or notebooks/cluster/NN_*.ipynb found"
    numbers = [p.name[:2] for p in ALL]
    assert len(numbers) == len(set(numbers)), f"notebook numbers must be unique: {numbers}"


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_follows_conventions(path):
    """Title first, a `parameters` cell with the conventional names, a cleanup cell last."""
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged `parameters`"
    for name in ("INDEX_PREFIX", "NOW", "SEED", "K", "SCALE", "OUT_DIR", "LLM"):
        assert f"{name} =" in params[0].source, f"parameter {name} missing"
    last_code = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert ".drop()" in last_code.source or "drop_indices" in last_code.source, "the last code cell drops the prefix"


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_committed_outputs_hold_no_progress_bars(path):
    """Whether a bar is drawn depends on the embedding cache, so nbval would see one output more or fewer.

    Execute notebooks for a commit with warm caches (run them twice after a model change).
    """
    nb = nbformat.read(path, as_version=4)
    bars = [i for i, cell in enumerate(nb.cells) for out in cell.get("outputs", [])  # text, or a widget's text/plain
            if re.search(r"\d+%\|", out.get("text", "") + out.get("data", {}).get("text/plain", ""))]
    assert not bars, f"{path.name}: progress bars in the committed outputs of cells {bars}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, es):
    prefix = unique_prefix(path)
    result = run_notebook(path, tmp_path / "notebooks", outputs_dir=tmp_path, prefix=prefix)
    assert result.ok, f"{path.name} failed: {result.error} (executed copy: {result.output})"
    assert result.output.is_file()
    leftovers = es.indices.get(index=f"{prefix}-*", allow_no_indices=True, expand_wildcards="all")
    assert not leftovers, f"{path.name} left indices behind: {sorted(leftovers)}"
