"""The expected-results file: every published number with its command, value and tolerance.

`results/expected.json` is the one place a reported number lives. `tests/test_eval.py`
asserts a fresh run against it (`compare`), `atlas eval ... --record` rewrites it from a
run (`record`), and the tables of `docs/evaluation.md` (`render_results_table`) and the README's
short summary (`render_summary`) are rendered from it, never typed by hand. A run on other data (another corpus
version, the full upstream LoCoMo file) is not comparable and is said to be so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from atlas import constants as C
from atlas.config import REPO_ROOT
from atlas.reporting import Table, table, truncate
from atlas.research.evaluate import MISSED_METRICS, REFERENCE_DESIGN, SESSION_METRICS
from atlas.research.locomo import ADVERSARIAL, CATEGORY_NAMES, MAIN_CATEGORIES, PAPER_REFERENCE, SESSION_REFERENCES

EXPECTED_PATH = REPO_ROOT / "results" / "expected.json"
DOC_PATH = REPO_ROOT / "docs" / "evaluation.md"
README_PATH = REPO_ROOT / "README.md"
LLM_DOC_PATH = REPO_ROOT / "docs" / "llm.md"
#: Every document whose results blocks are generated: `atlas eval tables --write` re-renders them all.
DOC_PATHS = (DOC_PATH, README_PATH, LLM_DOC_PATH)
#: Recorded tuning studies (`scripts/tuning_study.py --record`), each quoted by docs/evaluation.md.
STUDIES_DIR = REPO_ROOT / "results" / "studies"
#: The name of the README's block: one short table of the default mode on both data sets.
SUMMARY = "summary"
#: The generated blocks each document must hold: the full tables in docs/evaluation.md, the summary in the README,
#: the agent scenarios in docs/llm.md.
DOC_BLOCKS: dict[Path, tuple[str, ...]] = {DOC_PATH: ("persona", "locomo"), README_PATH: (SUMMARY,),
                                           LLM_DOC_PATH: ("agent", "agent-qwen")}
ABOUT = ("Expected results of every published evaluation number: per run, the command that reproduces it and, "
         "per number (a path into the run's report), its value and tolerance (null: shown, not checked). "
         "Checked by tests/test_eval.py; the tables of docs/evaluation.md are rendered from it "
         "(atlas.research.results.render_results_table). Rewrite a run only with `atlas eval <run> --record`.")
#: Smallest tolerance of a proportion; below it, a large group would flag HNSW noise.
MIN_TOLERANCE = 0.01
#: Scenarios' worth an agent pass rate may move: one, the model's greedy answers being the same on one machine
#: and an answer near a tie flipping on another.
TOLERANCE_SCENARIOS = 1
#: Questions' worth a mean may move: two fresh loads of the LoCoMo CI subset (bbq_hnsw) differed by one question
#: in a group (2026-12-02), and a noise of 3e-4 on every vector (notebooks/README.md, the check a fresh processor
#: stands for) moved a conversation's R@10 by 0.012, 2.4 questions' worth of 199 (2026-12-05).
TOLERANCE_QUESTIONS = 3


@dataclass(frozen=True)
class RunSpec:
    """A documented run: the command that reproduces it and what it evaluates."""

    name: str
    dataset: str
    command: str
    modes: tuple[C.RecallMode, ...] = C.RECALL_MODES
    #: LoCoMo: the first N conversations of the file (None: all).
    conversations: int | None = None
    #: Agent: the local model (`atlas.ops.llm_server.LOCAL_MODELS`) the run is made with (None: the configured one).
    model: str | None = None


RUNS: dict[str, RunSpec] = {spec.name: spec for spec in (
    RunSpec("persona", "persona", "atlas eval persona"),
    RunSpec("locomo", "locomo", "atlas eval locomo"),
    RunSpec("locomo-ci", "locomo", "atlas eval locomo --ci", ("bm25", "hybrid+rerank"), conversations=2),
    RunSpec("agent", "agent", "atlas eval agent", ()),
    RunSpec("agent-ci", "agent", "atlas eval agent --ci", ()),
    RunSpec("agent-qwen", "agent", "atlas eval agent --model qwen2.5-coder-0.5b", (),
            model="qwen2.5-coder-0.5b"),
)}


# --- which numbers are published --------------------------------------------------------------


def lookup(report: Mapping[str, Any], path: str) -> Any:
    """`by_mode.hybrid+rerank.r@10` -> report["by_mode"]["hybrid+rerank"]["r@10"] (a JSON value)."""
    node: Any = report
    for part in path.split("."):
        node = node[part]
    return node


def published_paths(report: Mapping) -> list[str]:
    """The numbers of a report that are recorded, checked and shown."""
    if report["dataset"] == "agent":
        return ["leaks", *(f"by_mode.{condition}.{check}.{m}" for condition, summary in report["by_mode"].items()
                           for check in ("pass", "state", "reply") if summary[check]["n"] for m in ("n", "rate")),
                *(f"by_mode.{condition}.by_kind.{kind}.{m}" for condition, summary in report["by_mode"].items()
                  for kind, rates in summary["by_kind"].items() if rates["n"] > 1 for m in ("n", "rate"))]
    paths = ["leaks"]
    for mode, summary in report["by_mode"].items():
        at = f"by_mode.{mode}"
        paths += [f"{at}.leaks", f"{at}.latency_ms.latency.p50", f"{at}.latency_ms.latency.p95"]
        if report["dataset"] == "persona":
            paths += [f"{at}.{m}" for m in ("r@1", "r@5", "r@10", "mrr")]
            paths += [f"{at}.by_type.{t}.{m}" for t in summary["by_type"] for m in ("r@5", "r@10", "mrr")]
            paths += [f"{at}.by_kind.{kind}.r@10" for kind in summary["by_kind"]]
        else:
            ks = report["ks"]
            paths += [f"{at}.main.{m}" for m in [f"r@{k}" for k in ks] + ["any@10", "all@10", "mrr"]]
            paths += [f"{at}.main.by_category.{c}.{m}" for c in summary["main"]["by_category"]
                      for m in ("r@10", "r@25")]
            paths += [f"{at}.sessions.{m}" for m in SESSION_METRICS]
            paths += [f"{at}.sessions.by_category.{c}.r@10" for c in summary["sessions"]["by_category"]]
            paths += [f"{at}.adversarial.{m}" for m in ("r@10", "r@25")]
            paths += [f"{at}.all.paper_r@{k}" for k in ks]
            paths += [f"{at}.all.by_category.{c}.paper_r@10" for c in summary["all"]["by_category"]]
            paths += [f"{at}.all.by_conversation.{c}.paper_r@10" for c in summary["all"]["by_conversation"]]
    if "missed" in report:
        groups = ["missed", *(f"missed.by_category.{c}" for c in report["missed"]["by_category"])]
        paths += [f"{at}.{m}" for at in groups for m in ("n", *MISSED_METRICS)]
    return paths


def _group_size(report: Mapping, path: str) -> int:
    """Questions behind a mean: the `n` next to it."""
    return int(lookup(report, path.rsplit(".", 1)[0] + ".n"))


def entry(report: Mapping, path: str) -> dict:
    """{"value", "tolerance", ["ci"]}: a count is exact, a latency is not checked (machine-dependent),
    a mean may move by `TOLERANCE_QUESTIONS` questions' worth (at least `MIN_TOLERANCE`)."""
    value = lookup(report, path)
    if "latency_ms" in path:
        return {"value": round(float(value)), "tolerance": None}
    if path.endswith("leaks"):
        return {"value": int(value), "tolerance": 0}
    if path.endswith(".n"):
        return {"value": int(value), "tolerance": max(1, round(MIN_TOLERANCE * int(value)))}
    moves = TOLERANCE_SCENARIOS if report["dataset"] == "agent" else TOLERANCE_QUESTIONS
    tolerance = max(MIN_TOLERANCE, moves / _group_size(report, path))
    ci = lookup(report, path + "_ci")
    return {"value": round(float(value), 4), "tolerance": round(tolerance, 4),
            "ci": [round(x, 4) for x in ci]}


