"""Every numbered notebook runs end to end with papermill, on its own index prefix (`-m notebooks`).

Every cell of its lesson runs twice in a row in the same kernel, as a workshop attendee re-runs a cell: after
the set-up cells (tagged `setup`: parameters, imports, connect) and before the cleanup (the last code cell,
tagged `cleanup`). The second run must pass and print what the first printed (masked as nbval masks them,
unless the cell is tagged `nbval-ignore-output`, or `reports-first-run`: a repair or an archive says what it did,
and run again it has nothing left to do). A cell tagged `run-once` runs once: a slow read (10's persona evaluation,
a minute or more), to keep the test's time, or a write whose repeat would show (01's first episode, 07's new ones,
08's conversation: a second run stores them twice).

The same run also does nbval's job, so that `make test` executes each notebook once: the first run of each code
cell must print what the committed notebook shows, compared as `pytest --nbval --nbval-sanitize-with
notebooks/sanitize.cfg` compares them (`committed_differences`; the values papermill injected, INDEX_PREFIX and
OUT_DIR, read as the committed defaults, which nbval would run with). The cluster notebooks are run and checked the
same way by tests/test_multinode.py (`make test-cluster`). 10's persona report and 11's LoCoMo report are the ones
tests/test_eval.py checks when both run in one session (`executed` runs a notebook once per session).

The notebooks are found by `atlas.notebook.runner.discover`, so a new `notebooks/NN_*.ipynb` is tested
without touching this file.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell
from nbval.plugin import (
    coalesce_streams,
    find_comment_markers,
    find_metadata_tags,
    get_sanitize_patterns,
    transform_streams_for_comparison,
)

from atlas import constants as C
from atlas.notebook.runner import (
    KERNEL,
    TIMES_FILE,
    RunResult,
    discover,
    duration_words,
    how_long,
    run_notebook,
    unique_prefix,
)
from tests.conftest import MODEL_GROUP, SHARED_WORKER

# The tests that run a notebook take the `es` fixture, so tests/conftest.py marks them `cluster`; the others read files.
pytestmark = pytest.mark.notebooks

NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks")
#: Notebooks that need the local three-node cluster: run by tests/test_multinode.py (`make test-cluster`), checked
#: here for form only.
CLUSTER_NOTEBOOKS = discover(Path(__file__).resolve().parents[1] / "notebooks" / "cluster")
ALL = NOTEBOOKS + CLUSTER_NOTEBOOKS
AGAIN = "run-again"
#: Cells whose second output is not compared with the first (they must still run twice).
UNCOMPARED = {"nbval-ignore-output", "reports-first-run"}
SANITIZE = get_sanitize_patterns((NOTEBOOKS[0].parent / "sanitize.cfg").read_text())
#: The output fields nbval does not compare (`nbval.plugin.IPyNbFile.skip_compare`, without --nbdime): everything
#: else is, each stream by its name (stdout and stderr) and each MIME type of a display or result.
NBVAL_SKIPS = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
               "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
#: The cell papermill adds after the `parameters` cell (the run's INDEX_PREFIX and OUT_DIR).
INJECTED = "injected-parameters"


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
        if i in code[len(setup):-1] and "run-once" not in tags(cell):
            cells.append(new_code_cell(cell.source, metadata={"tags": [*tags(cell), AGAIN]}))
    nb.cells = cells
    return nb


def masked(value: object) -> object:
    """A text with notebooks/sanitize.cfg applied in order, as nbval's `sanitize` does (other values as they are)."""
    if not isinstance(value, str):
        return value
    for regex, replace in SANITIZE:
        value = re.sub(regex, replace, value)
    return value


def printed(cell: NotebookNode) -> str:
    """What a cell printed and displayed as text, masked with notebooks/sanitize.cfg. Not stderr: Python shows a
    warning once per place and process, so a second run in the same kernel does not repeat it, and progress bars
    carry rates and times."""
    return str(masked("".join(out.get("text", "") + out.get("data", {}).get("text/plain", "")
                              for out in cell.get("outputs", []) if out.get("name") != "stderr")))


