"""Retrieval evaluation: every question through every recall mode, as the asking user, scored against its answers.

One loop (`ask_all`) serves both data sets. A question is asked with the user's own
DLS key when the cluster can issue keys (`read_as_users`), with `touch=False` (a
question must not change the use counts the next one is scored on) and a fixed
`now` (decay is deterministic). Each answer is scored on the `source_key`s of the
hits; a hit owned by another user is counted as a leak. `persona_report` and
`locomo_report` only group the same rows differently.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.errors import AuthError
from atlas.core.recall import DEFAULT_TUNING, RecallResult, Tuning, recall
from atlas.core.store import Store
from atlas.research.datasets import (
    PERSONA_DIR,
    PERSONA_NOW,
    load_locomo,
    load_persona,
    locomo_documents,
    persona_documents,
    read_persona_corpus,
    read_persona_questions,
)
from atlas.research.locomo import (
    ADVERSARIAL,
    CATEGORY_NAMES,
    MAIN_CATEGORIES,
    PAPER_REFERENCE,
    Conversation,
    questions,
    session_of,
)
from atlas.research.metrics import (
    distinct,
    ndcg,
    percentiles,
    recall_all,
    recall_any,
    recall_fraction,
    reciprocal_rank,
    summarise,
)
from atlas.research.session_pass import session_pass
from atlas.security.connection import server_version
from atlas.security.tenancy import enable_tenancy, ensure_user_key

if TYPE_CHECKING:
    from matplotlib.figure import Figure  # matplotlib is imported only when a figure is drawn

PERSONA_KS = (1, 5, 10)
LOCOMO_KS = (5, 10, 25, 50)
#: LoCoMo at the level of sessions (the unit published session-level figures count): the gold sessions are those
#: of the evidence turns, and the ranking of sessions is the turn ranking by first appearance.
SESSION_METRICS = ("hit@1", "r@5", "r@10", "ndcg@5")
#: Seed of every bootstrap interval, so a rerun reports the same interval.
CI_SEED = 0
#: The reference design's published Recall@10 on its persona set (no R@5, no MRR published).
REFERENCE_DESIGN: dict = {"r@10": 0.89, "r@10_by_type": {"semantic": 0.81, "episodic": 0.98, "procedural": 1.0}}
#: The gate of the default mode on the persona set (tests/test_eval.py).
PERSONA_GATE = {"r@10": 0.85, "r@5": 0.75}


@dataclass(frozen=True)
class EvalQuestion:
    """A question as the loop sees it, whatever its data set."""

    qid: str
    user_id: str
    query: str
    #: Source keys that answer it (may be empty: such a question scores only in the paper's figure).
    relevant: tuple[str, ...]
    #: Memory type of the answer (persona) or LoCoMo category name.
    group: str
    #: The fixed "now" the question is asked at.
    now: datetime
    #: Persona question kind (paraphrase, exact-token, ...); empty for LoCoMo.
    kind: str = ""
    #: Evidence references that name no turn: misses in the paper-comparable figure.
    unresolved: int = 0


def persona_questions(path: Path = PERSONA_DIR) -> list[EvalQuestion]:
    return [EvalQuestion(q.qid, q.user_id, q.question, q.answer_keys, q.memory_type, PERSONA_NOW, q.kind)
            for q in read_persona_questions(path)]


def conversation_now(conv: Conversation) -> datetime:
    """A LoCoMo question is asked the day after the conversation's last session."""
    return conv.sessions[-1].started_at + timedelta(days=1)


def locomo_questions(conversations: Iterable[Conversation]) -> list[EvalQuestion]:
    return [EvalQuestion(q.qid, q.tenant_id, q.question, tuple(q.evidence), q.category_name, conversation_now(conv),
                         unresolved=len(q.dropped_evidence))
            for conv in conversations for q in questions(conv)]


# --- scoring one answer -----------------------------------------------------------------------


def metric_names(ks: Sequence[int]) -> list[str]:
    """Per-question metrics of questions with relevant items."""
    return [f"{m}@{k}" for m in ("r", "any", "all") for k in ks] + ["mrr"]


