"""Consolidation: a user's new episodes become facts, playbooks and playbook outcomes, behind guards.

A run reads the user's episodes past their watermark, the current facts and playbooks,
asks a proposer (`atlas.consolidation.proposers`) what to write, and keeps only proposals that pass
the guards, whoever proposed them: the schema; supporting episodes that exist, belong to
the user and include one of this batch; a fact sharing words with those episodes (only
the user's own words become facts); a confidence floor; superseded ids that are the
user's current facts; no duplicate (hybrid recall over the user's facts, cosine with
`CONSOLIDATION_EMBEDDER` >= `CONSOLIDATION_DEDUP_SIMILARITY`); a playbook only for a trigger no
playbook covers; outcomes only for the user's playbooks.

State lives in `<prefix>-state` (service credential only, never readable with a user
key): `watermark-<user>` (the last consolidated episode time and the ids at that time)
and `plan-<user>` (the last run). A run writes its plan first, applies it step by step
with a journal, then moves the watermark and marks the plan done. A crash leaves a
pending plan that the next run finishes (each step is idempotent); a refused step rolls
back the steps before it. Either way a run's writes land together or not at all, and a
rerun never proposes from the same episodes twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypedDict, Unpack

import numpy as np
from elasticsearch import ConflictError as ESConflict
from elasticsearch import NotFoundError
from pydantic import ValidationError as PydanticError
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.consolidation.proposers import (
    PROPOSAL,
    Batch,
    Episode,
    Fact,
    FactProposal,
    OutcomeProposal,
    Playbook,
    PlaybookProposal,
    Proposer,
    Similarity,
    default_proposer,
)
from atlas.core.clock import es_date
from atlas.core.documents import VECTOR_FIELDS, build_document, prove_ownership, update_owned
from atlas.core.errors import AtlasError, ConflictError, NotFound, ValidationError
from atlas.core.hubness import refresh_hubness
from atlas.core.memory import bulk_load, record_outcome, users_with_memory
from atlas.core.recall import clip_query, recall
from atlas.core.schemas import DATE, KEYWORD, index_name, state_name
from atlas.core.store import Store
from atlas.core.supersession import repair, supersede
from atlas.core.validation import check_user
from atlas.models.embed import load_embedder

STATE_MAPPINGS = {"dynamic": False, "properties": {"kind": KEYWORD, "user_id": KEYWORD, "status": KEYWORD,
                                                    "updated_at": DATE}}
#: Most facts or playbooks of one user read per run (one search page).
MAX_MEMORIES = 10_000
#: Playbook fields an outcome update changes: saved before it, restored by a rollback.
OUTCOME_FIELDS = ("success_count", "failure_count", "success_rate", "last_success_at", "refined_steps")


# --- state: watermark and plans -------------------------------------------------------------


def ensure_state_name(store: Store) -> str:
    name = state_name(store.prefix)
    if not store.es.indices.exists(index=name):
        store.es.indices.create(index=name, mappings=STATE_MAPPINGS,
                                settings={"number_of_shards": 1, "number_of_replicas": 0})
    return name


@dataclass(frozen=True)
class Watermark:
    """The newest consolidated episode time, and every episode id consolidated at exactly that time."""

    timestamp: str | None = None
    ids: tuple[str, ...] = ()

    def advance(self, episodes: Sequence[Episode]) -> Watermark:
        if not episodes:
            return self
        last = max(e.timestamp for e in episodes)
        at_last = tuple(e.id for e in episodes if e.timestamp == last)
        return Watermark(last, (self.ids if last == self.timestamp else ()) + at_last)


def _get_state(store: Store, doc_id: str) -> dict | None:
    try:
        return store.es.get(index=state_name(store.prefix), id=doc_id)["_source"]
    except NotFoundError:
        return None


def read_watermark(store: Store, user_id: str) -> Watermark:
    doc = _get_state(store, f"watermark-{check_user(user_id)}")
    return Watermark(doc["timestamp"], tuple(doc["ids"])) if doc else Watermark()


def read_plan(store: Store, user_id: str) -> dict | None:
    """The user's last plan (pending, done or rolled back), or None."""
    return _get_state(store, f"plan-{check_user(user_id)}")


