"""Display helpers for notebooks: hits, request bodies, audit chains and mode comparisons as tables.

Everything returns a `Table` (or prints), which renders as HTML in Jupyter and as aligned
plain text elsewhere (papermill logs, nbval, a terminal), without pandas. Output is
deterministic: floats carry 3 decimals, dates are shown as days, and document ids are
shown by the caller's `labels` ({id: "fact:bristol"}) when given, else shortened to
`<7 chars>…` (masked by `notebooks/sanitize.cfg`). A model's own score, which differs between
processors at the third decimal (issue 33), is shown by `approx` as `≈0.85`, and masked too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

from elasticsearch import Elasticsearch

from atlas import constants as C
from atlas.core.clock import parse_date
from atlas.core.documents import valid_start
from atlas.core.recall import RecallResult, Tuning, recall, to_kibana
from atlas.core.scoring import DECAY_FIELD, DEFAULT_PARAMS, ScoringParams, multiplier, recency, use_boost
from atlas.core.store import Store
from atlas.ops.capabilities import Capability
from atlas.reporting import TEXT_WIDTH, Table, table, truncate

if TYPE_CHECKING:  # annotations only: importing consolidation pulls in openai, a second per notebook kernel
    from atlas.consolidation.consolidate import ConsolidationReport, Decision

#: Leading values of a query vector kept when a request is printed (masked by `notebooks/sanitize.cfg`: they are
#: the model's raw output, which differs between processors).
VECTOR_HEAD = 3
#: Decimals of a score `approx` shows.
APPROX_DECIMALS = 2
#: Lines of JSON a lesson prints before folding the rest (`show_json`, `show_request(lines=...)`).
FOLD_LINES = 25


def short_id(doc_id: str | None, labels: Mapping[str, str] | None = None) -> str:
    """The caller's label for an id, else its first 7 characters and an ellipsis."""
    if not doc_id:
        return ""
    if labels and doc_id in labels:
        return labels[doc_id]
    return doc_id[:7] + "…"


def approx(value: float | None, decimals: int = APPROX_DECIMALS) -> str | None:
    """A score that a processor moves, as `≈0.85` (None stays empty).

    A model's cosine (the second stage's score, a memory's hubness) comes from int8 or 4-bit kernels that are not
    bit-identical across processors: it moves at the third decimal from an Intel to an AMD or ARM machine, and any
    rounding of it flips on some machine. The mark tells the reader so, and `notebooks/sanitize.cfg` masks
    marked values, so nbval compares the rows (what ranks where), not the decimals. Never for a value a lesson
    teaches: assert that in the cell, with a margin.
    """
    if value is None:
        return None
    text = f"{value:.{decimals}f}"
    return f"≈{text.removeprefix('-') if float(text) == 0 else text}"  # no "-0.00"


def invert(names: Mapping[str, str]) -> dict[str, str]:
    """{label: id} (how a notebook keeps the ids it wrote) -> {id: label} (what the tables take)."""
    return {doc_id: label for label, doc_id in names.items()}


# --- hits ----------------------------------------------------------------------------------


def hits_table(result: RecallResult, *, labels: Mapping[str, str] | None = None, width: int = TEXT_WIDTH,
               title: str | None = None) -> Table:
    """One row per hit: rank, id, type, text, rank in each path, fused score, second stage, the hubness held
    against it (a column only when some hit has one, `atlas.core.hubness`), superseded. The second stage's score
    and the hubness are a model's cosines, shown by `approx` (they differ between processors)."""
    paths = ("bm25", "dense")
    rows = []
    for rank, hit in enumerate(result.hits, start=1):
        rows.append({
            "rank": rank, "id": short_id(hit.id, labels), "type": hit.memory_type, "text": truncate(hit.text, width),
            **{path: hit.ranks.get(path) for path in paths},
            "score": hit.score, "second": approx(hit.second_stage_score), "hub": approx(hit.hubness),
            "superseded": f"by {short_id(hit.superseded_by, labels)}" if hit.superseded_by else "",
        })
    if title is None:
        title = f"{result.mode}: {result.query!r}" + (f" ({result.note})" if result.note else "")
    hub = ["hub"] if any(hit.hubness is not None for hit in result.hits) else []
    columns = ["rank", "id", "type", "text", *paths, "score", "second", *hub, "superseded"]
    return Table(columns, [[r[c] for c in columns] for r in rows], title,
                 {"rank", *paths, "rrf", "second", "hub", "score"})