def nbval_fields(outputs: list, replace: dict[str, str] | None = None) -> dict[str, list]:
    """A cell's outputs as nbval compares them (`IPyNbCell.compare_outputs`): streams coalesced by name, then
    {field: [masked value of each output that has it]}, a stream's field being its name (stdout, stderr) and a
    display's or result's its MIME types. Each text has `replace`'s keys replaced by their values first."""
    def value(text: object) -> object:
        for old, new in (replace or {}).items():
            text = text.replace(old, new) if isinstance(text, str) else text
        return masked(text)

    fields: dict[str, list] = defaultdict(list)
    for out in transform_streams_for_comparison(coalesce_streams(copy.deepcopy(outputs))):
        for key, data in out.items():
            if key == "data":
                for mime, shown in data.items():
                    if mime not in NBVAL_SKIPS:
                        fields[mime].append(value(shown))
            elif key not in NBVAL_SKIPS:
                fields[key].append(value(data))
    return dict(fields)


def parameter_values(cell: NotebookNode) -> dict[str, object]:
    """The constants a parameters cell assigns (`NAME = literal`)."""
    return {node.targets[0].id: node.value.value for node in ast.parse(cell.source).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)}


def injected_to_committed(committed: NotebookNode, executed: NotebookNode) -> dict[str, str]:
    """{value papermill injected: the committed default} for each text parameter (INDEX_PREFIX `nb-02-1a2b3c4d`
    -> `nb-02`, OUT_DIR): the committed outputs come from a run with the defaults, as nbval runs it."""
    def values(cells: list, tag: str) -> dict[str, object]:
        return {k: v for cell in cells if tag in tags(cell) for k, v in parameter_values(cell).items()}

    defaults, injected = values(committed.cells, "parameters"), values(executed.cells, INJECTED)
    pairs = {str(injected[k]): str(defaults[k]) for k in injected.keys() & defaults.keys()
             if isinstance(injected[k], str) and injected[k] and injected[k] != defaults[k]}
    return dict(sorted(pairs.items(), key=lambda pair: -len(pair[0])))  # longest first: a value may hold another


def nbval_checks(cell: NotebookNode) -> bool:
    """Whether `pytest --nbval` compares this cell's outputs: not when tagged `nbval-ignore-output` or `nbval-skip`
    (or marked so by a `# NBVAL_...` comment, which wins, as in nbval), nor when the committed cell never ran."""
    options = dict(find_metadata_tags(cell.metadata)) | dict(find_comment_markers(cell.source))
    return options.get("check", True) and not options.get("skip", False) and cell.execution_count is not None


def layout(value: object) -> object:
    """A text without its layout: the run's prefix has another length than the committed one, which pads a table's
    columns and wraps a JSON line elsewhere, so runs of whitespace and a table rule's length are not compared."""
    return re.sub(r"-{3,}", "---", re.sub(r"\s+", " ", value)).strip() if isinstance(value, str) else value


def _mismatch(number: int, cell: NotebookNode, key: str, expected: object, got: object) -> str:
    return (f"cell {number} {cell.source.splitlines()[0] if cell.source else ''!r}: mismatch {key!r}\n"
            f"<<<<<<<<<<<< committed output:\n{expected}\n============ disagrees with this run's output:\n{got}\n"
            ">>>>>>>>>>>>")


def committed_differences(committed: NotebookNode, executed: NotebookNode) -> list[str]:
    """The code cells whose first run (in `executed`, the run of `each_cell_twice(committed)`) shows something else
    than `committed` does, field by field as nbval reports them; the cell papermill injected is not one of them.
    Cells are numbered as nbval numbers them (code cells of the committed notebook, from 0)."""
    ran = [cell for cell in executed.cells if cell.cell_type == "code" and not {AGAIN, INJECTED} & set(tags(cell))]
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert [c.source for c in ran] == [c.source for c in code], "the run is not of the committed notebook's cells"
    replace = injected_to_committed(committed, executed)
    differences = []
    for number, (ref, test) in enumerate(zip(code, ran, strict=True)):
        if ref.execution_count is None and ref.outputs:
            differences.append(f"cell {number}: unrun reference cell has outputs")
        if not nbval_checks(ref):
            continue
        expected, got = nbval_fields(ref.outputs), nbval_fields(test.outputs, replace)
        if expected.keys() != got.keys():
            differences.append(_mismatch(number, ref, "fields", sorted(expected), sorted(got)))
            continue
        for key, values in expected.items():
            if list(map(layout, values)) != list(map(layout, got[key])):
                differences.append(_mismatch(number, ref, key, "\n".join(map(str, values)),
                                             "\n".join(map(str, got[key]))))
                break
    return differences


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


