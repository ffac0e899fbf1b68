"""The guided turn: the model's memory decisions as narrow questions with constrained answers, then a plain answer.

A small model cannot run an open tool-calling loop (docs/llm.md shows what one does), but it can answer one
short question at a time when its output is held to a JSON schema (`atlas.models.questions`). The turn asks:

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from openai.types.chat import ChatCompletionMessageParam

from atlas import constants as C
from atlas.core.memory import record_outcome
from atlas.core.recall import Hit, RecallResult
from atlas.core.store import Store
from atlas.models.llm import complete, first_message
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
from atlas.serve.tools import ToolResult

T = TypeVar("T")


@dataclass
class Decision:
    """One narrow question of the turn and the model's answer (what a transcript shows)."""

    task: str
    answer: object


def pick_hits(model: Model, task: str, question: str, statement: str, options: Sequence[Hit]) -> list[Hit]:
    """`questions.pick` over recalled memories, shown by their text."""
    return [options[i] for i in pick(model, task, question, statement, [hit.text for hit in options])]


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
        chosen = asked("pick_forgotten", pick_hits, "The user asks to forget something. Which one of these memories?",
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
        untrue = asked("pick_untrue", pick_hits, UNTRUE_QUESTION, fact, current)
        if untrue is None:
            continue
        arguments: dict = {"text": fact, "memory_type": "semantic"}
        if untrue:
            kind = asked("classify_contradiction", classify, CONTRADICTION_QUESTION, f"{message}\nNew fact: {fact}",
                         list(C.CONTRADICTIONS))
            if kind is None:
                continue
            arguments |= {"supersedes_id": [h.id for h in untrue], "contradiction": kind}
            decisions.append(Decision("pick_untrue", {"fact": fact, "untrue": [h.text for h in untrue],
                                                      "contradiction": kind}))
        if not run_tool("write_memory", arguments).is_error:
            current = [h for h in current if h not in untrue]
    playbooks = [h for h in recalled.hits[:C.GUIDED_OUTCOME_RANK] if h.memory_type == "procedural"]
    if playbooks and content_words(message) & set(C.OUTCOME_WORDS):
        outcome = asked("classify_outcome", classify, outcome_question(playbooks[0].text), message, OUTCOMES)
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