def score(question: EvalQuestion, ranked: Sequence[str], ks: Sequence[int]) -> dict[str, float]:
    """`r@k` (fraction of the answer found, `atlas.research.metrics.recall_fraction`), `any@k`, `all@k`, `mrr`,
    and `paper_r@k`.

    `paper_r@k` is the LoCoMo paper's scoring over all questions: a question without
    evidence counts as 1, an unresolvable reference as a miss.
    """
    relevant = set(question.relevant)
    out: dict[str, float] = {}
    for k in ks:
        out[f"paper_r@{k}"] = (len(set(ranked[:k]) & relevant) / (len(relevant) + question.unresolved)
                               if relevant or question.unresolved else 1.0)
        if relevant:
            out |= {f"r@{k}": recall_fraction(ranked, relevant, k), f"any@{k}": recall_any(ranked, relevant, k),
                    f"all@{k}": recall_all(ranked, relevant, k)}
    if relevant:
        out["mrr"] = reciprocal_rank(ranked, relevant)
    return out


def session_scores(question: EvalQuestion, ranked: Sequence[str]) -> dict[str, float]:
    """`SESSION_METRICS` of one LoCoMo question with evidence, from its turn ranking."""
    sessions = distinct(session_of(key) for key in ranked)
    gold = {session_of(key) for key in question.relevant}
    return {"hit@1": recall_any(sessions, gold, 1), "r@5": recall_fraction(sessions, gold, 5),
            "r@10": recall_fraction(sessions, gold, 10), "ndcg@5": ndcg(sessions, gold, 5)}


# --- the loop ------------------------------------------------------------------------------------


def read_as_users(store: Store, users: Iterable[str]) -> str:
    """Point every read at the asking user's own DLS key; says how reads are guarded.

    A credential that may not create API keys (no `manage_own_api_key`) falls back to the
    service credential and the code filter, with a warning, and the report says so.
    """
    try:
        for user in users:
            ensure_user_key(store, user, verify=True)
    except AuthError as exc:
        warnings.warn(f"evaluating without per-user keys ({exc}): the code filter alone separates users", stacklevel=2)
        return "service credential + code filter"
    enable_tenancy(store)
    return "per-user DLS keys + code filter"


def warm_query_vectors(store: Store, queries: Sequence[str]) -> None:
    """Embed every query once, in batches, before the timed loop: latencies then all exclude model time alike."""
    store.embedder.embed_queries(list(queries))
    if store.second_stage is not None and store.second_stage.embedder is not None:
        store.second_stage.embedder.embed_queries(list(queries))


def ask_one(store: Store, question: EvalQuestion, mode: C.RecallMode, k: int, *, tuning: Tuning = DEFAULT_TUNING,
            sessions: int = 0) -> RecallResult:
    """The question recalled as its user, at its `now`; `sessions` (0: off) adds the session pass
    (`atlas.research.session_pass`)."""
    result = recall(store.at(question.now), question.user_id, question.query, k=k, mode=mode, tuning=tuning)
    if sessions:
        result.hits = session_pass(store.at(question.now), result, k=k, sessions=sessions, tuning=tuning)[:k]
    return result


def ask(store: Store, question: EvalQuestion, mode: C.RecallMode, ks: Sequence[int], *,
        options: Mapping[str, Any] | None = None) -> dict:
    """One recall, scored: the row every report is built from. `options` go to `ask_one` (`tuning`, `sessions`)."""
    started = time.perf_counter()
    result = ask_one(store, question, mode, max(ks), **(options or {}))
    latency = time.perf_counter() - started
    ranked = [hit.source.get("source_key") or hit.id for hit in result.hits]
    return {"qid": question.qid, "user_id": question.user_id, "mode": mode, "group": question.group,
            "kind": question.kind, "ranked": ranked,
            "leaks": sum(1 for hit in result.hits if hit.user_id not in (None, question.user_id)),
            "fallback": result.note, "latency_ms": 1000 * latency,
            **{f"{part}_ms": 1000 * seconds for part, seconds in result.timings.items()},
            **score(question, ranked, ks)}


def ask_all(store: Store, questions: Sequence[EvalQuestion], modes: Sequence[C.RecallMode], ks: Sequence[int], *,
            progress: bool = True, options: Mapping[str, Any] | None = None) -> list[dict]:
    """Every question in every mode, sequentially (latencies are not measured under self-made load)."""
    warm_query_vectors(store, [q.query for q in questions])
    rows = []
    with tqdm(total=len(questions) * len(modes), desc="recall", unit="q", disable=not progress) as bar:
        for mode in modes:
            for question in questions:
                rows.append(ask(store, question, mode, ks, options=options))
                bar.update()
    return rows


# --- reports -----------------------------------------------------------------------------------


