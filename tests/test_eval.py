"""Evaluation (issue 6): loaders, scoring, the persona gate, and both runs against results/expected.json.

The persona run is the full documented run (all 335 questions, every mode). The LoCoMo run is the documented CI
subset (`atlas eval locomo --ci`: the first two conversations); the full run is `make eval`. Each runs once per test
session: when notebook 10's (or 11's) run is in the session (tests/test_notebooks.py), the checks here read the report
it wrote (the same evaluation on the same data, seed and date); else they run it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion
from typer.testing import CliRunner

from atlas import constants as C
from atlas.cli import app
from atlas.core.errors import AtlasError
from atlas.core.fusion import rrf_fuse
from atlas.core.memory import bulk_load, write_episode
from atlas.core.recall import Tuning, recall
from atlas.core.schemas import all_indices
from atlas.core.store import Store
from atlas.research import results
from atlas.research.datasets import (
    PERSONA_NOW,
    load_persona,
    loaded_id,
    persona_document,
    persona_documents,
    persona_links,
    read_persona_corpus,
    read_persona_questions,
    stored_state,
)
from atlas.research.evaluate import (
    PERSONA_GATE,
    SESSION_METRICS,
    EvalQuestion,
    evaluate_locomo,
    evaluate_persona,
    missed_evidence,
    score,
    session_scores,
)
from atlas.research.fusion_study import Candidate, Captured, capture, cross_validate, replay
from atlas.research.locomo import PAPER_REFERENCE, SESSION_REFERENCES, default_path, load_conversations
from atlas.research.session_study import found_by_pass, paired
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix
from tests.test_notebooks import NOTEBOOKS, REPORTED, executed

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def eval_store(es, home: Path, tag: str, **options) -> Iterator[Store]:
    """A fresh prefix whose user keys live in `home`; keys revoked and indices dropped afterwards."""
    store = open_store(make_prefix(tag), es=es, **options)
    store.settings = replace(store.settings, home=home)
    yield store
    store.drop()


@pytest.fixture(scope="module")
def persona_store(es, tmp_path_factory) -> Iterator[Store]:
    """The persona corpus loaded on a fresh prefix."""
    with eval_store(es, tmp_path_factory.mktemp("home"), "eval-persona", now=lambda: PERSONA_NOW) as store:
        load_persona(store, progress=False)
        yield store


def notebook_report(request: pytest.FixtureRequest, tmp_path_factory, stem: str, name: str) -> dict | None:
    """The report `name` that notebook `stem` (one of `REPORTED`) wrote when its `test_notebook_runs` is in this
    session (the notebook runs once, for whichever test asks first); None when it is not, or failed before writing
    it (its test says why)."""
    assert stem in REPORTED, f"{stem} is not in tests.test_notebooks.REPORTED: under pytest -n it may run elsewhere"
    # By name: pytest-xdist appends its group to a node id.
    if not any(item.name == f"test_notebook_runs[{stem}]" for item in request.session.items):
        return None
    [notebook] = [path for path in NOTEBOOKS if path.stem == stem]
    report = executed(notebook, tmp_path_factory).outputs_dir / "eval" / f"{name}.json"
    return json.loads(report.read_text()) if report.is_file() else None


@pytest.fixture(scope="module")
def persona_report(request, tmp_path_factory) -> dict:
    """The report of notebook 10's run (the same `evaluate_persona` on the same data, seed and date) when it is in
    this session, else of `evaluate_persona` here."""
    if (report := notebook_report(request, tmp_path_factory, "10_evaluation", "persona")) is not None:
        return report
    return evaluate_persona(request.getfixturevalue("persona_store"), progress=False)


@pytest.fixture(scope="module")
def locomo_report(request, es, tmp_path_factory) -> Iterator[dict]:
    """The CI subset's report: notebook 11's when it is in this session (the same loader and `evaluate_locomo` on
    the same two conversations, every mode), else `atlas eval locomo --ci`'s evaluation here."""
    spec = results.RUNS["locomo-ci"]
    if not default_path().is_file():
        pytest.skip(f"LoCoMo data not found at {default_path()} (CC BY-NC, never in the repo)")
    if (report := notebook_report(request, tmp_path_factory, "11_locomo", "locomo-notebook")) is not None:
        yield report
        return
    conversations = load_conversations()[:spec.conversations]
    with eval_store(es, tmp_path_factory.mktemp("home"), "eval-locomo") as store:
        yield evaluate_locomo(store, conversations, modes=spec.modes, progress=False)