# --- reading a batch ------------------------------------------------------------------------------


def build_episodes_query(user_id: str, watermark: Watermark) -> dict:
    """The user's episodes at or after the watermark time, minus those consolidated at exactly that time."""
    query: dict = {"bool": {"filter": [{"term": {"user_id": user_id}}], "must_not": []}}
    if watermark.timestamp:
        query["bool"]["filter"].append({"range": {"timestamp": {"gte": watermark.timestamp}}})
        query["bool"]["must_not"].append({"ids": {"values": list(watermark.ids)}})
    return query


def _search(store: Store, user_id: str, memory_type: C.MemoryType, query: dict, size: int,
            sort: list | None = None) -> list[dict]:
    resp = store.read_client(user_id).search(index=index_name(store.prefix, memory_type), routing=user_id,
                                             query=query, size=size, sort=sort, source_excludes=list(VECTOR_FIELDS),
                                             ignore_unavailable=True)
    return resp["hits"]["hits"]


def new_episodes(store: Store, user_id: str, watermark: Watermark, limit: int) -> list[Episode]:
    hits = _search(store, user_id, "episodic", build_episodes_query(user_id, watermark), limit,
                   sort=[{"timestamp": "asc"}, {"created_at": "asc"}])
    return [Episode(h["_id"], h["_source"]["text"], h["_source"]["timestamp"], h["_source"].get("session_id"))
            for h in hits]


def count_new_episodes(store: Store, user_id: str) -> int:
    query = build_episodes_query(check_user(user_id), read_watermark(store, user_id))
    return store.read_client(user_id).count(index=index_name(store.prefix, "episodic"), routing=user_id, query=query,
                                            ignore_unavailable=True)["count"]


def current_facts(store: Store, user_id: str) -> list[Fact]:
    query = {"bool": {"filter": [{"term": {"user_id": user_id}}], "must_not": [{"exists": {"field": "superseded_by"}}]}}
    return [Fact(h["_id"], h["_source"]["text"], h["_source"].get("fact_type"))
            for h in _search(store, user_id, "semantic", query, MAX_MEMORIES, sort=[{"created_at": "asc"}])]


def playbooks(store: Store, user_id: str) -> list[Playbook]:
    query = {"bool": {"filter": [{"term": {"user_id": user_id}}], "must_not": [{"exists": {"field": "superseded_by"}}]}}
    return [Playbook(h["_id"], h["_source"].get("name") or h["_source"]["text"][:60], h["_source"].get("trigger") or "",
                     tuple(h["_source"].get("refined_steps") or h["_source"].get("steps") or ()))
            for h in _search(store, user_id, "procedural", query, MAX_MEMORIES, sort=[{"created_at": "asc"}])]


def similarity_of(store: Store) -> Similarity:
    """Cosine of one text to several (passages on both sides; vectors are unit length).

    The model is `CONSOLIDATION_EMBEDDER`, not the first stage's: the thresholds are its cosines,
    and another model's cosines sit in another band (e5's rarely fall below 0.7).
    """
    model = load_embedder(C.CONSOLIDATION_EMBEDDER, cache_dir=store.settings.embedding_cache_dir)

    def similarity(text: str, others: Sequence[str]) -> np.ndarray:
        if not others:
            return np.zeros(0)
        vectors = model.embed_passages([text, *others])
        return vectors[1:] @ vectors[0]

    return similarity


def display_name(user_id: str) -> str:
    """How facts name the user when no name is given: "sarah" -> "Sarah"."""
    return user_id.replace("_", " ").replace("-", " ").title()