#: The most cells a lesson may have: about one idea's worth.
MAX_CELLS = 35


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_follows_conventions(path):
    """Title first, the opening (what you need, `make lab`, how long, `KEEP`), a `parameters` cell with the
    conventional names, tagged set-up cells, a cleanup cell last, and no more than `MAX_CELLS` cells (issue 35:
    one idea per lesson)."""
    nb = nbformat.read(path, as_version=4)
    assert len(nb.cells) <= MAX_CELLS, f"{len(nb.cells)} cells: split the lesson or move detail into its solutions"
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
    untagged = [i for i, c in enumerate(nb.cells) if not isinstance(c.get("metadata", {}).get("tags"), list)]
    assert not untagged, f"cells {untagged} have no `tags` list (papermill's parameterize_notebook reads every cell's)"
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


#: A number in a lesson's markdown is a claim unless it sits in code, a link's target, a list's numbering, a notebook's
#: or an issue's name, or a sentence another test checks (the measured times, the learner's time).
NOT_CLAIMS = (r"```.*?```", r"`[^`]*`", r"\]\([^)]*\)", r"<[^>]+>", r"(?m)^\s*\d+\.\s", r"(?m)^# \d+ ·",
              r"(?i)\b(?:notebooks?|lessons?|issues?|step|exercises?)\s+\d+(?:\s*(?:,|and|or|to)\s*\d+)*",
              r"\*\*How long:\*\*.*?(?:\n\n|$)", r"\*\*Your time:\*\*[^\n]*")
NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?!\w)")


def plain_number(text: str) -> str:
    """`1,986` -> `1986`, `0.70` -> `0.7`, `4.0` -> `4`: a number as any cell may print it."""
    text = text.replace(",", "")
    return text.rstrip("0").rstrip(".") if "." in text else text


def stated_numbers(markdown: str) -> set[str]:
    """The numbers a markdown text states as claims (`NOT_CLAIMS` removed first)."""
    for pattern in NOT_CLAIMS:
        markdown = re.sub(pattern, " ", markdown, flags=re.S)
    return {plain_number(n) for n in NUMBER.findall(markdown)}


def held_numbers(nb: NotebookNode) -> set[str]:
    """The numbers a notebook's code and committed outputs hold, and the values of `atlas.constants`."""
    texts = [cell.source + printed(cell) + "".join(
        str(out.get("data", {}).get(mime, "")) for out in cell.get("outputs", []) for mime in ("text/markdown",
                                                                                             "text/html"))
             for cell in nb.cells if cell.cell_type == "code"]
    texts += [repr(value) for value in vars(C).values() if isinstance(value, (int, float, tuple, dict))]
    return {plain_number(n) for text in texts for n in NUMBER.findall(text)}


def test_a_number_in_markdown_is_a_claim_unless_it_names_or_codes_something():
    markdown = ("R@10 rose from 0.97 to 0.980 over 1,986 questions (notebook 02, issues 35 and 37); `k=50` "
                "[link](solutions/03.ipynb)\n1. first\n**How long:** 5 s")
    assert stated_numbers(markdown) == {"10", "0.97", "0.98", "1986"}
    nb = nbformat.v4.new_notebook(cells=[new_code_cell("K = 10", outputs=[
        nbformat.v4.new_output("stream", text="R@10 0.970 -> 0.98 (1986 questions)\n")])])
    assert stated_numbers(markdown) <= held_numbers(nb)
    assert "0.95" not in held_numbers(nb)


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_every_number_a_lesson_states_is_held_by_its_code_or_outputs(path):
    """Issue 35: a sentence that states a number is rendered from the variables or checked, so the number is in the
    notebook's code or committed outputs. The exercises are the learner's inputs, and are left out."""
    nb = nbformat.read(path, as_version=4)
    held = held_numbers(nb)
    unheld = {i: sorted(stated_numbers(cell.source) - held) for i, cell in enumerate(nb.cells)
              if cell.cell_type == "markdown" and not cell.source.startswith("## Exercises")}
    unheld = {i: numbers for i, numbers in unheld.items() if numbers}
    assert not unheld, f"{path.name}: markdown cells state numbers no code or output holds: {unheld}"


README = (Path(__file__).resolve().parents[1] / "notebooks" / "README.md").read_text()
#: A link to the shared glossary, from a lesson (`README.md#glossary`) or the cluster lesson (`../README.md#glossary`).
GLOSSARY_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./)?README\.md#glossary\)")


