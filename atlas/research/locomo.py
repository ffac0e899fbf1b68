"""The LoCoMo benchmark (Maharana et al., ACL 2024) as Atlas sees it, free of Elasticsearch.

Each conversation becomes one tenant, each dialog turn one episodic memory whose
``source_key`` (``"<sample_id>:<dia_id>"``) is what a question's evidence names,
so retrieval is scored by comparing ranked source keys with the evidence.

The data is CC BY-NC 4.0 and never lives in the repository: it is read from the
shared development split, from ``ATLAS_LOCOMO_PATH``, or from the git-ignored cache.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from atlas.config import REPO_ROOT
from atlas.core.passages import context_before

PATH_ENV_VAR = "ATLAS_LOCOMO_PATH"
#: The development split (7 of the 10 conversations), shared beside the repository.
DEV_PATH = REPO_ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
#: Where to put the full upstream file (snap-research/locomo, data/locomo10.json) by hand.
CACHE_PATH = REPO_ROOT / ".cache" / "locomo" / "locomo10.json"

#: Numeric labels of the data (upstream code), not the order of the paper's prose.
CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
MAIN_CATEGORIES = (1, 2, 3, 4)
#: Unanswerable questions: the right reply is that the conversation does not say.
ADVERSARIAL = 5

#: The paper's retrieval baseline to beat: dialog turns as units, DRAGON retriever,
#: fraction of evidence retrieved, over all questions. Upstream scores a question
#: without evidence as recall 1 and counts malformed evidence strings as misses.
PAPER_REFERENCE: dict[str, Any] = {
    "r@5": 0.567,
    "r@10": 0.662,
    "r@25": 0.767,
    "r@10_by_category": {
        "single-hop": 0.777,
        "multi-hop": 0.466,
        "temporal": 0.773,
        "open-domain": 0.408,
        "adversarial": 0.547,
    },
}

#: Published LoCoMo retrieval figures at the level of sessions (a hit is any turn of a gold session), as cited in
#: issue 22. They are context, not head-to-head results: other retrievers, and all 10 conversations.
SESSION_REFERENCES: dict[str, dict[str, float]] = {
    "BM25 + max-sim dense, z-score fusion (2026 study, 10 conversations)": {"hit@1": 0.752, "r@5": 0.894,
                                                                           "ndcg@5": 0.829},
    "hybrid without an LLM (published)": {"r@10": 0.889},
}

TENANT_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"^D:?(\d+):(\d+)$")
_EVIDENCE_SEPARATORS = re.compile(r"[;,\s]+")
_DATE_TIME_FORMAT = "%I:%M %p on %d %B, %Y"


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    blip_caption: str | None


@dataclass(frozen=True)
class Session:
    number: int
    started_at: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: tuple[Session, ...]
    #: The raw QA items; ``questions`` interprets them.
    qa: tuple[dict[str, Any], ...]

    @property
    def tenant_id(self) -> str:
        return tenant_id(self.sample_id)

    @property
    def dia_ids(self) -> frozenset[str]:
        return frozenset(turn.dia_id for session in self.sessions for turn in session.turns)


@dataclass(frozen=True)
class Question:
    qid: str
    tenant_id: str
    question: str
    category: int
    category_name: str
    #: Source keys of the evidence turns, normalised, deduplicated, in annotation order.
    evidence: list[str]
    #: None when the item has none (most adversarial questions).
    answer: str | None
    #: The plausible wrong answer of an adversarial question.
    adversarial_answer: str | None
    #: Evidence references that name no turn of the conversation (annotation glitches).
    dropped_evidence: list[str]


def tenant_id(sample_id: str) -> str:
    """One tenant per conversation, e.g. ``conv-26`` -> ``locomo-conv-26``."""
    tid = f"locomo-{sample_id.lower()}"
    if not TENANT_ID_PATTERN.match(tid):
        raise ValueError(f"sample_id {sample_id!r} gives an invalid tenant id {tid!r}")
    return tid


def default_path() -> Path:
    """The data file to use: ``$ATLAS_LOCOMO_PATH``, else the shared dev split, else the cache."""
    if env := os.environ.get(PATH_ENV_VAR):
        return Path(env)
    return DEV_PATH if DEV_PATH.exists() or not CACHE_PATH.exists() else CACHE_PATH


def load_conversations(path: Path | None = None) -> list[Conversation]:
    """Read ``locomo_dev.json`` or upstream ``locomo10.json`` (same format)."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"LoCoMo data not found at {path}. Either use the shared development split "
            f"{DEV_PATH} (or point ${PATH_ENV_VAR} at a copy), or download upstream "
            f"locomo10.json from https://github.com/snap-research/locomo (data/locomo10.json) "
            f"into the git-ignored cache {CACHE_PATH.parent}/. The data is CC BY-NC 4.0: "
            f"never commit it."
        )
    with path.open(encoding="utf-8") as f:
        return [_conversation(raw) for raw in json.load(f)]