def read_batch(store: Store, user_id: str, watermark: Watermark, *, limit: int = C.CONSOLIDATION_BATCH,
               user_name: str | None = None) -> Batch:
    return Batch(user_id, user_name or display_name(user_id), tuple(new_episodes(store, user_id, watermark, limit)),
                 tuple(current_facts(store, user_id)), tuple(playbooks(store, user_id)), similarity_of(store))


# --- guards ------------------------------------------------------------------------------------


@dataclass
class Decision:
    """One proposal and what the guards made of it; `id` is set once written."""

    kind: str
    proposal: dict
    accepted: bool
    reason: str | None = None
    id: str | None = None


def content_words(text: str, *, ignore: Iterable[str] = ()) -> set[str]:
    """Words of three letters or more that are neither a stop word of the BM25 analyzer nor in `ignore`."""
    skip = set(C.ENGLISH_STOPWORDS) | {w.lower() for w in ignore}
    return {w for w in (t.strip(".,;:!?'\"()").lower() for t in text.replace("'s ", " ").split())
            if len(w) >= 3 and w not in skip}


class GuardOptions(TypedDict, total=False):
    """The thresholds of `Guards`, which `consolidate` passes on."""

    min_confidence: float
    dedup_similarity: float
    trigger_similarity: float


class RunOptions(GuardOptions, total=False):
    """Options of one `consolidate` run besides its proposer, which the runs of several users pass on."""

    limit: int
    dry_run: bool
    user_name: str | None


