"""The guided turn: the model's memory decisions as narrow questions with constrained answers, then a plain answer.

A small model cannot run an open tool-calling loop (docs/llm.md shows what one does), but it can answer one
short question at a time when its output is held to a JSON schema (`atlas.models.llm.json_format`). The turn asks:

1. which facts about the user the message states (`extract_facts`), each kept only if it is grounded in the
   message (`grounded`) and not already a current fact;
2. for each new fact, which of the recalled current facts it makes untrue, from those recalled only, by letter
   (`pick`), and whether the change is natural or a correction (`classify`);
3. when the user asks to forget something (`agent.asks_to_forget`), which recalled memory (`pick`; one a turn);
4. when a recalled playbook was tried, whether the message says it worked (`classify`).

The writes go through the same tool bodies as MCP (`atlas.serve.tools.call_tool`), so every model output passes
the validation user input does; an unusable answer is shown back to the model with what is wrong, and a question
still unanswered after `C.GUIDED_RETRIES` such retries changes nothing (`UnusableAnswer`, noted in the decisions).
Then the model answers in words, with the memories recalled after the writes listed in its system prompt.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from atlas import constants as C
from atlas.core.config import Settings
from atlas.core.memory import record_outcome
from atlas.core.recall import Hit, RecallResult
from atlas.core.store import Store
from atlas.models.llm import LLMError, complete, first_message, json_format
from atlas.serve.tools import ToolResult

T = TypeVar("T")
#: Facts one message may give at most.
MAX_FACTS = 3
#: What the user may say of a playbook the assistant suggested.
OUTCOMES = ["success", "failure", "neither"]
#: Words too common to ground a fact in a message.
STOPWORDS = frozenset("""a an and are as at be been but by did do does for from had has have he her his i in is it its
me my of on or our she so that the their them they this to was we were what when where which who will with you your
now just also very really then than there here about into over after before again still""".split())


@dataclass(frozen=True)
class Model:
    """The endpoint a guided turn asks: client, model name, the settings that say how it takes a schema, and what
    waits between retries (`time.sleep` when None)."""

    client: OpenAI
    name: str
    settings: Settings
    sleep: Callable[[float], None] | None = None


@dataclass
class Decision:
    """One narrow question of the turn and the model's answer (what a transcript shows)."""

    task: str
    answer: object


class UnusableAnswer(LLMError):
    """The model's answer to a narrow question was still unusable after it was shown its error."""


def ask_json(model: Model, task: str, system: str, user: str, schema: dict) -> dict:
    """One question whose answer must be a JSON object matching `schema` (constrained where the endpoint can). An
    unusable answer is shown back to the model with what is wrong, `C.GUIDED_RETRIES` times, then `UnusableAnswer`."""
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system},
                                                  {"role": "user", "content": user}]
    for _ in range(C.GUIDED_RETRIES + 1):
        content = complete(model.client, model=model.name, messages=messages, parse=first_message,
                           temperature=C.LLM_TEMPERATURE, max_tokens=C.GUIDED_MAX_TOKENS, sleep=model.sleep,
                           response_format=json_format(model.settings, task, schema)).content or ""
        try:
            value = json.loads(content, strict=False)  # strict=False: a raw newline inside a string is kept
            problem = "" if isinstance(value, dict) else "it is not a JSON object"
        except json.JSONDecodeError as exc:
            problem = f"it is not JSON ({exc.msg})"
        if not problem:
            return value
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": f"That answer is unusable: {problem}. Answer again with one JSON "
                                                 f"object that matches this schema: {json.dumps(schema)}"}]
    raise UnusableAnswer(f"{task}: the model's answer was unusable {C.GUIDED_RETRIES + 1} times ({problem})")


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2 and w not in STOPWORDS}


def grounded(fact: str, message: str, *, user_id: str) -> bool:
    """Whether a proposed fact says something the message says: one of its content words (not the user's name)
    is in the message. Catches facts made of the user's name or of words the model brought."""
    return bool((content_words(fact) - {user_id.lower()}) & content_words(message))


def extract_facts(model: Model, task: str, message: str, user_id: str) -> list[str]:
    schema = {"type": "object", "properties": {"facts": {"type": "array", "maxItems": MAX_FACTS, "items": {
        "type": "string", "minLength": 8, "maxLength": 200}}}, "required": ["facts"]}
    system = (f"You read one message of the user {user_id} and list the lasting facts it states about {user_id}'s "
              f"home, devices, people, routines or preferences, each as one short sentence about {user_id}. "
              "Small talk, questions and thanks state no fact: return an empty list.")
    facts = ask_json(model, task, system, message, schema).get("facts", [])
    return [f.strip() for f in facts if isinstance(f, str) and grounded(f, message, user_id=user_id)]


def pick(model: Model, task: str, question: str, statement: str, options: Sequence[Hit]) -> list[Hit]:
    """Which of `options` (shown by letter) the question selects for `statement`: a subset of them only."""
    if not options:
        return []
    letters = string.ascii_uppercase[:len(options)]
    schema = {"type": "object", "properties": {"letters": {"type": "array", "uniqueItems": True, "items": {
        "type": "string", "enum": list(letters)}}}, "required": ["letters"]}
    listed = "\n".join(f"{letter}: {hit.text}" for letter, hit in zip(letters, options, strict=True))
    answer = ask_json(model, task, f"{question} Answer with the letters, or an empty list.\n{listed}", statement,
                      schema)
    chosen = [letter for letter in answer.get("letters", []) if letter in letters]
    return [options[letters.index(letter)] for letter in dict.fromkeys(chosen)]


