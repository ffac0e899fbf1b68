"""Every numbered notebook runs end to end with papermill, on its own index prefix (`-m notebooks`).

Every cell of its lesson runs twice in a row in the same kernel, as a workshop attendee re-runs a cell: after
the set-up cells (tagged `setup`: parameters, imports, connect) and before the cleanup (the last code cell,
tagged `cleanup`). The second run must pass and print what the first printed (masked as nbval masks them,
unless the cell is tagged `nbval-ignore-output`, or `reports-first-run`: a repair or an archive says what it did,
and run again it has nothing left to do; an agent turn recalls the turn it wrote the first time). A slow cell
that only reads (08's persona evaluation, a minute or more) is tagged `slow-read` and runs once, to keep the
test's time.

The notebooks are found by `atlas.notebook.runner.discover`, so a new `notebooks/NN_*.ipynb` is tested
without touching this file. nbval (`make test`) separately checks the committed outputs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell
from nbval.plugin import get_sanitize_patterns

from atlas.notebook.runner import KERNEL, TIMES_FILE, discover, duration_words, how_long, run_notebook, unique_prefix

pytestmark = [pytest.mark.notebooks, pytest.mark.cluster]

NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks")
#: Notebooks that need the local three-node cluster: run by `make test-cluster` (nbval), checked here for form only.
CLUSTER_NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks" / "cluster")
ALL = NOTEBOOKS + CLUSTER_NOTEBOOKS
AGAIN = "run-again"
#: Cells whose second output is not compared with the first (they must still run twice).
UNCOMPARED = {"nbval-ignore-output", "reports-first-run"}
SANITIZE = get_sanitize_patterns((NOTEBOOKS[0].parent / "sanitize.cfg").read_text())


def tags(cell: NotebookNode) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def each_cell_twice(nb: NotebookNode) -> NotebookNode:
    """The notebook with every lesson cell (code between the set-up cells and the cleanup) run again at once."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    setup = [i for i in code if "setup" in tags(nb.cells[i])]
    assert setup == code[:len(setup)] and setup, "the set-up cells are the first code cells, tagged `setup`"
    assert "cleanup" in tags(nb.cells[code[-1]]), "the last code cell is tagged `cleanup`"
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        if i in code[len(setup):-1] and "slow-read" not in tags(cell):
            cells.append(new_code_cell(cell.source, metadata={"tags": [*tags(cell), AGAIN]}))
    nb.cells = cells
    return nb


def printed(cell: NotebookNode) -> str:
    """What a cell printed and displayed as text, masked with notebooks/sanitize.cfg. Not stderr: Python shows a
    warning once per place and process, so a second run in the same kernel does not repeat it, and progress bars
    carry rates and times."""
    text = "".join(out.get("text", "") + out.get("data", {}).get("text/plain", "") for out in cell.get("outputs", [])
                   if out.get("name") != "stderr")
    for regex, replace in SANITIZE:
        text = re.sub(regex, replace, text)
    return text


