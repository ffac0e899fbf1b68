"""Narrow questions to a language model, each answered as JSON held to a schema (`atlas.models.llm.json_format`).

A small model cannot plan a memory change in one open answer, but it can answer one short question at a time:
which facts a message states (`extract_facts`), which of a few listed texts a statement selects (`pick`, by letter),
which of a few labels fits (`classify`). An unusable answer is shown back to the model with what is wrong,
`C.GUIDED_RETRIES` times, then `UnusableAnswer`. The agent's guided turn (`atlas.serve.guided`) and the guided
consolidation proposer (`atlas.consolidation.proposers.GuidedProposer`) ask them.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from atlas import constants as C
from atlas.config import Settings
from atlas.models.llm import LLMError, complete, first_message, json_format

#: Facts one message may give at most.
MAX_FACTS = 3
#: What a user's message may say of a playbook the assistant suggested (`outcome_question`).
OUTCOMES = ["success", "failure", "neither"]
UNTRUE_QUESTION = "Which of these facts does the new fact make untrue?"
CONTRADICTION_QUESTION = ("Did the old fact stop being true (natural: a move, a new device), or was it never true "
                          "(harsh: the user corrects a mistake)?")
#: Words too common to ground a fact in a message.
STOPWORDS = frozenset("""a an and are as at be been but by did do does for from had has have he her his i in is it its
me my of on or our she so that the their them they this to was we were what when where which who will with you your
now just also very really then than there here about into over after before again still""".split())


@dataclass(frozen=True)
class Model:
    """The endpoint the questions go to: client, model name, the settings that say how it takes a schema, and what
    waits between retries (`time.sleep` when None)."""

    client: OpenAI
    name: str
    settings: Settings
    sleep: Callable[[float], None] | None = None


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
    """The lasting facts about `user_id` that `message` states (at most `MAX_FACTS`), grounded ones only."""
    schema = {"type": "object", "properties": {"facts": {"type": "array", "maxItems": MAX_FACTS, "items": {
        "type": "string", "minLength": 8, "maxLength": 200}}}, "required": ["facts"]}
    system = (f"You read one message of the user {user_id} and list the lasting facts it states about {user_id}'s "
              f"home, devices, people, routines or preferences, each as one short sentence about {user_id}. "
              "Small talk, questions and thanks state no fact: return an empty list.")
    facts = ask_json(model, task, system, message, schema).get("facts", [])
    return [f.strip() for f in facts if isinstance(f, str) and grounded(f, message, user_id=user_id)]


def pick(model: Model, task: str, question: str, statement: str, options: Sequence[str]) -> list[int]:
    """The positions of the `options` (shown by letter) that the question selects for `statement`, in the order the
    model named them: a subset of them only."""
    if not options:
        return []
    letters = string.ascii_uppercase[:len(options)]
    schema = {"type": "object", "properties": {"letters": {"type": "array", "uniqueItems": True, "items": {
        "type": "string", "enum": list(letters)}}}, "required": ["letters"]}
    listed = "\n".join(f"{letter}: {text}" for letter, text in zip(letters, options, strict=True))
    answer = ask_json(model, task, f"{question} Answer with the letters, or an empty list.\n{listed}", statement,
                      schema)
    chosen = [letter for letter in answer.get("letters", []) if letter in letters]
    return [letters.index(letter) for letter in dict.fromkeys(chosen)]


def classify(model: Model, task: str, question: str, statement: str, labels: Sequence[str]) -> str:
    """Which one of `labels` the question gives `statement`."""
    schema = {"type": "object", "properties": {"label": {"type": "string", "enum": list(labels)}},
              "required": ["label"]}
    label = ask_json(model, task, f"{question} Answer with one of: {', '.join(labels)}.", statement,
                     schema).get("label")
    if label not in labels:
        raise UnusableAnswer(f"{task}: {label!r} is none of {', '.join(labels)}")
    return str(label)


def outcome_question(playbook: str) -> str:
    """The `classify` question of whether a message says that `playbook` worked (labels `OUTCOMES`)."""
    return (f"The assistant suggested the playbook \"{playbook}\". Does the user's message say it worked (success), "
            "did not work (failure), or neither?")