# --- scoring, without a cluster --------------------------------------------------------------


def question(relevant: tuple[str, ...], unresolved: int = 0) -> EvalQuestion:
    return EvalQuestion("q1", "sarah", "where is the hub?", relevant, "semantic", PERSONA_NOW, unresolved=unresolved)


def test_score_by_hand():
    got = score(question(("a", "b")), ["x", "a", "y", "z", "b"], (1, 2, 5))
    assert got["r@1"] == 0.0 and got["r@2"] == 0.5 and got["r@5"] == 1.0
    assert got["any@2"] == 1.0 and got["all@2"] == 0.0 and got["all@5"] == 1.0
    assert got["mrr"] == 0.5 and got["paper_r@2"] == got["r@2"]


def test_paper_scoring_of_missing_and_unresolvable_evidence():
    assert score(question(()), ["a"], (5,)) == {"paper_r@5": 1.0}
    got = score(question(("a",), unresolved=1), ["a"], (5,))
    assert got["r@5"] == 1.0 and got["paper_r@5"] == 0.5


def test_session_scores_rank_sessions_by_their_first_turn():
    """Gold sessions D1 and D3; the turns rank sessions D2, D1, D3, D4."""
    asked = question(("c:D1:1", "c:D3:2", "c:D3:4"))
    got = session_scores(asked, ["c:D2:1", "c:D1:5", "c:D2:3", "c:D3:9", "c:D4:1"])
    assert set(got) == set(SESSION_METRICS)
    assert got["hit@1"] == 0.0 and got["r@5"] == 1.0 and got["r@10"] == 1.0
    assert 0.0 < got["ndcg@5"] < 1.0
    assert session_scores(asked, ["c:D3:1", "c:D1:2", "c:D2:1"])["ndcg@5"] == 1.0
    assert session_scores(asked, ["c:D2:1"] * 3 + ["c:D4:1"]) == {"hit@1": 0.0, "r@5": 0.0, "r@10": 0.0, "ndcg@5": 0.0}


def test_missed_evidence_says_which_path_ranked_it():
    """b is in bm25's top 10, c only in dense's top 50, d in neither; adversarial questions do not count."""
    asked = [replace(question(("a", "b", "c")), qid="q1", group="multi-hop"),
             replace(question(("d",)), qid="q2", group="single-hop"),
             replace(question(("e",)), qid="q3", group="adversarial")]
    filler = [f"x{i}" for i in range(60)]
    rankings = {C.DEFAULT_RECALL_MODE: {"q1": ["a", *filler], "q2": filler, "q3": filler},
                "bm25": {"q1": ["b", *filler], "q2": filler, "q3": ["e"]},
                "dense": {"q1": [*filler[:30], "c"], "q2": filler, "q3": filler}}
    rows = [{"mode": mode, "qid": qid, "ranked": ranked} for mode, by_qid in rankings.items()
            for qid, ranked in by_qid.items()]
    got = missed_evidence(rows, asked)
    assert got == [
        {"group": "multi-hop", "bm25@10": True, "dense@10": False, "either@10": True, "either@50": True},
        {"group": "multi-hop", "bm25@10": False, "dense@10": False, "either@10": False, "either@50": True},
        {"group": "single-hop", "bm25@10": False, "dense@10": False, "either@10": False, "either@50": False}]
    assert missed_evidence([r for r in rows if r["mode"] != "dense"], asked) == []


# --- loaders -------------------------------------------------------------------------------------


def test_persona_documents_keep_the_data():
    corpus = {doc["key"]: doc for doc in read_persona_corpus()}
    episode = persona_document(corpus["sarah-ep-001"])
    assert episode["created_at"] == episode["timestamp"] == "2024-03-09T10:14:00.000Z"
    assert episode["source_key"] == "sarah-ep-001" and episode["session_id"] == "sarah-s001"
    fact = persona_document(corpus["sarah-fact-003"])
    assert (fact["use_count"], fact["confidence"], fact["last_used_at"]) == (4, 0.92, "2026-10-26T08:15:00.000Z")
    assert "supersedes_keys" not in fact and fact["contradiction"] == "natural"
    unused = next(doc for doc in corpus.values() if doc["memory_type"] == "semantic" and "last_used_at" not in doc)
    built = persona_document(unused)
    assert built["last_used_at"] == built["created_at"]
    playbook = persona_document(corpus["sarah-pb-001"])
    assert playbook["success_rate"] == pytest.approx(0.75) and len(playbook["steps"]) == 7
    catalog = persona_document(corpus["cat-0001"])
    assert "user_id" not in catalog and catalog["tags"] and catalog["title"] == "Lumio Hub v1"