def classify(model: Model, task: str, question: str, statement: str, labels: Sequence[str]) -> str:
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": list(labels)}},
              "required": ["label"]}
    label = ask_json(model, task, f"{question} Answer with one of: {', '.join(labels)}.", statement,
                     schema).get("label")
    if label not in labels:
        raise UnusableAnswer(f"{task}: {label!r} is none of {', '.join(labels)}")
    return str(label)


def decide(model: Model, store: Store, run_tool: Callable[[str, dict], ToolResult], message: str,
           recalled: RecallResult, *, user_id: str, forget: bool) -> list[Decision]:
    """Steps 1-4 of the module docstring for one message; `run_tool(name, arguments)` runs a memory tool for the
    user (the agent's, which keeps the transcript). A step whose answer is unusable changes nothing."""
    decisions: list[Decision] = []

    def asked(task: str, question: Callable[..., T], *args: Any) -> T | None:
        try:
            return question(model, task, *args)
        except UnusableAnswer as exc:
            decisions.append(Decision(task, f"unusable: {exc}"))
            return None

    current = [h for h in recalled.hits if h.memory_type == "semantic" and not h.source.get("superseded_by")]
    if forget:  # one memory a turn at most: a model that picks everything deletes one, not all
        options = [h for h in recalled.hits if h.memory_type != "catalog"]
        chosen = asked("pick_forgotten", pick, "The user asks to forget something. Which one of these memories?",
                       message, options)
        if chosen is not None:
            decisions.append(Decision("pick_forgotten", [h.text for h in chosen]))
            for hit in chosen[:1]:
                run_tool("forget_memory", {"id": hit.id})
        return decisions
    known = {h.text.strip().lower() for h in current}
    facts = [f for f in asked("extract_facts", extract_facts, message, user_id) or [] if f.lower() not in known]
    decisions.append(Decision("extract_facts", facts))
    for fact in facts:
        untrue = asked("pick_untrue", pick, "Which of these facts does the new fact make untrue?", fact, current)
        if untrue is None:
            continue
        arguments: dict = {"text": fact, "memory_type": "semantic"}
        if untrue:
            kind = asked("classify_contradiction", classify, "Did the old fact stop being true (natural: a move, a new "
                         "device), or was it never true (harsh: the user corrects a mistake)?",
                         f"{message}\nNew fact: {fact}", list(C.CONTRADICTIONS))
            if kind is None:
                continue
            arguments |= {"supersedes_id": [h.id for h in untrue], "contradiction": kind}
            decisions.append(Decision("pick_untrue", {"fact": fact, "untrue": [h.text for h in untrue],
                                                      "contradiction": kind}))
        if not run_tool("write_memory", arguments).is_error:
            current = [h for h in current if h not in untrue]
    playbooks = [h for h in recalled.hits[:C.GUIDED_OUTCOME_RANK] if h.memory_type == "procedural"]
    if playbooks and content_words(message) & set(C.OUTCOME_WORDS):
        outcome = asked("classify_outcome", classify, f"The assistant suggested the playbook \"{playbooks[0].text}\"."
                        " Does the user's message say it worked (success), did not work (failure), or neither?",
                        message, OUTCOMES)
        if outcome is not None:
            decisions.append(Decision("classify_outcome", {"playbook": playbooks[0].text, "outcome": outcome}))
            if outcome != "neither":
                record_outcome(store, user_id, playbooks[0].id, outcome == "success")
    return decisions


def memory_lines(result: RecallResult) -> str:
    """The recalled memories as the answer's system prompt lists them: text and kind (an episode with its date)."""
    lines = []
    for hit in result.hits:
        when = (hit.source.get("timestamp") or hit.source.get("created_at") or "")[:10]
        kind = {"semantic": "fact", "episodic": f"said on {when}", "procedural": "playbook",
                "catalog": "product catalog"}[hit.memory_type]
        lines.append(f"- {hit.text} ({kind})")
    return "\n".join(lines) or "- nothing yet"


def answer(model: Model, history: Sequence[ChatCompletionMessageParam], message: str, memories: RecallResult, *,
           user_id: str) -> tuple[list[ChatCompletionMessageParam], str]:
    """The reply in words, with the memories in the system prompt and the last `C.GUIDED_HISTORY` exchanges of the
    session (a small model copies a long history instead of answering); returns the messages sent and the reply."""
    name = user_id.title()
    system = (f"You are a smart-home support assistant talking with {name}. You remember:\n{memory_lines(memories)}\n"
              f"Reply to {name}'s message in one or two sentences, using what you remember.")
    recent = history[-2 * C.GUIDED_HISTORY:]
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": system}, *recent,
                                                  {"role": "user", "content": message}]
    reply = complete(model.client, model=model.name, messages=messages, parse=first_message,
                     temperature=C.LLM_TEMPERATURE, max_tokens=C.GUIDED_ANSWER_TOKENS).content or ""
    return messages, reply