class Guards:
    """Every check a proposal passes before it may be written, whoever proposed it."""

    def __init__(self, store: Store, batch: Batch, *, min_confidence: float = C.CONSOLIDATION_MIN_CONFIDENCE,
                 dedup_similarity: float = C.CONSOLIDATION_DEDUP_SIMILARITY,
                 trigger_similarity: float = C.CONSOLIDATION_TRIGGER_SIMILARITY) -> None:
        self.store, self.batch = store, batch
        self.min_confidence, self.dedup_similarity, self.trigger_similarity = \
            min_confidence, dedup_similarity, trigger_similarity
        self.new_episodes = {e.id: e for e in batch.episodes}
        self.known_episodes: dict[str, str] = {e.id: e.text for e in batch.episodes}
        self.facts = {f.id for f in batch.facts}
        self.playbooks = {p.id: p for p in batch.playbooks}
        self.accepted_facts: list[str] = []
        self.accepted_triggers: list[str] = []
        self.seen_outcomes: set[tuple[str, str]] = set()

    def check(self, raw: object) -> Decision:
        kind = raw.get("kind", "?") if isinstance(raw, dict) else "?"
        try:
            proposal = PROPOSAL.validate_python(raw)
        except PydanticError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'proposal'}: {e['msg']}"
                                 for e in exc.errors())
            return Decision(kind, raw if isinstance(raw, dict) else {"value": raw}, False, f"schema: {problems}")
        reason = self.episodes_reason(proposal.supporting_episode_ids)
        if reason is None:
            reason = self.kind_reason(proposal)
        return Decision(proposal.kind, proposal.model_dump(), reason is None, reason)

    def kind_reason(self, proposal: FactProposal | PlaybookProposal | OutcomeProposal) -> str | None:
        """The check of the proposal's own kind."""
        if isinstance(proposal, FactProposal):
            return self.fact_reason(proposal)
        if isinstance(proposal, PlaybookProposal):
            return self.playbook_reason(proposal)
        return self.outcome_reason(proposal)

    def episodes_reason(self, ids: Sequence[str]) -> str | None:
        """Supporting episodes exist, are the user's, and one is new (the watermark: no proposal from old episodes)."""
        unknown = [i for i in ids if i not in self.known_episodes]
        for episode_id in unknown:
            try:
                self.known_episodes[episode_id] = prove_ownership(self.store, self.batch.user_id, episode_id,
                                                        types=("episodic",)).source["text"]
            except AtlasError:
                return f"supporting episode {episode_id} is not an episode of {self.batch.user_id}"
        if not any(i in self.new_episodes for i in ids):
            return "no supporting episode is new since the watermark"
        return None

    def fact_reason(self, fact: FactProposal) -> str | None:
        said = " ".join(self.known_episodes[i] for i in fact.supporting_episode_ids)
        if not content_words(fact.text, ignore=[self.batch.user_name]) & content_words(said):
            return "shares no word with its supporting episodes: not the user's own words"
        if fact.confidence < self.min_confidence:
            return f"confidence {fact.confidence:.2f} is below the floor {self.min_confidence:.2f}"
        stale = [i for i in fact.supersedes_id if i not in self.facts]
        if stale:
            return f"supersedes {', '.join(stale)}, which is not a current fact of {self.batch.user_id}"
        duplicate = self.duplicate_of(fact)
        if duplicate is not None:
            return f"duplicate (cosine >= {self.dedup_similarity:.2f}) of {duplicate!r}"
        self.accepted_facts.append(fact.text)
        return None

    def duplicate_of(self, fact: FactProposal) -> str | None:
        """The current fact (by hybrid recall) or earlier proposal of this run that says the same thing."""
        hits = recall(self.store, self.batch.user_id, clip_query(fact.text), k=C.RECALL_K, types=("semantic",),
                      mode="hybrid").hits
        candidates = [h.text for h in hits if h.current and h.id not in fact.supersedes_id] + self.accepted_facts
        if not candidates:
            return None
        scores = self.batch.similarity(fact.text, candidates)
        best = int(np.argmax(scores))
        return candidates[best] if scores[best] >= self.dedup_similarity else None

    def playbook_reason(self, playbook: PlaybookProposal) -> str | None:
        triggers = [p.trigger for p in self.batch.playbooks if p.trigger] + self.accepted_triggers
        if triggers:
            scores = self.batch.similarity(playbook.trigger, triggers)
            best = int(np.argmax(scores))
            if scores[best] >= self.trigger_similarity:
                return f"an existing playbook already covers this trigger ({triggers[best]!r})"
        self.accepted_triggers.append(playbook.trigger)
        return None

    def outcome_reason(self, outcome: OutcomeProposal) -> str | None:
        if outcome.playbook_id not in self.playbooks:
            return f"{outcome.playbook_id} is not a playbook of {self.batch.user_id}"
        key = (outcome.playbook_id, outcome.supporting_episode_ids[0])
        if key in self.seen_outcomes:
            return "the same feedback was already counted in this run"
        self.seen_outcomes.add(key)
        return None


# --- plans: write first, apply with a journal, then done ----------------------------------------------


def source_key(run: str, step: int) -> str:
    """Marks a memory written by a plan step, so a resumed plan finds it instead of writing it twice."""
    return f"consolidation:{run}:{step}"


def _save_plan(store: Store, user_id: str, plan: dict) -> None:
    plan["updated_at"] = es_date(store.now())
    store.es.index(index=state_name(store.prefix), id=f"plan-{user_id}", document=plan, refresh=True)


def _busy(user_id: str) -> ConflictError:
    return ConflictError(f"another consolidation of {user_id} is running or was interrupted: run "
                         f"`atlas consolidate --user {user_id}` again to finish it first")