def test_an_episode_carries_the_previous_turns_of_its_session():
    corpus = read_persona_corpus()
    by_key = {doc["source_key"]: doc for doc in persona_documents(corpus)}
    first, second = by_key["sarah-ep-031"], by_key["sarah-ep-032"]
    assert "context" not in first and second["context"] == [first["text"]]
    assert by_key["sarah-ep-034"]["context"] == [by_key[f"sarah-ep-03{i}"]["text"] for i in (2, 3)]
    assert all("context" not in doc for doc in by_key.values() if doc["memory_type"] != "episodic")


def test_persona_links_both_ways():
    corpus = read_persona_corpus()
    ids = {doc["key"]: f"id-{doc['key']}" for doc in corpus}
    links = persona_links(corpus, ids)
    assert links["sarah-fact-003"]["supersedes"] == ["id-sarah-fact-002"]
    assert links["sarah-fact-002"]["superseded_by"] == "id-sarah-fact-003"
    assert links["sarah-fact-002"]["superseded_at"] == "2026-03-14T09:40:00.000Z"
    assert links["sarah-fact-002"]["valid_to"] == "2026-03-01T00:00:00.000Z", "until its successor began to hold, " \
        "which its text says (\"... in March 2026\"), before it was written"
    assert links["sarah-fact-003"]["supporting_episode_ids"] == ["id-sarah-ep-033"]
    assert sum("superseded_by" in link for link in links.values()) == 14


def test_loaded_corpus_is_linked_and_loading_is_idempotent(persona_store):
    held = stored_state(persona_store, [doc["key"] for doc in read_persona_corpus()])
    assert len(held) == 393
    assert sorted(key for key, doc in held.items() if doc.get("superseded_by")) == sorted(
        key for doc in read_persona_corpus() for key in doc.get("supersedes_keys", []))
    assert held["sarah-fact-003"]["supersedes"] == ["sarah-fact-002"]
    assert held["sarah-fact-002"]["superseded_by"] == "sarah-fact-003"
    ids = load_persona(persona_store, progress=False)
    assert ids == {key: doc["id"] for key, doc in held.items()}
    assert persona_store.es.count(index=",".join(all_indices(persona_store.prefix)))["count"] == 393
    assert ids["sarah-fact-003"] == loaded_id(persona_store.prefix, "sarah-fact-003")
    stats = persona_store.es.indices.stats(index=",".join(all_indices(persona_store.prefix)), metric="docs")
    assert stats["_all"]["primaries"]["docs"]["deleted"] == 0, "the linking pass's old copies would skew BM25"


def test_partly_loaded_prefix_is_refused(store):
    bulk_load(store, [persona_document(doc) for doc in read_persona_corpus()[:3]], progress=False)
    with pytest.raises(AtlasError, match="holds 3 of the 393"):
        load_persona(store, progress=False)


# --- the persona run -------------------------------------------------------------------------------


def test_persona_gate(persona_report):
    default = persona_report["by_mode"][C.DEFAULT_RECALL_MODE]
    assert default["r@10"] >= PERSONA_GATE["r@10"], default["r@10"]
    assert default["r@5"] >= PERSONA_GATE["r@5"], default["r@5"]
    assert persona_report["leaks"] == 0
    assert persona_report["setup"]["reads"] == "per-user DLS keys + code filter"
    assert all(mode["fallbacks"] == 0 for mode in persona_report["by_mode"].values())


def test_persona_matches_expected(persona_report):
    assert results.compare(results.RUNS["persona"], persona_report) == []