# --- the file ---------------------------------------------------------------------------------------


def load_expected(path: Path = EXPECTED_PATH) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def record(spec: RunSpec, report: Mapping, path: Path = EXPECTED_PATH) -> dict:
    """Replace the run's recorded numbers with this report's; the other runs stay as they are."""
    data: dict[str, Any] = load_expected(path) if Path(path).exists() else {"about": ABOUT, "runs": {}}
    data["runs"][spec.name] = {
        "command": spec.command, "dataset": spec.dataset, "recorded": date.today().isoformat(),
        "questions": report["questions"], "conversations": report.get("conversations"),
        "data_sha256": report["data_sha256"], "setup": report["setup"], "seconds": round(report["seconds"]),
        "numbers": {p: entry(report, p) for p in published_paths(report)},
    }
    data["runs"] = {name: data["runs"][name] for name in RUNS if name in data["runs"]}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(dump_expected(data), encoding="utf-8")
    return data["runs"][spec.name]


def dump_expected(data: Mapping) -> str:
    """Indented JSON with one line per number, so that a re-recording reads as a short diff."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    # Collapse each {"value": ..., "tolerance": ..., "ci": [...]} object onto its key's line.
    return re.sub(r'\{\s*"value"[^{}]*?\}', lambda m: json.dumps(json.loads(m.group(0))), text) + "\n"


def matching_run(report: Mapping, expected: Mapping | None = None) -> RunSpec | None:
    """The documented run made on the same data as `report` (same fingerprint), if any."""
    runs = (expected or load_expected())["runs"]
    return next((RUNS[name] for name, run in runs.items() if run["data_sha256"] == report["data_sha256"]), None)


def compare(spec: RunSpec, report: Mapping, expected: Mapping | None = None) -> list[str]:
    """Every recorded number the report misses by more than its tolerance, described; [] when all hold.

    Raises `ValueError` when the report is not comparable (other data), so that a caller
    never mistakes "not checked" for "passed".
    """
    run = (expected or load_expected())["runs"][spec.name]
    if run["data_sha256"] != report["data_sha256"]:
        raise ValueError(f"{spec.name}: the report was made on other data than the recorded run "
                         f"({report['data_sha256'][:12]} vs {run['data_sha256'][:12]}); not comparable")
    problems = []
    for path, want in run["numbers"].items():
        if want["tolerance"] is None:
            continue
        try:
            got = float(lookup(report, path))
        except KeyError:
            problems.append(f"{path}: missing from the report (expected {want['value']})")
            continue
        if abs(got - want["value"]) > want["tolerance"]:
            problems.append(f"{path}: {got:.4f}, expected {want['value']} ± {want['tolerance']}")
    return problems


# --- tables ---------------------------------------------------------------------------------------------


def _value(numbers: Mapping, path: str, *, ci: bool = False) -> str | None:
    """A recorded number as shown: 3 decimals, `[lo, hi]` when asked, empty when not recorded."""
    item = numbers.get(path)
    if item is None:
        return None
    if isinstance(item["value"], int):
        return str(item["value"])
    text = f"{item['value']:.3f}"
    return text + (f" [{item['ci'][0]:.3f}, {item['ci'][1]:.3f}]" if ci and "ci" in item else "")


def _table(rows: list[dict], title: str) -> Table:
    """A table whose columns after the first are numbers (right-aligned)."""
    return table(rows, title=title, numeric=list(rows[0])[1:])


def _modes(numbers: Mapping) -> list[str]:
    found = {path.split(".")[1] for path in numbers if path.startswith("by_mode.")}
    return [mode for mode in C.RECALL_MODES if mode in found]


def _groups(numbers: Mapping, marker: str) -> list[str]:
    """Group names under `...<marker>.<group>.`, in first-recorded order."""
    pattern = re.compile(rf"\.{re.escape(marker)}\.([^.]+)\.")
    return list(dict.fromkeys(m.group(1) for path in numbers if (m := pattern.search(path))))


def _persona_tables(run: Mapping) -> dict[str, Table]:
    numbers = run["numbers"]
    modes = _modes(numbers)
    columns = {"r@1": "R@1", "r@5": "R@5", "r@10": "R@10", "mrr": "MRR"}
    overall = [{"mode": mode, **{label: _value(numbers, f"by_mode.{mode}.{m}", ci=m == "r@10")
                                 for m, label in columns.items()}} for mode in modes]
    overall.append({"mode": "reference design (published)", "R@10": f"{REFERENCE_DESIGN['r@10']:.2f}"})
    types = _groups(numbers, "by_type")
    by_type = [{"memory type": t, **{mode: _value(numbers, f"by_mode.{mode}.by_type.{t}.r@10") for mode in modes},
                "reference design": _reference(t)} for t in types]
    kinds = _groups(numbers, "by_kind")
    by_kind = [{"question kind": k, **{mode: _value(numbers, f"by_mode.{mode}.by_kind.{k}.r@10") for mode in modes}}
               for k in kinds]
    costs = [{"mode": mode, "p50 ms": _value(numbers, f"by_mode.{mode}.latency_ms.latency.p50"),
              "p95 ms": _value(numbers, f"by_mode.{mode}.latency_ms.latency.p95"),
              "leaks": _value(numbers, f"by_mode.{mode}.leaks")} for mode in modes]
    return {"modes": _table(overall, f"Persona set, all {run['questions']} questions (R@10 with its bootstrap 95% CI)"),
            "types": _table(by_type, "R@10 per memory type of the answer"),
            "kinds": _table(by_kind, "R@10 per question kind"),
            "costs": _table(costs, "Recall latency (this machine; not checked) and leaks")}


def _reference(memory_type: str) -> str:
    value = REFERENCE_DESIGN["r@10_by_type"].get(memory_type)
    return "" if value is None else f"~{value:.2f}"


def _locomo_tables(run: Mapping) -> dict[str, Table]:
    numbers = run["numbers"]
    modes = _modes(numbers)
    ks = sorted({int(m.group(1)) for p in numbers if (m := re.search(r"\.main\.r@(\d+)$", p))})
    main = [{"mode": mode, **{f"R@{k}": _value(numbers, f"by_mode.{mode}.main.r@{k}", ci=k == 10) for k in ks},
             "any@10": _value(numbers, f"by_mode.{mode}.main.any@10"),
             "all@10": _value(numbers, f"by_mode.{mode}.main.all@10"),
             "MRR": _value(numbers, f"by_mode.{mode}.main.mrr")}
            for mode in modes]
    names = [CATEGORY_NAMES[c] for c in MAIN_CATEGORIES]
    categories = [{"category": c, **{mode: _value(numbers, f"by_mode.{mode}.main.by_category.{c}.r@10", ci=True)
                                     for mode in modes}} for c in names]
    categories.append({"category": "adversarial (apart)",
                       **{mode: _value(numbers, f"by_mode.{mode}.adversarial.r@10", ci=True) for mode in modes}})
    session_labels = {"hit@1": "Hit@1", "r@5": "R@5", "r@10": "R@10", "ndcg@5": "NDCG@5"}
    sessions = [{"mode": mode, **{f"turns {label}": _value(numbers, f"by_mode.{mode}.main.{m}")
                                  for m, label in session_labels.items() if m in ("r@5", "r@10")},
                 **{f"sessions {label}": _value(numbers, f"by_mode.{mode}.sessions.{m}", ci=m == "r@10")
                    for m, label in session_labels.items()}} for mode in modes]
    sessions += [{"mode": system, **{f"sessions {label}": f"{published[m]:.3f}" for m, label in session_labels.items()
                                     if m in published}} for system, published in SESSION_REFERENCES.items()]
    session_cats = [{"category": c, **{mode: _value(numbers, f"by_mode.{mode}.sessions.by_category.{c}.r@10", ci=True)
                                       for mode in modes}} for c in names]
    paper_ks = [k for k in ks if f"r@{k}" in PAPER_REFERENCE]
    paper = [{"mode": mode, **{f"R@{k}": _value(numbers, f"by_mode.{mode}.all.paper_r@{k}") for k in paper_ks}}
             for mode in modes]
    paper.append({"mode": "paper (DRAGON, turns)", **{f"R@{k}": f"{PAPER_REFERENCE[f'r@{k}']:.3f}" for k in paper_ks}})
    paper_cats = [{"category": c, **{mode: _value(numbers, f"by_mode.{mode}.all.by_category.{c}.paper_r@10")
                                     for mode in modes}, "paper": f"{PAPER_REFERENCE['r@10_by_category'][c]:.3f}"}
                  for c in [*names, CATEGORY_NAMES[ADVERSARIAL]]
                  if f"by_mode.{modes[0]}.all.by_category.{c}.paper_r@10" in numbers]
    conversations = _groups(numbers, "all.by_conversation")
    paper_convs = [{"conversation": c, **{mode: _value(numbers, f"by_mode.{mode}.all.by_conversation.{c}.paper_r@10")
                                          for mode in modes}} for c in conversations]
    missed = [{"category": c, "missed turns": _value(numbers, f"{at}.n"),
               **{f"in {m}": _value(numbers, f"{at}.{m}", ci=m == "either@50") for m in MISSED_METRICS}}
              for c, at in [("all", "missed"), *((c, f"missed.by_category.{c}") for c in names)]
              if f"{at}.n" in numbers]
    costs = [{"mode": mode, "p50 ms": _value(numbers, f"by_mode.{mode}.latency_ms.latency.p50"),
              "p95 ms": _value(numbers, f"by_mode.{mode}.latency_ms.latency.p95"),
              "leaks": _value(numbers, f"by_mode.{mode}.leaks")} for mode in modes]
    return {"main": _table(main, f"{run['conversations']} conversations, {run['questions']} questions. Main set "
                                 "(categories 1-4, questions with evidence): recall of the evidence turns "
                                 "(R@10 with its bootstrap 95% CI)"),
            "categories": _table(categories, "R@10 per category"),
            **({"sessions": _table(sessions, "Main set at the level of turns and of sessions (a session ranks where "
                                             "its first turn does; gold sessions hold the evidence; session R@10 with "
                                             "its bootstrap 95% CI)"),
                "session_categories": _table(session_cats, "Session R@10 per category")}
               if f"by_mode.{modes[0]}.sessions.r@10" in numbers else {}),
            "paper": _table(paper, "All questions, scored as the paper does (no evidence = 1, unresolvable "
                                   "reference = miss)"),
            "paper_categories": _table(paper_cats, "All questions, R@10 per category, beside the paper's"),
            **({"paper_conversations": _table(paper_convs, "All questions, R@10 per conversation (the paper's "
                                                          f"{PAPER_REFERENCE['r@10']:.3f} is over all 10)")}
               if paper_convs else {}),
            **({"missed": _table(missed, f"Evidence turns (main set) that {C.DEFAULT_RECALL_MODE} misses at 10: the "
                                         "share each single path (bm25, dense) ranks in its top 10 or 50")}
               if missed else {}),
            "costs": _table(costs, "Recall latency (this machine; not checked) and leaks")}


def as_run(report: Mapping) -> dict:
    """A fresh report in the recorded form, so that a notebook shows it with the same tables as the docs."""
    return {"dataset": report["dataset"], "questions": report["questions"],
            "conversations": report.get("conversations"),
            "numbers": {path: entry(report, path) for path in published_paths(report)}}


def _agent_tables(run: Mapping) -> dict[str, Table]:
    numbers = run["numbers"]
    conditions = list(dict.fromkeys(p.split(".")[1] for p in numbers if p.startswith("by_mode.")))
    checks = [("all checks", "pass"), ("stored state", "state"), ("last reply", "reply")]
    kinds = list(dict.fromkeys(p.split(".")[3] for p in numbers if ".by_kind." in p))
    rows = [{"scenarios": label, **{c: _value(numbers, f"by_mode.{c}.{check}.rate") or "" for c in conditions}}
            for label, check in checks]
    rows += [{"scenarios": f"kind: {kind}", **{c: _value(numbers, f"by_mode.{c}.by_kind.{kind}.rate") or ""
                                                for c in conditions}} for kind in kinds]
    return {"agent": _table(rows, f"Scenarios passed ({run['questions']} scenarios; leaks "
                                  f"{numbers['leaks']['value']}), with memory and without")}


def results_tables(run: Mapping) -> dict[str, Table]:
    """The tables of a recorded run (`load_expected()["runs"][name]`) or of `as_run(report)`, by name."""
    tables = {"persona": _persona_tables, "agent": _agent_tables}
    return tables.get(run["dataset"], _locomo_tables)(run)


def misses_table(report: Mapping, mode: str = C.DEFAULT_RECALL_MODE, width: int = 70) -> Table:
    """The persona questions a mode missed at 10: what was expected and what came first instead."""
    rows = [{"qid": m["qid"], "kind": f"{m['type']}/{m['kind']}", "question": truncate(m["question"], width),
             "expected": truncate(m["expected"][0]["text"], width),
             "first instead": truncate(f"{m['first']['key']}: {m['first']['text']}", width) if m["first"] else ""}
            for m in report["by_mode"][mode]["misses"]]
    return table(rows, title=f"{mode}: {len(rows)} questions whose answer is not in the top 10")


def render_results_table(run: str, expected: Mapping | None = None) -> str:
    """The Markdown tables of one recorded run (`persona`, `locomo`, `agent`, ...), with how to reproduce them;
    `summary` gives the README's short table (`render_summary`).

    Rendered from `results/expected.json` only, so a table can never show a number the
    tests do not check (latencies are shown and marked as not checked).
    """
    if run == SUMMARY:
        return render_summary(expected)
    recorded = (expected or load_expected())["runs"][run]
    tables = [t.to_markdown() for t in results_tables(recorded).values()]
    setup = recorded["setup"]
    head = (f"Reproduce with `{recorded['command']}` (recorded {recorded['recorded']}, {recorded['seconds']} s "
            f"with warm caches; first stage {setup['embedder']}, second stage {setup['second_stage']}, "
            f"Elasticsearch {setup['elasticsearch']}, reads through {setup['reads']}"
            + (f"; language model {setup['model']} at {setup['endpoint']}" if "model" in setup else "") + ").")
    return "\n\n".join([head, *tables])


def render_summary(expected: Mapping | None = None, mode: str = C.DEFAULT_RECALL_MODE) -> str:
    """The README's results: one row per data set for the default mode, with where the full tables are."""
    runs = (expected or load_expected())["runs"]
    persona, locomo = runs["persona"]["numbers"], runs["locomo"]["numbers"]
    rows = [{"data set": f"persona ({runs['persona']['questions']} questions)",
             "R@5": _value(persona, f"by_mode.{mode}.r@5"), "R@10": _value(persona, f"by_mode.{mode}.r@10", ci=True),
             "MRR": _value(persona, f"by_mode.{mode}.mrr"), "leaks": _value(persona, "leaks")},
            {"data set": f"LoCoMo ({runs['locomo']['conversations']} conversations; evidence turns, categories 1-4)",
             "R@5": _value(locomo, f"by_mode.{mode}.main.r@5"),
             "R@10": _value(locomo, f"by_mode.{mode}.main.r@10", ci=True),
             "MRR": _value(locomo, f"by_mode.{mode}.main.mrr"), "leaks": _value(locomo, "leaks")}]
    title = f"Default mode ({mode}), R@10 with its bootstrap 95% CI; leaks over every recall of every mode"
    dates = ", ".join(f"{name} {runs[name]['recorded']}" for name in ("persona", "locomo"))
    return "\n\n".join([
        _table(rows, title).to_markdown(),
        f"Recorded {dates}. Full tables, protocol and caveats: [docs/evaluation.md](docs/evaluation.md). "
        f"Reproduce with `{runs['persona']['command']}` and `{runs['locomo']['command']}`."])