def decay_table(result: RecallResult, *, now: datetime, params: ScoringParams | None = None,
                labels: Mapping[str, str] | None = None, width: int = 48) -> Table:
    """Hits with what their multiplier is made of: age of the decay field, use count, recency, use boost.

    The numbers come from `atlas.core.scoring` (the Python twin of the function_score query).
    """
    params = params or DEFAULT_PARAMS
    rows = []
    for rank, hit in enumerate(result.hits, start=1):
        field = DECAY_FIELD.get(hit.memory_type)
        stamp = hit.source.get(field) if field else None
        age = (now - parse_date(stamp)).total_seconds() / 86400 if stamp else None
        uses = int(hit.source.get("use_count", 0)) if hit.memory_type == "semantic" else None
        rows.append({
            "rank": rank, "id": short_id(hit.id, labels), "type": hit.memory_type, "text": truncate(hit.text, width),
            "age (days)": round(age) if age is not None else None, "use_count": uses,
            "recency": recency(age, params=params) if age is not None else None,
            "use boost": use_boost(uses, params=params) if uses is not None else None,
            "multiplier": multiplier(hit.memory_type, age_days=age or 0.0, use_count=uses or 0,
                                     success_rate=float(hit.source.get("success_rate", 0.5)), params=params),
        })
    return table(rows, title=f"{result.mode}: {result.query!r} at {now:%Y-%m-%d}",
                 numeric={"rank", "age (days)", "use_count", "recency", "use boost", "multiplier"})


# --- documents and capabilities ---------------------------------------------------------------


def without_vectors(source: Mapping[str, object]) -> dict:
    """A stored document with each vector replaced by a note of its length."""
    return {k: (f"<{len(v)} floats>" if isinstance(v, list) and v and isinstance(v[0], float) else v)
            for k, v in source.items()}


def show_document(source: Mapping[str, object]) -> None:
    """Print a stored document as JSON, vectors elided (pass `_source`, not the hit: ids are random)."""
    print(json.dumps(without_vectors(source), indent=2, ensure_ascii=False))


def cluster_info(es: Elasticsearch) -> Table:
    """Version, health, license and the authenticated user of a cluster (changes between machines)."""
    from atlas.security.connection import server_version

    health = es.cluster.health()
    lic = es.license.get()["license"]
    who = es.security.authenticate()
    rows = [("version", server_version(es)), ("cluster", health["cluster_name"]), ("status", health["status"]),
            ("nodes", health["number_of_nodes"]), ("license", f"{lic['type']} ({lic['status']})"),
            ("user", who["username"])]
    return Table(["", "value"], [list(r) for r in rows])


def capabilities_table(results: Sequence[Capability], *, width: int = 70) -> Table:
    """`atlas.ops.capabilities.probe(es)` as a table: supported or not, what the probe saw, Atlas's workaround."""
    rows = [{"capability": c.name, "supported": c.supported, "probe saw": truncate(c.detail, width),
             "Atlas without it": "" if c.supported else c.workaround} for c in results]
    return table(rows)


# --- requests ------------------------------------------------------------------------------


def elide_vectors(requests: list[dict], head: int = VECTOR_HEAD) -> list[dict]:
    """A copy of the `_msearch` parts with each `query_vector` cut to its first values and a count."""
    out = copy.deepcopy(requests)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "query_vector" and isinstance(value, list) and len(value) > head:
                    node[key] = [round(float(v), 3) for v in value[:head]] + [f"... {len(value) - head} more"]
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(out)
    return out


