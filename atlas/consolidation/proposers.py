"""Consolidation proposers: what a batch of episodes should become (facts, playbooks, outcome updates).

Three proposers share one interface, `propose(batch) -> list[dict]`, and none writes:
`atlas.consolidation.consolidate` checks every proposal with the same guards whoever made it.
`GuidedProposer` asks a model narrow questions, one episode at a time (`atlas.models.questions`: which facts it
states, which current facts each makes untrue, whether feedback says a playbook worked). `LLMProposer` asks a model
for the whole batch at once, as JSON that follows `ProposalSet`'s schema (a capable model's way; a small one times
out or answers nothing). `RuleProposer` is an offline BASELINE built from patterns, not understanding:
first-person statements become third-person facts, feedback phrases become outcome
updates, change cues ("now", "moved", "no longer", "actually") make supersession
candidates. Its measured precision and recall (data/consolidation/README.md) are the
bar a model has to beat; `default_proposer` picks by those measurements.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol, TypeVar

import numpy as np
from openai import OpenAI
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.core.passages import SENTENCE_END
from atlas.models.llm import LLMError, bullets, complete, json_format, llm_client, not_configured_message
from atlas.models.questions import (
    CONTRADICTION_QUESTION,
    OUTCOMES,
    UNTRUE_QUESTION,
    Model,
    UnusableAnswer,
    classify,
    content_words,
    extract_facts,
    outcome_question,
    pick,
)

# --- the batch a proposer sees -------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    id: str
    text: str
    timestamp: str
    session_id: str | None


@dataclass(frozen=True)
class Fact:
    id: str
    text: str
    fact_type: str | None


@dataclass(frozen=True)
class Playbook:
    id: str
    name: str
    trigger: str
    steps: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.name}. Use when: {self.trigger}. Steps: {' '.join(self.steps)}"


T = TypeVar("T")
#: Cosine similarity (`CONSOLIDATION_EMBEDDER`) of one text to each of several.
Similarity = Callable[[str, Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Batch:
    """One user's new episodes (oldest first, past the watermark) and what memory already holds."""

    user_id: str
    user_name: str
    episodes: tuple[Episode, ...]
    facts: tuple[Fact, ...]
    playbooks: tuple[Playbook, ...]
    similarity: Similarity


# --- what a proposal must look like ----------------------------------------------------------


class ProposalModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FactProposal(ProposalModel):
    kind: Literal["fact"] = "fact"
    text: str = Field(min_length=1, description="One third-person sentence from the user's own words.")
    fact_type: C.FactType
    confidence: float = Field(ge=0.0, le=1.0)
    supporting_episode_ids: list[str] = Field(min_length=1, description="Ids of the episodes that say it.")
    supersedes_id: list[str] = Field(default_factory=list, description="Ids of current facts this makes false.")
    contradiction: C.Contradiction | None = None

    @model_validator(mode="after")
    def _contradiction_with_supersedes(self) -> FactProposal:
        if self.supersedes_id and self.contradiction is None:
            raise ValueError("contradiction is required with supersedes_id")
        return self


class PlaybookProposal(ProposalModel):
    kind: Literal["playbook"] = "playbook"
    name: str = Field(min_length=1)
    trigger: str = Field(min_length=1, description="The situation the playbook fixes.")
    steps: list[str] = Field(min_length=2, description="The ordered steps that worked.")
    supporting_episode_ids: list[str] = Field(min_length=1)


class OutcomeProposal(ProposalModel):
    kind: Literal["outcome"] = "outcome"
    playbook_id: str = Field(min_length=1)
    success: bool
    refined_steps: list[str] = Field(default_factory=list, description="What worked instead, when the user says.")
    supporting_episode_ids: list[str] = Field(min_length=1)


Proposal = Annotated[FactProposal | PlaybookProposal | OutcomeProposal, Field(discriminator="kind")]
PROPOSAL = TypeAdapter(Proposal)


class ProposalSet(BaseModel):
    """What the LLM proposer must answer: its JSON schema is sent with the request."""

    facts: list[FactProposal] = Field(default_factory=list)
    playbooks: list[PlaybookProposal] = Field(default_factory=list)
    outcomes: list[OutcomeProposal] = Field(default_factory=list)


class Proposer(Protocol):
    name: str

    def propose(self, batch: Batch) -> list[dict]:
        """Raw proposals, each with a `kind`; validated and filtered by the caller's guards."""


# --- the LLM proposer ---------------------------------------------------------------------------