# --- generated blocks in Markdown files -----------------------------------------------------------------

BLOCK = re.compile(r"(?P<open><!-- results:(?P<run>[a-z0-9-]+) -->).*?(?P<close><!-- /results -->)", re.S)


def render_blocks(text: str, expected: Mapping | None = None) -> str:
    """`text` with every `<!-- results:RUN -->...<!-- /results -->` block re-rendered from the expected file."""
    expected = expected or load_expected()
    return BLOCK.sub(lambda m: f"{m['open']}\n{render_results_table(m['run'], expected)}\n{m['close']}", text)


def update_markdown(paths: Sequence[Path] = DOC_PATHS) -> list[Path]:
    """Re-render the generated blocks of each file; returns the files that changed."""
    changed = []
    for path in paths:
        old = Path(path).read_text(encoding="utf-8")
        new = render_blocks(old)
        if new != old:
            Path(path).write_text(new, encoding="utf-8")
            changed.append(Path(path))
    return changed


# --- documented runs -----------------------------------------------------------------------------------


def reproduce(spec: RunSpec, *, prefix: str | None = None, path: Path | None = None, fresh: bool = False,
              out_dir: Path | None = None, progress: bool = True) -> dict:
    """Run a documented evaluation on its own prefix (`eval-<name>`); write `<out_dir>/eval/<name>.json` and its figure.

    The prefix is kept, so a rerun skips indexing; `fresh` drops it first.
    """
    from atlas.config import load_settings
    from atlas.core.schemas import drop_indices
    from atlas.research.datasets import PERSONA_DIR, PERSONA_NOW
    from atlas.research.evaluate import evaluate_locomo, evaluate_persona, mode_figure, report_figure, write_report
    from atlas.research.locomo import load_conversations
    from atlas.security.connection import connect
    from atlas.stack import open_store

    out_dir = Path(out_dir) if out_dir is not None else load_settings().outputs_dir
    name = prefix or f"eval-{spec.name}"
    if fresh:
        drop_indices(connect(), name)
    store = open_store(name, now=lambda: PERSONA_NOW) if spec.dataset == "persona" else open_store(name)
    if spec.dataset == "agent":
        from atlas.research.agent_eval import evaluate_agent

        if spec.model is not None:
            from atlas.ops import llm_server

            store.settings = replace(store.settings, llm_model=spec.model)
            llm_server.up(store.settings, name=spec.model)

        report = {"run": spec.name, "command": spec.command} | evaluate_agent(
            store, ci=spec.name.endswith("-ci"), progress=progress)
        write_report(report, out_dir / "eval", spec.name)
        return report
    if spec.dataset == "persona":
        report = evaluate_persona(store, modes=spec.modes, path=path or PERSONA_DIR, progress=progress)
    else:
        conversations = load_conversations(path)[:spec.conversations]
        report = evaluate_locomo(store, conversations, modes=spec.modes, progress=progress)
    report = {"run": spec.name, "command": spec.command} | report
    write_report(report, out_dir / "eval", spec.name)
    report_figure(report, out_dir)
    mode_figure(report, out_dir)
    return report