def rerun_differences(nb: NotebookNode) -> list[str]:
    """The lesson cells whose second run printed something else than the first."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    return [f"{first.source.splitlines()[0]!r}:\n{printed(first)}\n--- again ---\n{printed(again)}"
            for first, again in zip(code, code[1:], strict=False)
            if AGAIN in tags(again) and not UNCOMPARED & set(tags(first)) and printed(first) != printed(again)]


def test_notebooks_are_found():
    assert NOTEBOOKS and CLUSTER_NOTEBOOKS, "no notebooks/NN_*.ipynb or notebooks/cluster/NN_*.ipynb found"
    numbers = [p.name[:2] for p in ALL]
    assert len(numbers) == len(set(numbers)), f"notebook numbers must be unique: {numbers}"


def _opening(nb: NotebookNode) -> str:
    """The markdown before the `parameters` cell."""
    params = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    return "".join(c.source for c in nb.cells[:params] if c.cell_type == "markdown")


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_follows_conventions(path):
    """Title first, the opening (what you need, `make lab`, how long, `KEEP`), a `parameters` cell with the
    conventional names, tagged set-up cells, a cleanup cell last."""
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "**What you'll learn:**" in nb.cells[0].source
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged `parameters`"
    opening = _opening(nb)
    for words in ("**What you need:**", "`make lab`", "**How long:**", "`KEEP = True`"):
        assert words in opening, f"the opening does not say {words}"
    for name in ("INDEX_PREFIX", "NOW", "SEED", "K", "SCALE", "OUT_DIR", "LLM", "KEEP"):
        assert f"{name} =" in params[0].source, f"parameter {name} missing"
    last_code = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert ".drop()" in last_code.source or "drop_indices" in last_code.source, "the last code cell drops the prefix"
    each_cell_twice(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_openings_and_the_workshop_path_state_the_measured_times(path):
    """Issue 21: no typed run time. Each opening's **How long:** is `how_long` of the notebook's entry in
    notebooks/times.json (written by `atlas notebooks times`), and the workshop table gives the same times."""
    entry = json.loads((path.parent / TIMES_FILE).read_text())[path.stem]
    assert how_long(entry) in _opening(nbformat.read(path, as_version=4))
    row = f"| `{path.stem}` | {duration_words(entry['warm_s'])} | {duration_words(entry['cold_s'])} |"
    assert row in (path.parent / "README.md").read_text()


def test_times_are_said_as_measured():
    assert [duration_words(s) for s in (0.4, 12.4, 57, 58, 75, 76, 149.6)] == [
        "5 s", "10 s", "55 s", "1 min", "1 min", "1.5 min", "2.5 min"]


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_committed_outputs_hold_no_progress_bars(path):
    """Whether a bar is drawn depends on the embedding cache, so nbval would see one output more or fewer.

    Execute notebooks for a commit with warm caches (run them twice after a model change).
    """
    nb = nbformat.read(path, as_version=4)
    bars = [i for i, cell in enumerate(nb.cells) for out in cell.get("outputs", [])  # text, or a widget's text/plain
            if re.search(r"\d+%\|", out.get("text", "") + out.get("data", {}).get("text/plain", ""))]
    assert not bars, f"{path.name}: progress bars in the committed outputs of cells {bars}"


def test_each_lesson_cell_runs_twice_and_a_changed_output_is_found():
    cells = [new_code_cell("P", metadata={"tags": ["parameters", "setup"]}),
             new_code_cell("I", metadata={"tags": ["setup"]}),
             new_code_cell("A"), nbformat.v4.new_markdown_cell("text"), new_code_cell("B"),
             new_code_cell("slow", metadata={"tags": ["slow-read"]}),
             new_code_cell("drop", metadata={"tags": ["cleanup"]})]
    doubled = each_cell_twice(nbformat.v4.new_notebook(cells=cells))
    assert [c.source for c in doubled.cells] == ["P", "I", "A", "A", "text", "B", "B", "slow", "drop"]
    a, again = doubled.cells[2:4]
    a.outputs = [nbformat.v4.new_output("stream", text="uses: 5, took 12 ms\n")]
    again.outputs = [nbformat.v4.new_output("stream", text="uses: 5, took 9 ms\n")]
    assert rerun_differences(doubled) == []
    again.outputs = [nbformat.v4.new_output("stream", text="uses: 10, took 9 ms\n")]
    assert len(rerun_differences(doubled)) == 1
    with pytest.raises(AssertionError, match="tagged `cleanup`"):
        each_cell_twice(nbformat.v4.new_notebook(cells=cells[:-1]))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, es):
    """End to end on a fresh prefix, each lesson cell twice; nothing left behind."""
    prefix = unique_prefix(path)
    nbformat.write(each_cell_twice(nbformat.read(path, as_version=4)), tmp_path / path.name)
    path = tmp_path / path.name
    result = run_notebook(path, tmp_path / "notebooks", outputs_dir=tmp_path, prefix=prefix)
    assert result.ok, f"{path.name} failed: {result.error} (executed copy: {result.output})"
    assert result.output.is_file()
    leftovers = es.indices.get(index=f"{prefix}-*", allow_no_indices=True, expand_wildcards="all")
    assert not leftovers, f"{path.name} left indices behind: {sorted(leftovers)}"
    differences = rerun_differences(nbformat.read(result.output, as_version=4))
    assert not differences, "a cell printed something else when run again:\n" + "\n\n".join(differences)