LLM_SYSTEM_PROMPT = f"""You consolidate the long-term memory of a smart-home support assistant.
You get one user's NEW messages (episodes, verbatim, oldest first), their current facts and their playbooks.
Propose, as JSON following the schema:
1. facts: durable statements the user made about themselves, their home, devices, people, routines or
   preferences. One third-person sentence each, using the user's name, built ONLY from the user's own words
   in the episodes (never from assistant advice they quote, questions, requests or hedged guesses).
   supporting_episode_ids: the ids of the episodes that say it. confidence 0-1 (lower when the user hedges).
   If a new fact makes current facts false, put ALL their ids in supersedes_id, with contradiction:
{bullets(C.CONTRADICTION_MEANINGS, indent="   ")}
   Do not restate a current fact that still holds.
2. playbooks: when the user reports that a multi-step fix worked and no existing playbook's trigger covers
   the problem: name, trigger, ordered steps.
3. outcomes: when the user reports that an existing playbook worked ("thanks, that worked") or did not
   ("that didn't help"): playbook_id and success; when they say what worked instead, refined_steps.
Propose nothing rather than something unsupported."""


def batch_prompt(batch: Batch) -> str:
    """The user part of the request: the batch as JSON."""
    return json.dumps({
        "user": {"id": batch.user_id, "name": batch.user_name},
        "episodes": [{"id": e.id, "time": e.timestamp, "session": e.session_id, "text": e.text}
                     for e in batch.episodes],
        "current_facts": [{"id": f.id, "text": f.text, "fact_type": f.fact_type} for f in batch.facts],
        "playbooks": [{"id": p.id, "name": p.name, "trigger": p.trigger, "steps": list(p.steps)}
                      for p in batch.playbooks],
    }, ensure_ascii=False, indent=1)