def new_plan(store: Store, user_id: str, proposer: str, actions: list[dict], start: Watermark,
             watermark: Watermark) -> dict:
    """Write the plan before anything else (OCC on `plan-<user>`).

    Refused while another run's plan is pending, and when another run moved the watermark
    since this one read its batch from `start` (it would apply the same episodes twice).
    """
    ensure_state_name(store)
    doc_id = f"plan-{user_id}"
    try:
        current = store.es.get(index=state_name(store.prefix), id=doc_id)
    except NotFoundError:
        current = None
    if current is not None and current["_source"]["status"] == "pending":
        raise _busy(user_id)
    if read_watermark(store, user_id) != start:
        raise ConflictError(f"another run consolidated {user_id} while this one was proposing: nothing was "
                            "written, run it again")
    number = current["_source"]["number"] + 1 if current is not None else 1
    plan = {"kind": "plan", "user_id": user_id, "number": number, "status": "pending", "proposer": proposer,
            "actions": actions, "journal": {}, "watermark": asdict(watermark), "updated_at": es_date(store.now())}
    occ = {"op_type": "create"} if current is None else \
        {"if_seq_no": current["_seq_no"], "if_primary_term": current["_primary_term"]}
    try:
        store.es.index(index=state_name(store.prefix), id=doc_id, document=plan, refresh=True, **occ)
    except ESConflict:
        raise _busy(user_id) from None
    return plan


def _find_written(store: Store, user_id: str, key: str) -> str | None:
    indices = ",".join(index_name(store.prefix, t) for t in ("semantic", "procedural"))
    store.es.indices.refresh(index=indices)
    hits = store.es.search(index=indices, routing=user_id, query={"bool": {"filter": [{"term": {"source_key": key}},
                                                                      {"term": {"user_id": user_id}}]}},
                           size=1, source=False)["hits"]["hits"]
    return hits[0]["_id"] if hits else None


def _apply_step(store: Store, user_id: str, plan: dict, step: int) -> None:
    """Apply one action unless it already was (idempotent, so a crashed plan can be resumed).

    An outcome update cannot be recognised by a key, so the playbook's counters are journaled
    (saved) before it is applied: a resumed step that finds them changed was applied already.
    """
    action, journal = plan["actions"][step], plan["journal"]
    p = action["proposal"]
    entry = journal.setdefault(str(step), {"state": "started"})
    if action["kind"] == "outcome":
        current = prove_ownership(store, user_id, p["playbook_id"], types=("procedural",)).source
        if "before" not in entry:
            entry["before"] = {k: current.get(k) for k in OUTCOME_FIELDS}
            _save_plan(store, user_id, plan)
        elif any(current.get(k) != entry["before"].get(k) for k in ("success_count", "failure_count")):
            entry["state"] = "done"  # applied before the crash
            return
        record_outcome(store, user_id, p["playbook_id"], p["success"], refined_steps=p.get("refined_steps") or None)
        entry.update(state="done", id=p["playbook_id"])
        return
    key = source_key(f"{user_id}-{plan['number']}", step)
    written = _find_written(store, user_id, key)
    if written is None:
        written = _write(store, user_id, action["kind"], p, key)
    entry.update(state="done", id=written)


def _write(store: Store, user_id: str, kind: str, p: dict, key: str) -> str:
    if kind == "fact" and p.get("supersedes_id"):
        return supersede(store, user_id, p["supersedes_id"], p["text"], "semantic", contradiction=p["contradiction"],
                         confidence=p["confidence"], fact_type=p["fact_type"],
                         supporting_episode_ids=p["supporting_episode_ids"], source_key=key)
    if kind == "fact":
        doc = build_document(user_id, p["text"], "semantic", store.now(), fact_type=p["fact_type"],
                             confidence=float(p["confidence"]), supporting_episode_ids=p["supporting_episode_ids"],
                             source_key=key)
    else:
        text = f"{p['name']}. Use when: {p['trigger']}. Steps: " + " ".join(
            f"{i}) {s}" for i, s in enumerate(p["steps"], start=1))
        doc = build_document(user_id, text, "procedural", store.now(), name=p["name"], trigger=p["trigger"],
                             steps=p["steps"], supporting_episode_ids=p["supporting_episode_ids"], source_key=key)
    return bulk_load(store, [doc], progress=False)[0]


def _restoring(saved: dict) -> Callable[[dict], dict]:
    """An `update_owned` change that puts the `saved` fields back, whatever the document holds now."""
    return lambda _: dict(saved)