def headline(report: Mapping) -> str:
    """A few lines per mode for a terminal: the main numbers, latency and leaks."""
    lines = [f"{report['run']}: {report['questions']} questions, {report['seconds']:.0f} s, reads through "
             f"{report['setup']['reads']}"]
    if report["dataset"] == "agent":
        return "\n".join([*lines, *(f"  {condition:10} " + "  ".join(
            f"{check} {summary[check]['rate']:.3f}" for check in ("pass", "state", "reply") if summary[check]["n"])
            for condition, summary in report["by_mode"].items()), f"  leaks {report['leaks']}"])
    for mode, summary in report["by_mode"].items():
        stats = summary if report["dataset"] == "persona" else summary["main"]
        shown = "  ".join(f"{m} {stats[m]:.3f}" for m in ("r@1", "r@5", "r@10", "r@25", "r@50", "mrr") if m in stats)
        latency = summary["latency_ms"]["latency"]
        lines.append(f"  {mode:14} {shown}  p50 {latency['p50']:.0f} ms  p95 {latency['p95']:.0f} ms  "
                     f"leaks {summary['leaks']}")
    return "\n".join(lines)


def study_table(study: Mapping) -> Table:
    """A recorded tuning study as docs/evaluation.md quotes it: per set and mode, each arm's R@5 / R@10 in per cent
    and, beside every arm but the first, the share of questions whose top 10 is the first arm's."""
    arms = list(dict.fromkeys(row["arm"] for row in study["summary"]))
    rows = []
    for dataset, mode in dict.fromkeys((row["dataset"], row["mode"]) for row in study["summary"]):
        cells = {row["arm"]: row for row in study["summary"] if (row["dataset"], row["mode"]) == (dataset, mode)}
        rows.append({"set": f"{dataset} ({cells[arms[0]]['n']})", "mode": f"`{mode}`",
                     **{arm: f"{100 * cell['r@5']:.1f} / {100 * cell['r@10']:.1f}"
                        + ("" if arm == arms[0] else f" ({cell['same top 10']:.0%})") for arm, cell in cells.items()}})
    return table(rows, title=f"R@5 / R@10 (%), {study['conversations']} LoCoMo conversations")