def test_misses_name_what_came_first(persona_report):
    default = persona_report["by_mode"][C.DEFAULT_RECALL_MODE]
    shortfall = sum(1 - miss["r@10"] for miss in default["misses"])
    assert shortfall == pytest.approx((1 - default["r@10"]) * persona_report["questions"])
    for miss in default["misses"]:
        assert miss["question"] and miss["expected"][0]["text"]
        assert miss["first"]["key"] not in {e["key"] for e in miss["expected"]}


def test_a_changed_metric_fails_the_comparison(persona_report):
    expected = copy.deepcopy(results.load_expected())
    item = expected["runs"]["persona"]["numbers"][f"by_mode.{C.DEFAULT_RECALL_MODE}.r@10"]
    item["value"] = round(item["value"] - 2 * item["tolerance"], 4)
    [problem] = results.compare(results.RUNS["persona"], persona_report, expected)
    assert problem.startswith(f"by_mode.{C.DEFAULT_RECALL_MODE}.r@10")


def test_other_data_is_not_compared(persona_report):
    with pytest.raises(ValueError, match="not comparable"):
        results.compare(results.RUNS["persona"], {**persona_report, "data_sha256": "0" * 64})


# --- the LoCoMo subset ------------------------------------------------------------------------------


def test_locomo_subset_matches_expected(locomo_report):
    assert locomo_report["conversations"] == 2 and locomo_report["leaks"] == 0
    assert results.compare(results.RUNS["locomo-ci"], locomo_report) == []


def test_locomo_per_conversation_means_make_up_the_overall_one(locomo_report):
    for summary in locomo_report["by_mode"].values():
        overall, parts = summary["all"], summary["all"]["by_conversation"].values()
        assert len(parts) == 2 and sum(p["n"] for p in parts) == overall["n"]
        weighted = sum(p["n"] * p["paper_r@10"] for p in parts) / overall["n"]
        assert weighted == pytest.approx(overall["paper_r@10"])


# --- the expected file and the tables generated from it ---------------------------------------------


def test_expected_file_names_a_command_and_tolerance_for_every_number():
    runs = results.load_expected()["runs"]
    assert set(runs) == set(results.RUNS)
    for name, run in runs.items():
        assert run["command"] == results.RUNS[name].command
        for path, item in run["numbers"].items():
            assert "value" in item and "tolerance" in item, path
            assert item["tolerance"] is None or item["tolerance"] >= 0, path


@pytest.mark.parametrize("path", results.DOC_PATHS, ids=lambda p: p.name)
def test_docs_tables_are_generated_from_the_expected_file(path):
    text = path.read_text(encoding="utf-8")
    assert all(f"<!-- results:{name} -->" in text for name in results.DOC_BLOCKS[path])
    assert results.render_blocks(text) == text, "run `atlas eval tables --write`"


def test_tables_command():
    out = CliRunner().invoke(app, ["eval", "tables", "persona"])
    assert out.exit_code == 0 and "reference design" in out.output and "hybrid+rerank" in out.output


# --- the question generator ---------------------------------------------------------------------------