def your_time(stem: str) -> str:
    """The **Your time:** sentence of a lesson's opening, from its row of the workshop path in notebooks/README.md."""
    row = re.search(rf"^\| \d+ \| `(?:cluster/)?{stem}`.*\| (\d+) \+ (\d+) min \|$", README, flags=re.M)
    assert row, f"{stem}: no row with a learner's time in notebooks/README.md's workshop path"
    return f"**Your time:** about {row[1]} min reading and trying, {row[2]} min on the exercises."


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_each_lesson_has_your_time_try_it_prompts_takeaways_and_exercises(path):
    """Issue 35's scaffolding: the learner's time in the opening, as the workshop path gives it; one or two
    **Try it:** prompts in the lesson; **Key takeaways** after them and before the exercises, the last cell."""
    nb = nbformat.read(path, as_version=4)
    assert your_time(path.stem) in _opening(nb)
    markdown = [(i, cell.source) for i, cell in enumerate(nb.cells) if cell.cell_type == "markdown"]
    tries = [i for i, text in markdown for _ in re.finditer(r"\*\*Try it:\*\*", text)]
    takeaways = [i for i, text in markdown if text.startswith("## Key takeaways")]
    assert nb.cells[-1].source.startswith("## Exercises"), "the exercises are the last cell"
    assert 1 <= len(tries) <= 2, f"{len(tries)} **Try it:** prompts"
    assert len(takeaways) == 1 and max(tries) < takeaways[0], "one **Key takeaways** cell, after the prompts"


def singular(word: str, terms: set[str]) -> str:
    """A linked word as the glossary names it: `facts` links the term `fact`."""
    return word.removesuffix("s") if word not in terms and word.removesuffix("s") in terms else word


def test_the_glossary_is_linked_from_the_lessons():
    """Every term a lesson links to the glossary has its row there, and every row is linked from some lesson."""
    glossary = re.search(r"^## Glossary\n(.*?)^## ", README, flags=re.M | re.S)
    assert glossary, "notebooks/README.md has no ## Glossary section"
    terms = {row[1].strip("` ").lower() for row in re.finditer(r"^\| ([^|]+) \| [^|]+ \|$", glossary[1], flags=re.M)}
    terms.discard("term")
    linked = {singular(m[1].strip("`").lower(), terms): path.stem for path in ALL
              for m in GLOSSARY_LINK.finditer("".join(c.source for c in nbformat.read(path, as_version=4).cells
                                                      if c.cell_type == "markdown"))}
    assert not linked.keys() - terms, f"linked, not in the glossary: {sorted(linked.keys() - terms)}"
    assert not terms - linked.keys(), f"in the glossary, linked from no lesson: {sorted(terms - linked.keys())}"


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
             new_code_cell("slow", metadata={"tags": ["run-once"]}),
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


def test_the_committed_outputs_are_compared_as_nbval_compares_them():
    """A changed committed output is reported with the cell's first line; what sanitize.cfg masks (a duration)
    and the cells nbval does not check are not, nor the injected prefix; the injected cell and second runs are
    skipped."""
    committed = nbformat.v4.new_notebook(cells=[
        new_code_cell('INDEX_PREFIX = "nb-02"\nK = 5', metadata={"tags": ["parameters", "setup"]}, execution_count=1),
        new_code_cell("print(took)", execution_count=2, outputs=[
            nbformat.v4.new_output("stream", text="nb-02-semantic: 5 hits, took 12 ms\n")]),
        new_code_cell("table()", execution_count=3, outputs=[
            nbformat.v4.new_output("execute_result", {"text/plain": "r@10 0.912345", "text/html": "<b>0.912</b>"},
                                   execution_count=3)]),
        new_code_cell("cluster_info(es)", metadata={"tags": ["nbval-ignore-output"]}, execution_count=4,
                      outputs=[nbformat.v4.new_output("stream", text="3 nodes\n")]),
        new_code_cell("drop()", metadata={"tags": ["cleanup"]}, execution_count=5)])
    executed = each_cell_twice(copy.deepcopy(committed))
    executed.cells.insert(1, new_code_cell('INDEX_PREFIX = "nb-02-99ffee00"', metadata={"tags": [INJECTED]}))
    first, again = executed.cells[2:4]
    first.outputs = [nbformat.v4.new_output("stream", text="nb-02-99ffee00-semantic: 5 hits, "),
                     nbformat.v4.new_output("stream", text="took 9 ms\n")]
    again.outputs = [nbformat.v4.new_output("stream", text="anything\n")]
    executed.cells[6].outputs = [nbformat.v4.new_output("stream", text="1 node\n")]
    assert committed_differences(committed, executed) == []

    first.outputs = [nbformat.v4.new_output("stream", text="nb-02-99ffee00-semantic: 4 hits, took 9 ms\n")]
    [changed] = committed_differences(committed, executed)
    assert "cell 1 'print(took)': mismatch 'stdout'" in changed
    assert "nb-02-semantic: 5 hits, took <DURATION>" in changed and "nb-02-semantic: 4 hits" in changed
    first.outputs.append(nbformat.v4.new_output("stream", name="stderr", text="a warning\n"))
    assert "mismatch 'fields'" in committed_differences(committed, executed)[0], "nbval compares stderr too"
    first.outputs = copy.deepcopy(committed.cells[1].outputs)
    executed.cells[4].outputs = [nbformat.v4.new_output(
        "execute_result", {"text/plain": "r@10 0.912999", "text/html": "<b>0.913</b>"}, execution_count=9)]
    [changed] = committed_differences(committed, executed)
    assert "cell 2 'table()': mismatch 'text/html'" in changed, "floats keep three decimals, and HTML is compared"
    del executed.cells[4]
    with pytest.raises(AssertionError, match="not of the committed notebook's cells"):
        committed_differences(committed, executed)