def _summary(rows: Sequence[dict], metrics: Sequence[str], group_by: str | None, name: str, seed: int) -> dict:
    """Means (with bootstrap CIs) overall, and per group as `by_<name>`, as JSON-ready dicts."""
    raw = summarise(rows, group_by, metrics, ci=True, seed=seed)
    tidy = {key: {m: list(v) if isinstance(v, tuple) else v for m, v in values.items()} for key, values in raw.items()}
    out = tidy.pop("overall")
    return out | ({f"by_{name}": tidy} if group_by else {})


def _costs(rows: Sequence[dict]) -> dict:
    """Latency percentiles (total and per part), leaks and second-stage fallbacks of one mode."""
    parts = ["latency_ms"] + sorted(k for k in rows[0] if k.endswith("_ms") and k != "latency_ms")
    return {"latency_ms": {part.removesuffix("_ms"): percentiles([r[part] for r in rows], ps=(50, 95))
                           for part in parts},
            "leaks": sum(r["leaks"] for r in rows), "fallbacks": sum(1 for r in rows if r["fallback"])}


def by_mode(rows: Iterable[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["mode"], []).append(row)
    return out


def persona_misses(rows: Sequence[dict], questions: Sequence[EvalQuestion], texts: Mapping[str, str],
                   k: int = 10) -> list[dict]:
    """Questions whose answer is not (wholly) in the top k: what was expected and what came first instead."""
    asked = {q.qid: q for q in questions}
    misses = []
    for row in rows:
        if row[f"r@{k}"] == 1.0:
            continue
        q = asked[row["qid"]]
        first = next((key for key in row["ranked"] if key not in q.relevant), None)
        misses.append({"qid": q.qid, "user_id": q.user_id, "question": q.query, "type": q.group, "kind": q.kind,
                       f"r@{k}": row[f"r@{k}"], "expected": [{"key": key, "text": texts[key]} for key in q.relevant],
                       "first": {"key": first, "text": texts.get(first, "")} if first else None})
    return misses


def persona_report(rows: Sequence[dict], questions: Sequence[EvalQuestion], texts: Mapping[str, str], *,
                   seed: int = CI_SEED) -> dict:
    """Per mode: R@1/5/10 and MRR overall, per memory type and per question kind; costs; the misses."""
    metrics = metric_names(PERSONA_KS)
    modes = {}
    for mode, mode_rows in by_mode(rows).items():
        modes[mode] = (_summary(mode_rows, metrics, "group", "type", seed)
                       | {"by_kind": _summary(mode_rows, metrics, "kind", "kind", seed)["by_kind"]}
                       | _costs(mode_rows) | {"misses": persona_misses(mode_rows, questions, texts)})
    return {"dataset": "persona", "questions": len(questions), "now": PERSONA_NOW.isoformat(), "ks": list(PERSONA_KS),
            "by_mode": modes, "leaks": sum(m["leaks"] for m in modes.values()), "reference": REFERENCE_DESIGN,
            "gate": {"mode": C.DEFAULT_RECALL_MODE, **PERSONA_GATE}}


#: What each evidence turn the default mode misses at 10 is checked for: in a single path's top 10, in
#: either's, and in either's top 50 (the deepest ranking a row keeps).
MISSED_METRICS = ("bm25@10", "dense@10", "either@10", "either@50")


def missed_evidence(rows: Sequence[dict], questions: Sequence[EvalQuestion]) -> list[dict]:
    """One row per evidence turn of the main set that the default mode misses at 10: which path ranked it?

    A turn in neither path's top 50 is out of reach of fusion and the second stage (it could only
    enter from a path's places 51-80): a better first stage must find it, not a new ranking of the
    same candidates. Empty unless the run holds the default mode and both single-path modes.
    """
    modes = by_mode(rows)
    if not {C.DEFAULT_RECALL_MODE, "bm25", "dense"} <= modes.keys():
        return []
    ranked = {mode: {row["qid"]: row["ranked"] for row in mode_rows} for mode, mode_rows in modes.items()}
    main_names = {CATEGORY_NAMES[c] for c in MAIN_CATEGORIES}
    out = []
    for q in questions:
        if q.group not in main_names:
            continue
        bm25, dense = ranked["bm25"][q.qid], ranked["dense"][q.qid]
        for key in sorted(set(q.relevant) - set(ranked[C.DEFAULT_RECALL_MODE][q.qid][:10])):
            out.append({"group": q.group, "bm25@10": key in bm25[:10], "dense@10": key in dense[:10],
                        "either@10": key in bm25[:10] + dense[:10], "either@50": key in bm25[:50] + dense[:50]})
    return out


def locomo_report(rows: Sequence[dict], questions: Sequence[EvalQuestion], *, seed: int = CI_SEED) -> dict:
    """Per mode: the main set (categories 1-4) per category, at the level of turns and of sessions
    (`SESSION_METRICS`), adversarial apart, and the paper's all-questions
    recall per category and per conversation (one tenant each: does one conversation carry the mean?); with
    both single-path modes, where the default mode's missed evidence stood in each path (`missed`)."""
    metrics = metric_names(LOCOMO_KS)
    paper = [f"paper_r@{k}" for k in LOCOMO_KS]
    main_names = {CATEGORY_NAMES[c] for c in MAIN_CATEGORIES}
    asked = {q.qid: q for q in questions}
    modes = {}
    for mode, mode_rows in by_mode(rows).items():
        scorable = [r for r in mode_rows if "mrr" in r]
        main = [r for r in scorable if r["group"] in main_names]
        adversarial = [r for r in scorable if r["group"] == CATEGORY_NAMES[ADVERSARIAL]]
        sessions = [session_scores(asked[r["qid"]], r["ranked"]) | {"group": r["group"]} for r in main]
        modes[mode] = {"main": _summary(main, metrics, "group", "category", seed),
                       "sessions": _summary(sessions, SESSION_METRICS, "group", "category", seed),
                       "adversarial": _summary(adversarial, metrics, None, "category", seed),
                       "all": _summary(mode_rows, paper, "group", "category", seed)
                       | {"by_conversation":
                          _summary(mode_rows, paper, "user_id", "conversation", seed)["by_conversation"]},
                       **_costs(mode_rows)}
    qids = {r["qid"] for r in rows}
    missed = missed_evidence(rows, questions)
    return {"dataset": "locomo", "questions": len(qids), "conversations": len({q.split(":")[0] for q in qids}),
            "ks": list(LOCOMO_KS), "by_mode": modes, "leaks": sum(m["leaks"] for m in modes.values()),
            "reference": PAPER_REFERENCE,
            **({"missed": _summary(missed, MISSED_METRICS, "group", "category", seed)} if missed else {})}


def fingerprint(docs: Sequence[Mapping], asked: Sequence[EvalQuestion]) -> str:
    """sha256 of what was loaded and asked: numbers of other data are never compared with recorded ones."""
    payload = json.dumps([list(docs), [asdict(q) for q in asked]], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def setup(store: Store, reads: str) -> dict:
    """What the numbers depend on besides the data: models, cluster version, how reads were guarded."""
    stage = store.second_stage
    return {"embedder": store.embedder.name, "second_stage": stage.name if stage else "none",
            "elasticsearch": server_version(store.es), "reads": reads}


# --- runs -------------------------------------------------------------------------------------------


def prepare_persona(store: Store, *, path: Path = PERSONA_DIR, progress: bool = True) -> tuple[list[EvalQuestion], str]:
    """Load the persona corpus (once) and let each asking user read through their key: (questions, how read)."""
    load_persona(store, path, progress=progress)
    asked = persona_questions(path)
    return asked, read_as_users(store, sorted({q.user_id for q in asked}))


def prepare_locomo(store: Store, conversations: Sequence[Conversation], *,
                   progress: bool = True) -> tuple[list[EvalQuestion], str]:
    """Load the conversations (once each, one tenant per conversation), each tenant reading through their key:
    (questions, how read)."""
    load_locomo(store, conversations, progress=progress)
    return locomo_questions(conversations), read_as_users(store, [conv.tenant_id for conv in conversations])


def evaluate_persona(store: Store, *, modes: Sequence[C.RecallMode] = C.RECALL_MODES, path: Path = PERSONA_DIR,
                     seed: int = CI_SEED, progress: bool = True) -> dict:
    """Load the persona corpus (once) and evaluate every question in every mode."""
    started = time.perf_counter()
    asked, reads = prepare_persona(store, path=path, progress=progress)
    rows = ask_all(store, asked, modes, PERSONA_KS, progress=progress)
    corpus = read_persona_corpus(path)
    return persona_report(rows, asked, {doc["key"]: doc["text"] for doc in corpus}, seed=seed) | {
        "data_sha256": fingerprint(persona_documents(corpus), asked), "setup": setup(store, reads),
        "seconds": time.perf_counter() - started}


def evaluate_locomo(store: Store, conversations: Sequence[Conversation], *,
                    modes: Sequence[C.RecallMode] = C.RECALL_MODES, seed: int = CI_SEED,
                    progress: bool = True) -> dict:
    """Load the conversations (once each, one tenant per conversation) and evaluate their questions in every mode."""
    started = time.perf_counter()
    asked, reads = prepare_locomo(store, conversations, progress=progress)
    rows = ask_all(store, asked, modes, LOCOMO_KS, progress=progress)
    return locomo_report(rows, asked, seed=seed) | {"data_sha256": fingerprint(locomo_documents(conversations), asked),
                                  "setup": setup(store, reads), "seconds": time.perf_counter() - started}


def write_report(report: Mapping, out_dir: Path, name: str) -> Path:
    """`<out_dir>/<name>.json`, keys in insertion order, floats as computed."""
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


# --- figures ----------------------------------------------------------------------------------------


def recall_by_group(report: Mapping) -> tuple[dict, dict, dict]:
    """({group: {mode: R@10}}, {group: {mode: CI}}, {group: published reference}) of a report.

    Persona: per memory type and overall, beside the reference design. LoCoMo: the
    paper's all-questions scoring per category, so that each bar is comparable with the
    paper's tick.
    """
    values: dict = {}
    errors: dict = {}
    persona = report["dataset"] == "persona"
    metric = "r@10" if persona else "paper_r@10"
    for mode, summary in report["by_mode"].items():
        groups = (summary["by_type"] | {"overall": summary}) if persona else \
            (summary["all"]["by_category"] | {"all": summary["all"]})
        for group, stats in groups.items():
            values.setdefault(group, {})[mode] = stats[metric]
            errors.setdefault(group, {})[mode] = stats[f"{metric}_ci"]
    reference = REFERENCE_DESIGN["r@10_by_type"] | {"overall": REFERENCE_DESIGN["r@10"]} if persona else \
        PAPER_REFERENCE["r@10_by_category"] | {"all": PAPER_REFERENCE["r@10"]}
    order = [*C.MEMORY_TYPES, "overall"] if persona else [*CATEGORY_NAMES.values(), "all"]
    values = {group: values[group] for group in order if group in values}
    return values, errors, reference


def report_figure(report: Mapping, out_dir: Path | None = None) -> Figure:
    """R@10 per group and mode with bootstrap CIs, the published numbers as black ticks; saved under out_dir/figures."""
    from atlas.notebook.plots import grouped_bars

    values, errors, reference = recall_by_group(report)
    persona = report["dataset"] == "persona"
    return grouped_bars(values, reference=reference, errors=errors,
                        reference_label="reference design (published)" if persona else
                        "paper: DRAGON over all 10 conversations (published)",
                        title="Persona set: R@10 per memory type" if persona else
                        f"LoCoMo, {report['conversations']} of 10 conversations: R@10 per category "
                        "(the paper's scoring)",
                        xlabel="memory type" if persona else "question category",
                        ylabel="R@10 (fraction of the answer in the top 10)", out_dir=out_dir,
                        name=f"eval_{report['dataset']}_r10")


def mode_figure(report: Mapping, out_dir: Path | None = None) -> Figure:
    """The rank-1 measures per mode with bootstrap 95% intervals: R@1 and MRR (persona), and for LoCoMo, whose
    scoring has no cut at 1, a gold session first (session Hit@1) and the evidence turns' MRR (main set)."""
    from atlas.notebook.plots import interval_bars

    persona = report["dataset"] == "persona"
    picks = {"R@1": (None, "r@1"), "MRR": (None, "mrr")} if persona else \
        {"session Hit@1": ("sessions", "hit@1"), "turn MRR": ("main", "mrr")}
    values: dict = {}
    for label, (part, metric) in picks.items():
        for mode, summary in report["by_mode"].items():
            stats = summary[part] if part else summary
            values.setdefault(label, {})[mode] = (stats[metric], stats[f"{metric}_ci"])
    title = f"Persona set, {report['questions']} questions: rank-1 measures per mode" if persona else \
        f"LoCoMo, {report['conversations']} conversations, main set: rank-1 measures per mode"
    return interval_bars(values, title=title, out_dir=out_dir, name=f"eval_{report['dataset']}_modes")