class FakeChat:
    """Stands in for `OpenAI`: answers every prompt with two questions and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.chat = self
        self.completions = self

    def create(self, **request) -> ChatCompletion:
        self.calls += 1
        content = '{"questions": [{"question": "Where is it kept?", "kind": "paraphrase"},' \
                  f' {{"question": "Question {self.calls}?", "kind": "collision"}}]}}'
        return ChatCompletion.model_validate({
            "id": "x", "object": "chat.completion", "created": 0, "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})


def test_generate_qa_writes_the_schema_with_provenance(tmp_path):
    spec = importlib.util.spec_from_file_location("generate_qa", REPO / "scripts" / "generate_qa.py")
    generate_qa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate_qa)
    corpus = read_persona_corpus()
    superseded = {key for doc in corpus for key in doc.get("supersedes_keys", [])}
    client = FakeChat()
    lines = generate_qa.generate(client, "test-model", corpus, per_doc=2, seed=0, limit=30, cache_dir=tmp_path)
    assert client.calls == 30
    assert {line["provenance"] for line in lines} == {"llm:test-model"}
    assert not superseded & {key for line in lines for key in line["answer_keys"]}
    assert set(lines[0]) == {"qid", "user_id", "question", "answer_keys", "memory_type", "kind", "provenance"}
    assert len({line["question"] for line in lines}) == len(lines), "duplicates are dropped"
    again = generate_qa.generate(client, "test-model", corpus, per_doc=2, seed=0, limit=30, cache_dir=tmp_path)
    assert again == lines and client.calls == 30, "the second run is answered from the cache"
    assert {q.provenance for q in read_persona_questions()} == {"hand-authored"}


def test_numbers_in_the_prose_are_recorded_ones():
    """A number quoted in docs/evaluation.md outside the generated tables must be a recorded or published one."""
    text = results.BLOCK.sub("", (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8"))
    recorded = {f"{item['value']:.3f}" for run in results.load_expected()["runs"].values()
                for item in run["numbers"].values() if isinstance(item["value"], float)}
    published = {f"{v:.3f}" for v in [*PAPER_REFERENCE["r@10_by_category"].values(),
                                       *(v for v in PAPER_REFERENCE.values() if isinstance(v, float)),
                                       *(v for figures in SESSION_REFERENCES.values() for v in figures.values())]}
    quoted = set(re.findall(r"\b\d\.\d{3}\b", text))
    assert quoted <= recorded | published, sorted(quoted - recorded - published)


def test_the_stop_word_study_is_what_evaluation_quotes():
    """Issue 35: docs/evaluation.md's stop-word table is the recorded study's (`scripts/tuning_study.py --study
    stopwords --conversations 0 --record`), every development conversation, both sets."""
    study = json.loads((results.STUDIES_DIR / "stopwords.json").read_text())
    text = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    start, end = text.index("<!-- stopwords:start -->"), text.index("<!-- stopwords:end -->")
    assert results.study_table(study).to_markdown() in text[start:end]
    assert study["conversations"] == len(load_conversations()), "the study asked every development conversation"


# --- the fusion study ---------------------------------------------------------------------------


def test_fusion_study_replays_the_default_mode_and_picks_weights_out_of_fold():
    """Candidate b leads BM25 by a wide margin, c is dense's first: RRF ties them, the score fusions do not."""
    cands = (Candidate("c:D1:1", {"bm25": 1, "dense": 2}, {"bm25": 9.0, "dense": 0.80}, 0.1),
             Candidate("c:D2:1", {"bm25": 2}, {"bm25": 3.0}, 0.9),
             Candidate("c:D3:1", {"bm25": 3, "dense": 1}, {"bm25": 2.0, "dense": 0.81}, 0.5))
    asked = [replace(question(("c:D2:1",)), qid=f"{user}:q", user_id=user, group="single-hop")
             for user in ("u1", "u2", "u3")]
    captured = [Captured(q, cands) for q in asked]
    rrf_order = [key for key, _, _ in rrf_fuse({"bm25": ["c:D1:1", "c:D2:1", "c:D3:1"], "dense": ["c:D3:1", "c:D1:1"]})]
    assert replay(captured[0], "rrf", 0.0, second_stage=False) == rrf_order
    assert replay(captured[0], "rrf", 0.0, pool=3) == ["c:D3:1", "c:D2:1", "c:D1:1"], "the second stage votes"
    assert replay(captured[0], "rrf", 0.0, pool=1) == rrf_order, "the second stage reorders only the pool"
    assert replay(captured[0], "zscore", 0.9, second_stage=False)[:2] == ["c:D1:1", "c:D2:1"]
    assert replay(captured[0], "minmax", 0.1, second_stage=False)[0] == "c:D3:1"
    # the evidence is BM25's first; twelve turns only the kNN path found come first unless BM25 weighs most
    fillers = [Candidate(f"c:D{10 + i}:1", {"dense": i + 1} | ({"bm25": 2} if i == 11 else {}),
                         {"dense": 1.0 - i / 100} | ({"bm25": 1.0} if i == 11 else {}), 0.0) for i in range(12)]
    evidence = Candidate("c:D2:1", {"bm25": 1}, {"bm25": 9.0}, 0.0)
    captured = [Captured(q, (evidence, *fillers)) for q in asked]
    folds = cross_validate(captured, "minmax", weights=(0.1, 0.9), second_stage=False)
    assert folds.chosen == {"u1": 0.9, "u2": 0.9, "u3": 0.9}, "the evidence is BM25's: every fold weighs it up"
    assert folds.best == 0.9
    assert [r["r@5"] for r in folds.rows] == [1.0] * 3 and {r["session_r@10"] for r in folds.rows} == {1.0}