@dataclass(frozen=True)
class Executed:
    """A notebook run of `test_notebook_runs`: the doubled copy under papermill, and its OUT_DIR."""

    result: RunResult
    outputs_dir: Path


_EXECUTED: dict[Path, Executed] = {}


def executed(path: Path, tmp_path_factory: pytest.TempPathFactory) -> Executed:
    """Run `path` (each lesson cell twice) on a fresh prefix, once per test session: test_eval reads 10's report."""
    if path not in _EXECUTED:
        work = tmp_path_factory.mktemp(path.stem)
        nbformat.write(each_cell_twice(nbformat.read(path, as_version=4)), work / path.name)
        result = run_notebook(work / path.name, work / "notebooks", outputs_dir=work, prefix=unique_prefix(path))
        _EXECUTED[path] = Executed(result, work)
    return _EXECUTED[path]


def asks_the_model(path: Path) -> bool:
    """Whether the notebook's parameters call a language model (`LLM` other than "offline")."""
    nb = nbformat.read(path, as_version=4)
    return any(parameter_values(cell).get("LLM", "offline") != "offline"
               for cell in nb.cells if "parameters" in tags(cell))


#: Notebooks whose report tests/test_eval.py reads (`executed`), and the fixture that reads it: each run shares that
#: fixture's worker under `pytest -n`.
REPORTED = {"10_evaluation": "persona_report", "11_locomo": "locomo_report"}


def worker_group(path: Path) -> str | None:
    """The `SHARED_WORKER` group that notebook `path` runs in, if any."""
    if path.stem in REPORTED:
        return SHARED_WORKER[REPORTED[path.stem]]
    return MODEL_GROUP if asks_the_model(path) else None


@pytest.mark.xdist_group(MODEL_GROUP)
def test_a_group_runs_on_one_worker(request):
    """Under `--dist loadgroup` pytest-xdist sends a group to one worker by suffixing its tests' node ids with the
    group's name. Without it 08 and 09 run twice (for test_eval, and here) and the model's tests interleave.
    pytest 9.2 with pytest-xdist 3.8 drops the suffix silently (pytest-xdist#1386): pyproject.toml pins pytest."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest -n --dist loadgroup")
    assert request.node.nodeid.endswith(f"@{MODEL_GROUP}"), f"{request.node.nodeid}: xdist_group not applied"


@pytest.mark.parametrize("path", [
    pytest.param(path, marks=[pytest.mark.xdist_group(group)] if (group := worker_group(path)) else [], id=path.stem)
    for path in NOTEBOOKS])
def test_notebook_runs(path, tmp_path_factory, es):
    """End to end on a fresh prefix, each lesson cell twice; nothing left behind; each cell's first run shows what
    the committed notebook shows (nbval's check), and its second run what the first showed."""
    run = executed(path, tmp_path_factory)
    assert run.result.ok, f"{path.name} failed: {run.result.error} (executed copy: {run.result.output})"
    assert run.result.output.is_file()
    leftovers = es.indices.get(index=f"{run.result.prefix}-*", allow_no_indices=True, expand_wildcards="all")
    assert not leftovers, f"{path.name} left indices behind: {sorted(leftovers)}"
    output = nbformat.read(run.result.output, as_version=4)
    differences = committed_differences(nbformat.read(path, as_version=4), output)
    assert not differences, (f"{path.name}: outputs differ from the committed ones (re-execute and commit it if "
                             "the change is meant):\n" + "\n\n".join(differences))
    differences = rerun_differences(output)
    assert not differences, "a cell printed something else when run again:\n" + "\n\n".join(differences)