def _rollback(store: Store, user_id: str, plan: dict) -> None:
    """Undo the journal's done steps, newest first (`_undo_step`).

    Every document is first read through the user's key (`prove_ownership`), so a journal that names
    another user's document (a bug, an edited state document) changes nothing of theirs: a document
    that is not the user's, or no longer exists, has nothing to undo.
    """
    for step in sorted(plan["journal"], key=int, reverse=True):
        entry, action = plan["journal"][step], plan["actions"][int(step)]
        if entry.get("state") != "done":
            continue
        try:
            _undo_step(store, user_id, action, entry)
        except NotFound:
            continue


def _undo_step(store: Store, user_id: str, action: dict, entry: dict) -> None:
    """Restore a playbook's counters, or delete a new memory and make current again the facts it retired."""
    if action["kind"] == "outcome":
        playbook = prove_ownership(store, user_id, entry["id"], types=("procedural",))
        update_owned(store, user_id, playbook, _restoring(entry["before"]), refresh=store.refresh)
        return
    memory_type: C.MemoryType = "semantic" if action["kind"] == "fact" else "procedural"
    written = prove_ownership(store, user_id, entry["id"], types=(memory_type,))
    for old_id in action["proposal"].get("supersedes_id") or []:
        try:
            old = prove_ownership(store, user_id, old_id, types=("semantic",))
        except NotFound:
            continue
        if old.source.get("superseded_by") == written.id:
            update_owned(store, user_id, old, _unmarking(written.id), refresh=store.refresh)
    store.es.delete(index=written.index, id=written.id, routing=written.routing, refresh=store.refresh)


def _unmarking(new_id: str) -> Callable[[dict], dict]:
    """An `update_owned` change that makes a fact current again, if `new_id` is still what retired it."""
    return lambda source: {"superseded_by": None, "superseded_at": None} \
        if source.get("superseded_by") == new_id else {}


def apply_plan(store: Store, user_id: str, plan: dict) -> dict:
    """Apply a pending plan to the end, then move the watermark and mark it done; on a refusal, roll back."""
    repair(store, user_id)  # finish a supersession a crash interrupted
    try:
        for step in range(len(plan["actions"])):
            if plan["journal"].get(str(step), {}).get("state") == "done":
                continue
            _apply_step(store, user_id, plan, step)
            _save_plan(store, user_id, plan)
    except AtlasError as exc:
        _rollback(store, user_id, plan)
        plan.update(status="rolled_back", error=f"{type(exc).__name__}: {exc}")
        _save_plan(store, user_id, plan)
        exc.add_note(f"consolidation of {user_id} was rolled back: nothing of this run was kept")
        raise
    store.es.index(index=state_name(store.prefix), id=f"watermark-{user_id}", refresh=True,
                   document={"kind": "watermark", "user_id": user_id, **plan["watermark"],
                             "updated_at": es_date(store.now())})
    plan["status"] = "done"
    _save_plan(store, user_id, plan)
    return plan


# --- runs ----------------------------------------------------------------------------------------


@dataclass
class ConsolidationReport:
    user_id: str
    proposer: str
    episodes: int
    decisions: list[Decision] = field(default_factory=list)
    #: "applied", "dry run", "nothing new", "resumed" (a pending plan was finished first), or "failed"
    #: (by `consolidate_all`: the run raised `error`, having written nothing, been rolled back, or left a pending plan).
    status: str = "applied"
    watermark: Watermark = field(default_factory=Watermark)
    #: Why the run failed ("OverflowError: date value out of range"), when `status` is "failed".
    error: str | None = None
    #: Memories whose `hubness` the run wrote again (`atlas.core.hubness.refresh_hubness`, after applying).
    hubness: int = 0

    @property
    def accepted(self) -> list[Decision]:
        return [d for d in self.decisions if d.accepted]

    @property
    def rejected(self) -> list[Decision]:
        return [d for d in self.decisions if not d.accepted]