def parse_proposals(completion: ChatCompletion) -> list[dict]:
    """The answer's proposals as raw dicts with their kind; unusable JSON raises `LLMError` (retried)."""
    if not completion.choices or not completion.choices[0].message.content:
        raise LLMError("the answer is empty")
    try:
        data = json.loads(completion.choices[0].message.content)
    except json.JSONDecodeError as exc:
        raise LLMError(f"the answer is not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k, []), list) for k in ProposalSet.model_fields):
        raise LLMError(f"the answer is not an object of lists {', '.join(ProposalSet.model_fields)}")
    kinds = {"facts": "fact", "playbooks": "playbook", "outcomes": "outcome"}
    return [{**item, "kind": kinds[key]} if isinstance(item, dict) else item
            for key in kinds for item in data.get(key, [])]


def endpoint(settings: Settings, *, client: OpenAI | None, model: str | None) -> tuple[OpenAI, str]:
    """The client and model name a model proposer asks (the settings' unless given), or `LLMError` if none is set."""
    chosen_client = client or llm_client(settings)
    chosen_model = model or settings.llm_model
    if chosen_client is None or not chosen_model:
        raise LLMError(not_configured_message() + "; or use the offline RuleProposer")
    return chosen_client, chosen_model


class LLMProposer:
    """Proposals from a model through JSON-schema output; retried with backoff, then a clear `LLMError`."""

    name = "llm"

    def __init__(self, settings: Settings | None = None, *, client: OpenAI | None = None, model: str | None = None,
                 attempts: int = C.LLM_ATTEMPTS, backoff: float = C.LLM_BACKOFF,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.settings = settings or load_settings()
        self.client, self.model = endpoint(self.settings, client=client, model=model)
        self.attempts, self.backoff, self.sleep = attempts, backoff, sleep

    def propose(self, batch: Batch) -> list[dict]:
        return complete(self.client, model=self.model, parse=parse_proposals,
                        messages=[{"role": "system", "content": LLM_SYSTEM_PROMPT},
                                  {"role": "user", "content": batch_prompt(batch)}],
                        response_format=json_format(self.settings, "consolidation", ProposalSet.model_json_schema()),
                        temperature=0,
                        attempts=self.attempts, backoff=self.backoff, sleep=self.sleep)


# --- the rule baseline ---------------------------------------------------------------------------

EMOJI = re.compile(r"[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F]")

POSITIVE = re.compile(r"\b(that|it) (worked|did the trick)|\bdid the trick\b|\bsorted\b|\bworking again\b|"
                      r"\bfixed it\b|\b(been|worked) (solid|fine|great) since\b|\bsolid since\b", re.I)
NEGATIVE = re.compile(r"\bdid(n'?t| not) (help|work|fix)|\bno luck\b|\bmade no difference\b|\bstill (not|broken)\b",
                      re.I)
FIX = re.compile(r"\b(what fixed it was|in the end|did the trick|sorted it|solid since|fixed it)\b", re.I)
QUESTION_START = re.compile(r"^(how|what|why|when|where|which|who|is|are|can|could|would|will|do|does|did|should)\b",
                            re.I)
REQUEST = re.compile(r"\b(can|could|would|will) you\b|\bplease\b|\blet me know\b", re.I)
ASSISTANT = re.compile(r"\byou (said|told|suggested|mentioned)\b|\blike you\b|\byour (steps|advice|suggestion)\b", re.I)
FIRST_PERSON = re.compile(r"\b(I|I'm|I've|I'd|I'll)\b|\b(my|me|mine|we|we're|we've|we'd|our|us)\b", re.I)
HEDGE = re.compile(r"\b(I think|maybe|might|not sure|probably|I guess|perhaps)\b", re.I)
CHANGE = re.compile(r"\b(now|no longer|not any ?more|no more|moved|switched|changed|instead|these days)\b", re.I)
CORRECTION = re.compile(r"\b(actually|wrong|misread|mistake|correction|I meant)\b|\bnot an? \w+", re.I)
LEADING = re.compile(r"^((hi|hiya|hello|hey|ok|okay|right|so|lol|sorry|morning|thanks)\b[,!.]?\s*)+", re.I)
THANKS = re.compile(r"\bthank(s| you)\b|\bcheers\b", re.I)
STEP_SPLIT = re.compile(r",\s*(?:and\s+)?(?:then\s+)?|\s+then\s+|\s+and then\s+")
ADVERBS = {"really", "just", "also", "never", "still", "always", "usually", "often", "already", "only", "now",
           "sometimes", "definitely", "actually", "mostly", "rarely"}
#: Modals and common irregular past tenses: they read the same after any subject.
UNCHANGED = {"can", "could", "will", "would", "should", "must", "might", "may", "shall", "was", "did", "had", "got",
             "took", "made", "bought", "went", "put", "set", "left", "sent", "kept", "found", "gave", "told", "thought",
             "said", "came", "saw", "knew", "ran", "paid", "built", "began", "brought", "read", "misread", "forgot",
             "broke", "fell", "held", "lost", "met", "spent", "stuck", "woke", "wrote", "cut", "hit", "let", "shut"}
IRREGULAR = {"have": "has", "do": "does", "don't": "doesn't", "am": "is", "are": "is", "go": "goes", "were": "was",
             "haven't": "hasn't", "aren't": "isn't", "'m": "is", "'ve": "has", "'re": "is"}
#: fact_type by keyword, first match wins (people before devices: "my partner's phone" is about a person).
FACT_TYPE_WORDS: dict[str, tuple[str, ...]] = {
    "person": ("daughter", "son", "partner", "wife", "husband", "mum", "mother", "dad", "father", "parents", "baby",
               "dog", "cat", "puppy", "spaniel", "kids", "children", "brother", "sister", "cleaner", "nanny"),
    "preference": ("prefer", "like", "love", "hate", "rather", "don't want", "never suggest", "allergic", "want"),
    "routine": ("every", "weekday", "weekend", "nights", "shift", "schedule", "remote", "office", "commute",
                "usually", "trip", "holiday", "booked"),
    "location": ("live", "moved to", "city", "town", "address"),
    "device": ("hub", "firmware", "sensor", "bulb", "plug", "router", "extender", "repeater", "camera", "lock",
               "thermostat", "speaker", "doorbell", "widget", "phone", "purifier", "tariff"),
    "issue": ("error", "e-0x", "broken", "keeps", "dropping", "offline", "crash"),
    "home": ("room", "kitchen", "hallway", "wall", "shelf", "cupboard", "garage", "garden", "annex", "flat", "house"),
}


def clean(text: str) -> str:
    return " ".join(EMOJI.sub(" ", text).split())


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(clean(text)) if s.strip()]


def third_person_verb(word: str) -> str:
    """The he/she form of a verb that followed "I" or "we" (past tenses and modals stay)."""
    lower = word.lower()
    if lower in IRREGULAR:
        return IRREGULAR[lower]
    if lower in UNCHANGED or lower.endswith(("ed", "n't")) or not lower.isalpha():
        return word
    if lower.endswith(("s", "sh", "ch", "x", "z", "o")):
        return word + "es"
    if lower.endswith("y") and lower[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def third_person(sentence: str, name: str) -> str:
    """"I've moved my hub" -> "Sarah has moved Sarah's hub": pronouns to the name, verbs agreed."""
    words = sentence.split()
    out: list[str] = []
    conjugate = False
    for word in words:
        core = word.rstrip(",.;:!")
        tail = word[len(core):]
        lower = core.lower()
        if core in ("I", "I'm", "I've", "I'd", "I'll") or lower in ("we", "we're", "we've", "we'd", "we'll"):
            subject = name if core.startswith("I") else f"{name}'s household"
            contraction = core[core.index("'"):] if "'" in core else ""
            out.append(subject + ("" if not contraction else " " + {"'m": "is", "'ve": "has", "'re": "is",
                                                                     "'d": "would", "'ll": "will"}[contraction]) + tail)
            conjugate = not contraction and not tail
        elif lower in ("my", "our", "mine"):
            out.append(f"{name}'s{tail}")
            conjugate = False
        elif lower in ("me", "myself", "us"):
            out.append(name + tail)
            conjugate = False
        elif conjugate and lower in ADVERBS:
            out.append(word)
        elif conjugate:
            out.append(third_person_verb(core) + tail)
            conjugate = False
        else:
            out.append(word)
    text = " ".join(out)
    return text[0].upper() + text[1:]


def fact_type_of(text: str) -> str:
    lower = text.lower()
    for fact_type, words in FACT_TYPE_WORDS.items():
        if any(re.search(rf"\b{re.escape(w)}", lower) for w in words):
            return fact_type
    return "other"


def is_statement(sentence: str) -> bool:
    """A first-person statement of the user's own: not a question, request, feedback or quote of the assistant."""
    body = LEADING.sub("", sentence)
    return (len(body.split()) >= 4 and not body.endswith("?") and not QUESTION_START.match(body)
            and not REQUEST.search(body) and not ASSISTANT.search(body) and not POSITIVE.search(body)
            and not NEGATIVE.search(body) and not THANKS.search(body) and bool(FIRST_PERSON.search(body)))


def fix_clause(text: str) -> str:
    """What worked, from "in the end what fixed it was X" or "X did the trick"."""
    body = clean(text)
    match = re.search(r"what fixed it was (.+?)[.!]?$", body, re.I)
    if match:
        return match.group(1).strip()
    head = re.split(FIX, body, maxsplit=1)[0].strip(" ,.;")
    return re.sub(r"^(in the end|finally)\s*,?\s*", "", head, flags=re.I) or body


def action_steps(text: str) -> list[str]:
    """The actions of a "did A, B, then C, and it worked" message, feedback and problem left out."""
    parts = [s for s in sentences(text) if FIRST_PERSON.search(s) and not POSITIVE.fullmatch(s)]
    steps = []
    for part in parts:
        for clause in STEP_SPLIT.split(part.rstrip(".!")):
            clause = re.sub(r"^(I|we)\s+", "", clause.strip(), flags=re.I)
            if len(clause.split()) >= 2 and not POSITIVE.search(clause) and not THANKS.search(clause):
                steps.append(clause[0].upper() + clause[1:])
    return steps


def fix_after(episodes: Sequence[Episode], at: int) -> Episode | None:
    """The first later episode of the same session that says what fixed it ("in the end what fixed it was X")."""
    return next((e for e in episodes[at + 1:] if e.session_id == episodes[at].session_id and FIX.search(e.text)), None)


class RuleProposer:
    """The offline baseline (see the module docstring): fast, deterministic, and honest about its limits."""

    name = "rule"

    def __init__(self, *, supersede_similarity: float = C.CONSOLIDATION_RULE_SUPERSEDE_SIMILARITY,
                 playbook_similarity: float = C.CONSOLIDATION_RULE_PLAYBOOK_SIMILARITY,
                 hedged_confidence: float = 0.5, confidence: float = 0.8) -> None:
        self.supersede_similarity = supersede_similarity
        self.playbook_similarity = playbook_similarity
        self.hedged_confidence, self.confidence = hedged_confidence, confidence

    def propose(self, batch: Batch) -> list[dict]:
        outcomes, consumed = self.outcomes(batch)
        facts = [fact for e in batch.episodes for fact in self.facts(batch, e)]
        return facts + outcomes + self.playbooks(batch, consumed)

    # facts ---------------------------------------------------------------------------------

    def facts(self, batch: Batch, episode: Episode) -> list[dict]:
        proposals = []
        for sentence in sentences(episode.text):
            if not is_statement(sentence):
                continue
            text = third_person(LEADING.sub("", sentence), batch.user_name).rstrip(",;:")
            text = text if text.endswith((".", "!")) else text + "."
            proposal = {"kind": "fact", "text": text, "fact_type": fact_type_of(sentence),
                        "confidence": self.confidence_of(sentence), "supporting_episode_ids": [episode.id]}
            proposals.append({**proposal, **self.supersession(batch, sentence, text)})
        return proposals

    def confidence_of(self, text: str) -> float:
        """Lower when the user hedges ("I think", "maybe")."""
        return self.hedged_confidence if HEDGE.search(text) else self.confidence

    def supersession(self, batch: Batch, sentence: str, text: str) -> dict:
        """A change or correction cue retires the most similar current fact, if similar enough."""
        correction = bool(CORRECTION.search(sentence))
        if not batch.facts or not (correction or CHANGE.search(sentence)):
            return {}
        scores = batch.similarity(text, [f.text for f in batch.facts])
        best = int(np.argmax(scores))
        if scores[best] < self.supersede_similarity:
            return {}
        return {"supersedes_id": [batch.facts[best].id], "contradiction": "harsh" if correction else "natural"}

    # outcomes ------------------------------------------------------------------------------

    def playbook_for(self, batch: Batch, context: str) -> Playbook | None:
        if not batch.playbooks:
            return None
        scores = batch.similarity(context, [p.describe() for p in batch.playbooks])
        best = int(np.argmax(scores))
        return batch.playbooks[best] if scores[best] >= self.playbook_similarity else None

    def outcomes(self, batch: Batch) -> tuple[list[dict], set[str]]:
        """Feedback phrases -> outcome updates; a failure followed by "what fixed it was X" gets X as refined step.

        Returns the proposals and the episodes they used up (a fix after a failure is not a success).
        """
        proposals: list[dict] = []
        consumed: set[str] = set()
        episodes = list(batch.episodes)
        for at, episode in enumerate(episodes):
            if episode.id in consumed:
                continue
            negative, positive = NEGATIVE.search(episode.text), POSITIVE.search(episode.text)
            if not (negative or positive):
                continue
            session = [e.text for e in episodes[:at + 1] if e.session_id == episode.session_id]
            playbook = self.playbook_for(batch, " ".join(session))
            if playbook is None:
                continue
            supporting = [episode.id]
            proposal = {"kind": "outcome", "playbook_id": playbook.id, "success": not negative,
                        "supporting_episode_ids": supporting}
            consumed.add(episode.id)
            if negative and (fix := fix_after(episodes, at)) is not None:
                proposal["refined_steps"] = [fix_clause(fix.text)]
                supporting.append(fix.id)
                consumed.add(fix.id)
            proposals.append(proposal)
        return proposals, consumed

    # new playbooks -------------------------------------------------------------------------

    def playbooks(self, batch: Batch, consumed: set[str]) -> list[dict]:
        """A reported multi-step fix that no playbook matched becomes a playbook candidate."""
        proposals = []
        for episode in batch.episodes:
            if episode.id in consumed or not POSITIVE.search(episode.text):
                continue
            steps = action_steps(episode.text)
            if len(steps) < 3:
                continue
            problem = sentences(episode.text)[0].rstrip(".!")
            proposals.append({"kind": "playbook", "name": f"Fix: {problem[:60]}", "trigger": problem, "steps": steps,
                              "supporting_episode_ids": [episode.id]})
        return proposals


# --- the guided proposer ------------------------------------------------------------------------

class GuidedProposer:
    """Proposals from narrow questions to a model, one episode at a time (see the module docstring).

    Facts: `extract_facts` on each episode (grounded ones only); each new fact is shown the current facts most
    similar to it (`CONSOLIDATION_GUIDED_CANDIDATES`, `CONSOLIDATION_GUIDED_SIMILARITY`), `pick` says which it
    makes untrue and `classify` whether natural or harsh. Outcomes: an episode with a feedback word
    (`C.OUTCOME_WORDS`) about the playbook most similar to its session is classified success, failure or neither; a
    failure takes the refined step of a later "what fixed it was X" (`fix_after`). Confidence follows the episode's
    hedging and new playbooks come from the rules (`RuleProposer`): a small model has neither a calibrated confidence
    nor the steps. A question whose answer stays unusable proposes nothing; a server that fails raises `LLMError`.
    """

    name = "guided"

    def __init__(self, settings: Settings | None = None, *, client: OpenAI | None = None, model: str | None = None,
                 sleep: Callable[[float], None] | None = None, candidates: int = C.CONSOLIDATION_GUIDED_CANDIDATES,
                 similarity: float = C.CONSOLIDATION_GUIDED_SIMILARITY) -> None:
        self.settings = settings or load_settings()
        chosen_client, self.model = endpoint(self.settings, client=client, model=model)
        self.endpoint = Model(chosen_client, self.model, self.settings, sleep)
        self.candidates, self.similarity = candidates, similarity
        self.rules = RuleProposer()

    def propose(self, batch: Batch) -> list[dict]:
        facts = [fact for e in batch.episodes for fact in self.facts(batch, e)]
        outcomes: list[dict] = []
        consumed: set[str] = set()  # a fix that refines a failure is not feedback of its own
        for at, episode in enumerate(batch.episodes):
            if episode.id not in consumed and (outcome := self.outcome(batch, at)) is not None:
                outcomes.append(outcome)
                consumed.update(outcome["supporting_episode_ids"])
        return facts + outcomes + self.rules.playbooks(batch, consumed)

    def ask(self, question: Callable[..., T], task: str, *args: object) -> T | None:
        try:
            return question(self.endpoint, task, *args)
        except UnusableAnswer:
            return None

    def facts(self, batch: Batch, episode: Episode) -> list[dict]:
        proposals = []
        for text in self.ask(extract_facts, "extract_facts", episode.text, batch.user_name) or []:
            proposal = {"kind": "fact", "text": text, "fact_type": fact_type_of(text),
                        "confidence": self.rules.confidence_of(episode.text), "supporting_episode_ids": [episode.id]}
            proposals.append({**proposal, **self.supersession(batch, episode, text)})
        return proposals

    def supersession(self, batch: Batch, episode: Episode, text: str) -> dict:
        untrue = self.untrue(batch, text)
        kind = self.contradiction(episode, text) if untrue else None
        return {} if kind is None else {"supersedes_id": [f.id for f in untrue], "contradiction": kind}

    def untrue(self, batch: Batch, text: str) -> list[Fact]:
        """The current facts the model says `text` makes untrue, from the most similar ones shown to it."""
        if not batch.facts:
            return []
        scores = batch.similarity(text, [f.text for f in batch.facts])
        nearest = np.argsort(-scores, kind="stable")[:self.candidates]
        options = [batch.facts[i] for i in nearest if scores[i] >= self.similarity]
        return [options[i] for i in self.ask(pick, "pick_untrue", UNTRUE_QUESTION, text, [f.text for f in options])
                or []]

    def contradiction(self, episode: Episode, text: str) -> str | None:
        """Natural or harsh, as the model reads the episode that states `text`; None when it gives no usable answer."""
        return self.ask(classify, "classify_contradiction", CONTRADICTION_QUESTION,
                        f"{episode.text}\nNew fact: {text}", list(C.CONTRADICTIONS))

    def outcome(self, batch: Batch, at: int) -> dict | None:
        episode = batch.episodes[at]
        if not content_words(episode.text) & set(C.OUTCOME_WORDS):
            return None
        session = [e.text for e in batch.episodes[:at + 1] if e.session_id == episode.session_id]
        playbook = self.rules.playbook_for(batch, " ".join(session))
        if playbook is None:
            return None
        said = self.ask(classify, "classify_outcome", outcome_question(playbook.describe()), episode.text, OUTCOMES)
        if said is None or said == "neither":
            return None
        proposal = {"kind": "outcome", "playbook_id": playbook.id, "success": said == "success",
                    "supporting_episode_ids": [episode.id]}
        if said == "failure" and (fix := fix_after(batch.episodes, at)) is not None:
            proposal |= {"refined_steps": [fix_clause(fix.text)], "supporting_episode_ids": [episode.id, fix.id]}
        return proposal


#: The proposers `atlas consolidate --proposer` knows, by name.
PROPOSERS: dict[str, type[RuleProposer] | type[GuidedProposer] | type[LLMProposer]] = {
    "rule": RuleProposer, "guided": GuidedProposer, "llm": LLMProposer}


def default_proposer() -> Proposer:
    """`C.CONSOLIDATION_PROPOSER`, the one measured better; the rules when that one needs a model and none is
    configured."""
    try:
        return PROPOSERS[C.CONSOLIDATION_PROPOSER]()
    except LLMError:
        return RuleProposer()