def folded(text: str, *, lines: int | None = FOLD_LINES, save_to: str | Path | None = None,
           whole: str | None = None) -> None:
    """Print `text`'s first `lines` lines (None: all) and how many are left out; `save_to` also writes `whole`
    (default `text`) to that file, and the last line says where."""
    shown = text.splitlines()
    if lines is not None and len(shown) > lines:
        shown = shown[:lines] + [f"... {len(shown) - lines} more lines"]
    print("\n".join(shown))
    if save_to is not None:
        path = Path(save_to)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((text if whole is None else whole) + "\n")
        print(f"(the whole of it is in {path.parent.name}/{path.name})")


def show_json(value: object, *, lines: int | None = FOLD_LINES, save_to: str | Path | None = None) -> None:
    """`value` laid out by `compact_json`, folded after `lines` lines (`folded`); `save_to` keeps all of it."""
    folded(compact_json(value), lines=lines, save_to=save_to)


def show_request(requests: list[dict], *, full: bool = False, pretty: bool = False, lines: int | None = None,
                 save_to: str | Path | None = None) -> None:
    """Print the recall's `_msearch` as typed in Kibana Dev Tools (`atlas.core.recall.to_kibana`).

    Query vectors are elided unless `full` (then the text pastes as is). `pretty` lays out each search with
    `compact_json`, for reading; `lines` folds the print after that many lines. `save_to` also writes the whole
    request, vectors included, to that file, which pastes into Kibana as is.
    """
    text = to_kibana(requests if full else elide_vectors(requests))
    if pretty:
        first, *bodies = text.splitlines()
        text = "\n".join([first] + [compact_json(json.loads(b)) for b in bodies])
    folded(text, lines=lines, save_to=save_to, whole=None if save_to is None else to_kibana(requests))


def compact_json(value: object, *, width: int = 100, indent: int = 2) -> str:
    """JSON laid out for reading: a value that fits in `width` stays on one line, a long list of plain values
    is filled line by line, anything else is indented; `json.loads` gives the value back."""

    def lay(node: object, level: int, lead: int) -> str:  # lead: characters before it on its line
        flat = json.dumps(node)
        if not isinstance(node, (dict, list)) or not node or lead + len(flat) < width:  # room for a comma
            return flat
        pad, close = " " * (indent * (level + 1)), " " * (indent * level)
        if isinstance(node, dict):
            items = [f"{pad}{json.dumps(k)}: {lay(v, level + 1, len(pad) + len(json.dumps(k)) + 2)}"
                     for k, v in node.items()]
        elif all(not isinstance(v, (dict, list)) for v in node):
            items, line = [], ""
            for piece in (json.dumps(v) for v in node):
                if line and len(pad) + len(line) + len(piece) + 3 > width:
                    items.append(pad + line)
                    line = ""
                line = f"{line}, {piece}" if line else piece
            items.append(pad + line)
        else:
            items = [pad + lay(v, level + 1, len(pad)) for v in node]
        open_, end = ("{", "}") if isinstance(node, dict) else ("[", "]")
        return f"{open_}\n" + ",\n".join(items) + f"\n{close}{end}"

    return lay(value, 0, 0)


# --- supersession chains -------------------------------------------------------------------


def chain_table(history: Sequence[dict], *, labels: Mapping[str, str] | None = None,
                width: int = TEXT_WIDTH) -> Table:
    """`atlas.core.supersession.history(...)` as a table, oldest first: what retired what, when a fact held (its
    valid time: `documents.valid_start` until `valid_to`, or "now"), and where it lives now."""
    rows = []
    for step, doc in enumerate(history, start=1):
        if doc.get("archived_from"):
            where = "archive"
        elif doc.get("superseded_by"):
            where = "superseded"
        else:
            where = "current"
        rows.append({
            "step": step, "id": short_id(doc["id"], labels), "text": truncate(doc.get("text", ""), width),
            "created": str(doc.get("created_at", ""))[:10],
            "supersedes": ", ".join(short_id(i, labels) for i in doc.get("supersedes") or []),
            "contradiction": doc.get("contradiction"), "confidence": doc.get("confidence"),
            "superseded_by": short_id(doc.get("superseded_by"), labels),
            "superseded_at": str(doc.get("superseded_at") or "")[:10],
            "held": (f"{valid_start(doc)[:10]} to {str(doc.get('valid_to') or 'now')[:10]}"
                     if doc.get("memory_type") == "semantic" else ""),
            "status": where,
        })
    return table(rows, numeric={"step", "confidence"})