#: Small talk that names the two people (hubs: near one another and near any question about them) beside the turns
#: that answer a question about Mel's painting.
CHAT = ["Mel: Wow, Caro, that painting is amazing! So proud of you.", "Caro: Thanks Mel! You always cheer me up.",
        "Mel: Wow Caro, that looks amazing, the colours are so vivid!", "Caro: Aw thanks Mel, that means a lot.",
        "Mel: That's so great Caro, love it!", "Caro: Thanks so much Mel, you're the best.",
        "Mel: I painted a lake sunrise last year, it's special to me.", "Mel: My latest painting is of horses.",
        "Mel: Wow, love that painting Caro! So cool.", "Caro: Mel, what have you been painting lately?"]


def test_a_captured_question_replays_as_recall_ranks_it(store):
    """The fusion study's RRF arm is the default mode: a captured question replays to `recall`'s own top 10, with
    and without hubness (the capture keeps the second stage's cosines, not cosines hubness already lowered)."""
    for text in CHAT:
        write_episode(store, "mel", text, session_id="s1")
    asked = EvalQuestion("q1", "mel", "What has Mel painted?", (), "multi-hop", NOW)
    [captured] = capture(store, [asked], progress=False)
    orders = {}
    for penalty in (0.0, C.HUB_PENALTY):
        result = recall(store, "mel", asked.query, k=10, tuning=Tuning(hub_penalty=penalty))
        orders[penalty] = [hit.id for hit in result.hits]
        assert replay(captured, "rrf", 0.0, hub_penalty=penalty)[:10] == orders[penalty]
    assert orders[0.0] != orders[C.HUB_PENALTY], "hubness reorders this pool, so the test can tell the arms apart"


# --- the session-pass study ----------------------------------------------------------------------


def test_session_study_pairs_the_arms_question_by_question():
    """Two multi-hop questions, one of which the pass lifts from 0.5 to 1.0; a single-hop one it leaves alone."""
    def row(qid: str, group: str, r10: float) -> dict:
        return {"qid": qid, "group": group, "r@10": r10}
    unscored = {"qid": "d", "group": "adversarial"}
    off = [row("a", "multi-hop", 0.5), row("b", "multi-hop", 0.0), row("c", "single-hop", 1.0), unscored]
    on = [row("a", "multi-hop", 1.0), row("b", "multi-hop", 0.0), row("c", "single-hop", 1.0), unscored]
    by_group = {r["group"]: r for r in paired(off, on, groups=["multi-hop", "single-hop"])}
    assert (by_group["multi-hop"]["n"], by_group["multi-hop"]["off"], by_group["multi-hop"]["on"]) == (2, 0.25, 0.5)
    assert by_group["multi-hop"]["gain [95% CI]"].startswith("+0.250 [+0.000, +0.500]")
    assert by_group["single-hop"]["gain [95% CI]"] == "+0.000 [+0.000, +0.000]"
    assert by_group["all"]["n"] == 3 and by_group["all"]["on"] == pytest.approx(2.0 / 3)
    assert found_by_pass(off, on) == ["a"] and found_by_pass(on, off) == []


def test_mode_figure_labels_each_modes_interval_and_saves_what_it_shows(tmp_path):
    """R@1 and MRR per mode (issue 21): a bar per mode, its 95% interval written above it, named in the legend."""
    from atlas.research.evaluate import mode_figure

    report = {"dataset": "persona", "questions": 3,
              "by_mode": {mode: {"r@1": r1, "r@1_ci": [r1 - 0.05, r1 + 0.05], "mrr": 0.6, "mrr_ci": [0.55, 0.65]}
                          for mode, r1 in (("bm25", 0.4), ("dense", 0.5))}}
    ax = mode_figure(report, tmp_path).axes[0]
    assert ax.get_title().startswith("Persona set, 3 questions") and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["R@1", "MRR"]
    assert ax.get_legend_handles_labels()[1] == ["bm25", "dense", "bootstrap 95% interval"]
    assert "0.40\n[0.35,\n0.45]" in [t.get_text() for t in ax.texts]
    assert ax.get_ylim()[0] == pytest.approx(0.2), "the axis starts below the lowest interval, not at 0"
    assert (tmp_path / "figures" / "eval_persona_modes.png").is_file()
