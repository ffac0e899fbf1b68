"""Evaluation data sets loaded into a store: the persona corpus and LoCoMo conversations.

Elasticsearch assigns the ids; each document keeps its data-set key in `source_key`,
which is what questions name, so a loader returns a `KeyMap` (key -> id) and scoring
compares ranked source keys with answer keys. Loading twice is a no-op: a loader first
reads back what the prefix holds and skips when it is exactly the data set, so a
notebook or CI run pays for indexing (and embedding, cached on disk) only once.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, get_args

from elasticsearch import helpers
from tqdm.auto import tqdm

from atlas.config import REPO_ROOT
from atlas.core.clock import es_date
from atlas.core.documents import build_document
from atlas.core.errors import AtlasError
from atlas.core.memory import bulk_load, parse_when
from atlas.core.passages import context_before
from atlas.core.scoring import smoothed_success_rate
from atlas.core.store import Store
from atlas.core.supersession import ended
from atlas.core.validation import check_choice
from atlas.research.locomo import Conversation, turn_memories

PERSONA_DIR = REPO_ROOT / "data" / "persona"
#: "Now" of the persona corpus (data/persona/README.md): every relative date in a question refers to it.
PERSONA_NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

#: Labels of persona questions (data/persona/README.md), also asked of a question generator.
QuestionKind = Literal["paraphrase", "exact-token", "collision", "temporal", "superseded-trap"]
QUESTION_KINDS: tuple[QuestionKind, ...] = get_args(QuestionKind)

#: Data-set key -> Elasticsearch id.
KeyMap = dict[str, str]

#: Corpus fields that name other documents by key; the loader turns them into ids.
_LINK_FIELDS = ("supersedes_keys", "supporting_episode_keys")
_DATE_FIELDS = ("timestamp", "created_at", "last_used_at", "last_success_at")
#: What a loaded document is compared on to decide that the prefix already holds the data set.
_STATE_FIELDS = ("text", "context", "user_id", "supersedes", "superseded_by", "supporting_episode_ids")


@dataclass(frozen=True)
class PersonaQuestion:
    """One line of qa.jsonl."""

    qid: str
    user_id: str
    question: str
    answer_keys: tuple[str, ...]
    memory_type: str
    kind: QuestionKind
    provenance: str


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_persona_corpus(path: Path = PERSONA_DIR) -> list[dict]:
    return read_jsonl(Path(path) / "corpus.jsonl")


def question_kind(value: object) -> QuestionKind:
    """`value` as one of `QUESTION_KINDS`; anything else is refused (`check_choice`)."""
    check_choice(value, QUESTION_KINDS, "question kind")
    return next(kind for kind in QUESTION_KINDS if kind == value)


def read_persona_questions(path: Path = PERSONA_DIR) -> list[PersonaQuestion]:
    """The questions; an unknown `kind` is refused, so per-kind tables never grow a misspelt row."""
    return [PersonaQuestion(q["qid"], q["user_id"], q["question"], tuple(q["answer_keys"]), q["memory_type"],
                            question_kind(q["kind"]),
                            q["provenance"])
            for q in read_jsonl(Path(path) / "qa.jsonl")]


# --- building documents (pure) ------------------------------------------------------------


def session_contexts(corpus: Sequence[Mapping]) -> dict[str, list[str]]:
    """key -> the texts of the `CONTEXT_MESSAGES` episodes before it in its session, oldest first.

    The corpus holds the user's turns only, so a turn's context is the user's previous messages,
    the nearest stand-in for the exchange it follows (episodes that open a session have none).
    """
    sessions: dict[str, list[Mapping]] = {}
    for raw in corpus:
        if raw["memory_type"] == "episodic" and raw.get("session_id"):
            sessions.setdefault(raw["session_id"], []).append(raw)
    contexts: dict[str, list[str]] = {}
    for turns in sessions.values():
        ordered = sorted(turns, key=lambda t: t["timestamp"])
        contexts |= {turn["key"]: [before["text"] for before in context_before(ordered, i)]
                     for i, turn in enumerate(ordered) if i}
    return contexts


def persona_document(raw: Mapping, context: list[str] | None = None) -> dict:
    """The stored form of one corpus line, without links (they need ids) and without vectors.

    Dates, counters and confidence are the data's; `build_document` fills only what a
    line leaves out (a fact never used has `last_used_at` = `created_at`). A playbook's
    smoothed success rate is derived from its counts, as `record_outcome` would keep it.
    """
    fields = {k: (parse_when(v) if k in _DATE_FIELDS else v) for k, v in raw.items()
              if k not in ("key", "memory_type", "user_id", "text", *_LINK_FIELDS)}
    written = fields.get("timestamp") or fields["created_at"]
    if raw["memory_type"] == "procedural":
        fields["success_rate"] = smoothed_success_rate(raw["success_count"], raw["failure_count"])
    return build_document(raw.get("user_id"), raw["text"], raw["memory_type"], written, source_key=raw["key"],
                          context=context, **fields)


def persona_documents(corpus: Sequence[Mapping]) -> list[dict]:
    """Every corpus line as stored, each episode with its session context."""
    contexts = session_contexts(corpus)
    return [persona_document(raw, contexts.get(raw["key"])) for raw in corpus]


def persona_links(corpus: Sequence[Mapping], ids: Mapping[str, str]) -> dict[str, dict]:
    """key -> partial document: supersession both ways and supporting episodes, as ids.

    An old fact is retired at the moment the fact that replaces it took its wording
    (`superseded_at` = the new fact's `created_at`) and held until the new one began to (`supersession.ended`),
    as `supersede()` would have done.
    """
    documents = {doc["source_key"]: doc for doc in persona_documents(corpus)}
    links: dict[str, dict] = {}
    for raw in corpus:
        olds = raw.get("supersedes_keys") or []
        if olds:
            links.setdefault(raw["key"], {})["supersedes"] = [ids[k] for k in olds]
            stamp = es_date(parse_when(raw["created_at"]))
            for old in olds:
                links.setdefault(old, {}).update(superseded_by=ids[raw["key"]], superseded_at=stamp,
                                                 **ended(documents[old], documents[raw["key"]]))
        if episodes := raw.get("supporting_episode_keys"):
            links.setdefault(raw["key"], {})["supporting_episode_ids"] = [ids[k] for k in episodes]
    return links


def locomo_documents(conversations: Iterable[Conversation]) -> list[dict]:
    """One episodic memory per dialog turn, each under its conversation's tenant."""
    docs = []
    for conv in conversations:
        for memory in turn_memories(conv):
            fields = {k: v for k, v in memory.items() if k not in ("user_id", "text", "memory_type", "timestamp")}
            docs.append(build_document(memory["user_id"], memory["text"], "episodic", parse_when(memory["timestamp"]),
                                       **fields))
    return docs


# --- loading ------------------------------------------------------------------------------


def _links_as_keys(fields: Mapping, key_of: Mapping[str, str]) -> dict:
    """`fields` with each link (an id or a list of ids) replaced by the key of the document it names."""
    out = dict(fields)
    for name in ("supersedes", "supporting_episode_ids", "superseded_by"):
        if name in out:
            value = out[name]
            out[name] = [key_of.get(i, i) for i in value] if isinstance(value, list) else key_of.get(value, value)
    return out


def stored_state(store: Store, keys: Iterable[str]) -> dict[str, dict]:
    """source_key -> {"id", and the fields a load is checked on, links as keys} of what the prefix holds."""
    wanted = list(keys)
    found: dict[str, dict] = {}
    for start in range(0, len(wanted), 10_000):
        query = {"terms": {"source_key": wanted[start:start + 10_000]}}
        for hit in helpers.scan(store.es, index=store.indices, query={"query": query},
                                _source_includes=["source_key", *_STATE_FIELDS, "hubness"]):
            source = dict(hit["_source"])
            key = source.pop("source_key")
            if key in found:
                raise AtlasError(f"prefix {store.prefix} holds {key} twice: drop it and load again")
            found[key] = {"id": hit["_id"], **source}
    key_of = {doc["id"]: key for key, doc in found.items()}
    return {key: _links_as_keys(doc, key_of) for key, doc in found.items()}


def _expected_state(docs: Sequence[dict], links: Mapping[str, dict], ids: Mapping[str, str]) -> dict[str, dict]:
    """What `stored_state` holds (without ids) after a complete load."""
    key_of = {doc_id: key for key, doc_id in ids.items()}
    merged = ({**doc, **links.get(doc["source_key"], {})} for doc in docs)
    return {doc["source_key"]: _links_as_keys({n: doc[n] for n in _STATE_FIELDS if n in doc}, key_of) for doc in merged}


def loaded_id(prefix: str, key: str) -> str:
    """The id of a loaded document: 20 URL-safe characters like Elasticsearch's own, the same on every load."""
    return base64.urlsafe_b64encode(hashlib.sha256(f"{prefix}/{key}".encode()).digest()[:15]).decode()


def load_once(store: Store, docs: Sequence[dict], name: str, *,
              link: Callable[[KeyMap], dict[str, dict]] | None = None, progress: bool = True) -> KeyMap:
    """Index `docs` unless the prefix already holds exactly them; returns source_key -> id (`loaded_id`).

    `link(ids) -> {key: partial doc}` adds fields that name other documents by id. A prefix holding
    part of the data set, or another version of it, is refused with advice rather than silently mixed.
    """
    keys = [doc["source_key"] for doc in docs]
    held = stored_state(store, keys)
    if held:
        ids = {key: doc["id"] for key, doc in held.items()}
        actual = {key: {k: v for k, v in doc.items() if k not in ("id", "hubness")} for key, doc in held.items()}
        if len(held) == len(docs) and actual == _expected_state(docs, link(ids) if link else {}, ids):
            return ids
        raise AtlasError(f"prefix {store.prefix} holds {len(held)} of the {len(docs)} documents of {name}, or another "
                         f"version of them: drop the prefix (Store.drop, or --fresh) and load again")
    # Ids are settled before indexing so that the links (and `bulk_load`'s hubness) are written with the documents:
    # a second pass of updates would leave old copies behind, which BM25's statistics count until Lucene merges them.
    ids = {key: loaded_id(store.prefix, key) for key in keys}
    links = link(ids) if link else {}
    loaded = [{**doc, **links.get(doc["source_key"], {})} for doc in docs]
    bulk_load(store, loaded, progress=progress, ids=list(ids.values()))
    return ids


def load_persona(store: Store, path: Path = PERSONA_DIR, *, progress: bool = True) -> KeyMap:
    """The persona corpus (4 users, shared catalog) with supersession applied; idempotent."""
    corpus = read_persona_corpus(path)
    return load_once(store, persona_documents(corpus), f"the persona corpus ({path})",
                     link=lambda ids: persona_links(corpus, ids), progress=progress)


def load_locomo(store: Store, conversations: Sequence[Conversation], *, progress: bool = True) -> KeyMap:
    """LoCoMo turns, one tenant per conversation; each conversation is loaded once, so a prefix grows from a subset."""
    ids: KeyMap = {}
    for conv in tqdm(conversations, desc="conversations", unit="conv", disable=not progress or len(conversations) < 2):
        ids |= load_once(store, locomo_documents([conv]), f"LoCoMo {conv.sample_id}", progress=progress)
    return ids