# --- modes side by side --------------------------------------------------------------------


class RecallOptions(TypedDict, total=False):
    """The options of `atlas.core.recall.recall` that `modes_side_by_side` passes on."""

    types: Sequence[C.MemoryType] | None
    include_superseded: bool
    tuning: Tuning


@dataclass
class ModeComparison:
    """Recall of each question in each mode: results, the rank of each question's target, a table."""

    questions: list[str]
    modes: list[str]
    results: dict[tuple[str, str], RecallResult]
    targets: dict[str, str | None]
    labels: Mapping[str, str] | None
    k: int

    def rank(self, question: str, mode: str) -> int | None:
        """1-based rank of the question's target in that mode, None when not recalled."""
        target = self.targets.get(question)
        ids = self.results[(question, mode)].ids()
        return ids.index(target) + 1 if target in ids else None

    def ranks(self) -> dict[str, dict[str, int | None]]:
        """{question: {mode: rank of the target}}: input of `atlas.notebook.plots.mode_ranks`."""
        return {q: {m: self.rank(q, m) for m in self.modes} for q in self.questions if self.targets.get(q)}

    @property
    def table(self) -> Table:
        rows = []
        for question in self.questions:
            target = self.targets.get(question)
            for i, mode in enumerate(self.modes):
                hits = self.results[(question, mode)].hits[:self.k]
                top = ", ".join(("*" if h.id == target else "") + short_id(h.id, self.labels) for h in hits)
                row: dict[str, object] = {"question": truncate(question, 40) if i == 0 else "", "mode": mode}
                if target:
                    row["target rank"] = self.rank(question, mode)
                row[f"top {self.k} (* = target)" if target else f"top {self.k}"] = top
                rows.append(row)
        return table(rows, numeric={"target rank"})

    def __str__(self) -> str:
        return str(self.table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return self.table._repr_html_()


def modes_side_by_side(store: Store, user: str, questions: Sequence[str] | Mapping[str, str | None],
                       modes: Sequence[C.RecallMode] = C.RECALL_MODES, *, k: int = 3, depth: int = 20,
                       labels: Mapping[str, str] | None = None,
                       **recall_options: Unpack[RecallOptions]) -> ModeComparison:
    """Recall every question in every mode (without touching use counts).

    `questions` maps each question to the id it should find (its target), or lists them.
    The table shows the top `k`; a target's rank is looked up in the top `depth`.
    """
    targets: dict[str, str | None] = dict(questions) if isinstance(questions, Mapping) else {q: None for q in questions}
    results: dict[tuple[str, str], RecallResult] = {
        (q, m): recall(store, user, q, k=max(k, depth), mode=m, **recall_options)
        for q in targets for m in modes}
    return ModeComparison(list(targets), list(modes), results, targets, labels, k)


# --- consolidation -------------------------------------------------------------------------------


def _proposal_text(decision: Decision, labels: Mapping[str, str] | None) -> str:
    """A fact's or playbook's text, or which playbook worked or not (ids shown by `labels`)."""
    p = decision.proposal
    if decision.kind == "outcome":
        refined = " (refined steps)" if p.get("refined_steps") else ""
        return f"playbook {short_id(p.get('playbook_id'), labels)}: " \
               f"{'worked' if p.get('success') else 'did not work'}{refined}"
    return str(p.get("text") or p.get("name") or p)


def _retired(decision: Decision, labels: Mapping[str, str] | None) -> str:
    olds = decision.proposal.get("supersedes_id") or []
    if not olds:
        return ""
    return ", ".join(short_id(i, labels) for i in olds) + f" ({decision.proposal.get('contradiction')})"


def decision_rows(report: ConsolidationReport, labels: Mapping[str, str] | None = None) -> list[dict]:
    """One row per proposal of a consolidation run: kind, text, what it retires, accepted or the guard
    that refused it."""
    return [{"kind": d.kind, "proposal": _proposal_text(d, labels), "supersedes": _retired(d, labels),
             "decision": "accepted" if d.accepted else "rejected", "reason": d.reason or ""}
            for d in report.decisions]