def parse_session_datetime(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> an aware UTC datetime (the data carries no zone)."""
    return datetime.strptime(text.strip(), _DATE_TIME_FORMAT).replace(tzinfo=UTC)


def _conversation(raw: dict[str, Any]) -> Conversation:
    """Build a conversation from its JSON; only ``session_<N>`` keys with turns count."""
    body = raw["conversation"]
    numbers = sorted(int(m[1]) for key in body if (m := _SESSION_KEY.match(key)) and body[key])
    sessions = tuple(
        Session(
            number=n,
            started_at=parse_session_datetime(body[f"session_{n}_date_time"]),
            turns=tuple(
                Turn(t["dia_id"], t["speaker"], t["text"], t.get("blip_caption") or None)
                for t in body[f"session_{n}"]
            ),
        )
        for n in numbers
    )
    return Conversation(
        sample_id=raw["sample_id"],
        speaker_a=body["speaker_a"],
        speaker_b=body["speaker_b"],
        sessions=sessions,
        qa=tuple(raw["qa"]),
    )


def source_key(sample_id: str, dia_id: str) -> str:
    """The key that ties a memory to the evidence naming its turn."""
    return f"{sample_id}:{dia_id}"


def session_of(key: str) -> str:
    """The session a turn's source key belongs to: ``"conv-26:D3:5"`` -> ``"conv-26:D3"``."""
    return key.rsplit(":", 1)[0]


def turn_text(turn: Turn) -> str:
    """Speaker-prefixed text; a shared image is kept as its caption, the only trace of it."""
    text = f"{turn.speaker}: {turn.text}"
    return f"{text} [shared image: {turn.blip_caption}]" if turn.blip_caption else text


def turn_memories(conv: Conversation) -> list[dict[str, Any]]:
    """One episodic memory per turn, ready to write under the conversation's tenant.

    A session has one date, so turn i gets it plus i seconds: a recency sort then
    keeps the dialog order. Each turn's `context` is the `CONTEXT_MESSAGES` turns before it in its
    session, ending with the one it replies to, as the agent passes the last exchange
    (`write_episode(context=...)`).
    """
    return [
        {
            "text": turn_text(turn),
            "speaker": turn.speaker,
            "context": [turn_text(before) for before in context_before(session.turns, i)] or None,
            "timestamp": (session.started_at + timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
            "session_id": f"{conv.sample_id}:session_{session.number}",
            "source_key": source_key(conv.sample_id, turn.dia_id),
            "user_id": conv.tenant_id,
            "memory_type": "episodic",
        }
        for session in conv.sessions
        for i, turn in enumerate(session.turns)
    ]


def normalise_evidence(raw: Iterable[str]) -> list[str]:
    """Canonical dia ids from raw evidence strings, in order, without duplicates.

    Fixes the known glitches: several ids in one string (``"D8:6; D9:17"``,
    ``"D9:1 D4:4"``), ``"D:11:26"`` and zero-padded turns (``"D30:05"``). A token
    that is no dia id at all (``"D"``) is passed through for the caller to drop.
    """
    out: list[str] = []
    for entry in raw:
        for token in _EVIDENCE_SEPARATORS.split(entry.strip()):
            if not token:
                continue
            m = _DIA_ID.match(token)
            ref = f"D{int(m[1])}:{int(m[2])}" if m else token
            if ref not in out:
                out.append(ref)
    return out


def questions(conv: Conversation) -> list[Question]:
    """The conversation's QA items, with evidence as source keys of existing turns."""
    turns = conv.dia_ids
    result = []
    for i, qa in enumerate(conv.qa):
        refs = normalise_evidence(qa["evidence"])
        category = int(qa["category"])
        result.append(
            Question(
                qid=f"{conv.sample_id}:q{i}",
                tenant_id=conv.tenant_id,
                question=qa["question"],
                category=category,
                category_name=CATEGORY_NAMES[category],
                evidence=[source_key(conv.sample_id, r) for r in refs if r in turns],
                answer=_text_or_none(qa.get("answer")),
                adversarial_answer=_text_or_none(qa.get("adversarial_answer")),
                dropped_evidence=[r for r in refs if r not in turns],
            )
        )
    return result


def _text_or_none(value: Any) -> str | None:
    """Answers are mostly strings but a few are bare years (ints)."""
    return None if value is None else str(value)