def _decisions_of(plan: dict) -> list[Decision]:
    return [Decision(a["kind"], a["proposal"], True, None, plan["journal"].get(str(i), {}).get("id"))
            for i, a in enumerate(plan["actions"])]


def consolidate(store: Store, user_id: str, *, proposer: Proposer | None = None, limit: int = C.CONSOLIDATION_BATCH,
                dry_run: bool = False, user_name: str | None = None,
                **guard_options: Unpack[GuardOptions]) -> ConsolidationReport:
    """One run for one user: finish a pending plan, read the batch, propose, guard, plan, apply, then refresh the
    user's hubness."""
    check_user(user_id)
    proposer = proposer or default_proposer()
    pending = read_plan(store, user_id)
    if pending is not None and pending["status"] == "pending" and not dry_run:
        plan = apply_plan(store, user_id, pending)
        return ConsolidationReport(user_id, plan["proposer"], 0, _decisions_of(plan), "resumed",
                                   Watermark(plan["watermark"]["timestamp"], tuple(plan["watermark"]["ids"])))
    watermark = read_watermark(store, user_id)
    batch = read_batch(store, user_id, watermark, limit=limit, user_name=user_name)
    report = ConsolidationReport(user_id, proposer.name, len(batch.episodes), watermark=watermark)
    if not batch.episodes:
        report.status = "nothing new"
        return report
    guards = Guards(store, batch, **guard_options)
    # Facts first: a fact's dedup may then see an earlier proposal of the same run.
    raw = sorted(proposer.propose(batch), key=lambda p: 0 if isinstance(p, dict) and p.get("kind") == "fact" else 1)
    report.decisions = [guards.check(p) for p in raw]
    report.watermark = watermark.advance(batch.episodes)
    if dry_run:
        report.status = "dry run"
        return report
    actions = [{"kind": d.kind, "proposal": d.proposal} for d in report.accepted]
    plan = apply_plan(store, user_id, new_plan(store, user_id, proposer.name, actions, watermark, report.watermark))
    for decision, done in zip(report.accepted, _decisions_of(plan), strict=True):
        decision.id = done.id
    # The new episodes (and what the plan wrote) change which of the user's memories are hubs.
    report.hubness = refresh_hubness(store, user_id)
    return report


def consolidate_all(store: Store, *, proposer: Proposer | None = None, users: Sequence[str] | None = None,
                    progress: bool = True, **options: Unpack[RunOptions]) -> dict[str, ConsolidationReport]:
    """Consolidate every user (or `users`), one run each, with a progress bar.

    One user's failure never stops the others: whatever their run raises (bad data, a proposer's
    bug, a refused step) is their report, with status "failed" and the error, and the run goes on.
    """
    proposer = proposer or default_proposer()
    reports = {}
    chosen = users if users is not None else users_with_memory(store, types=("episodic",))
    for user_id in tqdm(chosen, desc="consolidating", unit="user", disable=not progress):
        try:
            reports[user_id] = consolidate(store, user_id, proposer=proposer, **options)
        except Exception as exc:  # whatever it is: the other users' runs must not depend on it
            reports[user_id] = ConsolidationReport(user_id, proposer.name, 0, status="failed", error=failure(exc))
    return reports


def failure(exc: Exception) -> str:
    """What a run raised, on one line with its notes ("... was rolled back: nothing of this run was kept")."""
    return "; ".join([f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", ())])


def maybe_consolidate(store: Store, user_id: str, *, every: int = C.CONSOLIDATE_EVERY,
                      proposer: Proposer | None = None, **options: Unpack[RunOptions]) -> ConsolidationReport | None:
    """Consolidate once the user has `every` new episodes past the watermark (call it after each turn)."""
    if every < 1:
        raise ValidationError(f"every must be at least 1, not {every}")
    if count_new_episodes(store, user_id) < every:
        return None
    return consolidate(store, user_id, proposer=proposer, **options)
