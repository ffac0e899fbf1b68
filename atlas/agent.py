"""The agent loop: each turn stores the user's words, recalls on them, then lets the model use the memory tools.

A turn (1) writes the verbatim message as an episode, (2) runs `pre_recall` on it and
injects the result as if the model had called `recall_memory` itself (an assistant tool
call and its tool result), so the model starts from what it knows, then (3) calls the
model with the three tools until it answers, executing its calls through `atlas.tools`,
the same code the MCP server runs. The model's replies are not stored: memory holds
what the user said, not what the assistant guessed. Without a configured model the
turn still stores and recalls, and says that no model is configured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from openai import OpenAI

from . import constants as C
from .config import Settings
from .errors import LLMError
from .llm import complete, first_message, llm_client, not_configured_message
from .memory import context_before, write_episode
from .recall import RecallResult, pre_recall
from .store import Store
from .tools import (CONTRADICTION_MEANINGS, MEMORY_TYPE_MEANINGS, ToolResult, bullets, call_tool, error_result,
                    openai_tools, recall_payload)
from .validation import check_user

#: The id of the injected recall call, so a transcript shows which call the loop made for the model.
PRE_RECALL_CALL_ID = "pre_recall"


SYSTEM_PROMPT = f"""You are a support assistant for a smart-home platform, with long-term memory of this user.

Memory types:
{bullets(MEMORY_TYPE_MEANINGS, "  ")}

Each turn starts with a recall_memory on the user's message, already done for you: read its result before
answering, and recall again with a focused query when you need more.

Writing memory:
1. When the user states something durable about themselves, their home, devices, people, routines or
   preferences, write ONE semantic fact per statement: third person, self-contained, from the user's own
   words. Never store your own replies, suggestions or catalog text as facts. The user's message itself
   is already stored as an episode: do not write it again.
2. Supersession: scan the recalled facts for EVERY current fact the new statement makes false (a move can
   retire the city, the address and the commute at once) and pass all their ids in supersedes_id. Never
   leave a contradicted fact current; never write a second copy of a fact that still holds.
3. contradiction, with supersedes_id:
{bullets(CONTRADICTION_MEANINGS, "  ")}
4. When a multi-step fix worked, write a procedural playbook (name, trigger, ordered steps).
5. forget_memory only when the user explicitly asks you to forget or delete something; to correct a fact,
   supersede it instead.
Answer briefly and use what you remember."""


@dataclass
class ToolCall:
    """One tool call the model made in a turn, with what it got back."""

    name: str
    arguments: dict | str
    result: ToolResult


@dataclass
class TurnResult:
    user_id: str
    message: str
    episode_id: str
    pre_recall: RecallResult
    #: Everything sent to (and received from) the model, in order; the injected recall included.
    messages: list[dict]
    reply: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: The model that answered; None when no model is configured.
    model: str | None = None

    @property
    def answered(self) -> bool:
        return self.model is not None


def injected_recall(message: str, k: int, result: RecallResult) -> list[dict]:
    """The pre-recall as an assistant tool call plus its tool result, exactly as if the model had asked."""
    call = {"id": PRE_RECALL_CALL_ID, "type": "function",
            "function": {"name": "recall_memory", "arguments": json.dumps({"query": message, "k": k})}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": PRE_RECALL_CALL_ID,
             "content": json.dumps(recall_payload(result), ensure_ascii=False)}]


def parse_arguments(raw: str | None) -> dict | ToolResult:
    """A tool call's JSON arguments, or an error result the model can correct."""
    try:
        arguments = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return error_result("ValidationError", f"the arguments are not valid JSON ({exc.msg}): resend them as "
                                               "one JSON object")
    if not isinstance(arguments, dict):
        return error_result("ValidationError", "the arguments must be a JSON object")
    return arguments


class Agent:
    """A conversation with one user. `turn(message)` runs one turn; the session's history stays in memory only."""

    def __init__(self, store: Store, user_id: str, *, session_id: str | None = None, settings: Settings | None = None,
                 client: OpenAI | None = None, model: str | None = None, k: int = C.RECALL_K,
                 max_steps: int = C.AGENT_MAX_STEPS, sleep: Callable[[float], None] | None = None,
                 on_turn: Callable[[TurnResult], object] | None = None) -> None:
        settings = settings or store.settings
        self.store, self.user_id, self.session_id = store, check_user(user_id), session_id
        self.client = client or llm_client(settings)
        self.model = model or settings.llm_model
        self.k, self.max_steps = k, max_steps
        self.retry_options = {"sleep": sleep} if sleep else {}
        #: Called after every turn, e.g. `lambda t: maybe_consolidate(store, t.user_id)`.
        self.on_turn = on_turn
        self.history: list[dict] = []

    @property
    def configured(self) -> bool:
        return self.client is not None and bool(self.model)

    def turn(self, message: str) -> TurnResult:
        # The message follows the last exchange (the user's previous message, the assistant's reply): stored as
        # its context and searched; the reply it answers is also embedded with it.
        exchange = [m["content"] for m in context_before(self.history, len(self.history)) if m["content"]]
        episode_id = write_episode(self.store, self.user_id, message, self.session_id, context=exchange or None)
        recalled = pre_recall(self.store, self.user_id, message, k=self.k)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, *self.history, {"role": "user", "content": message},
                    *injected_recall(message, self.k, recalled)]
        result = TurnResult(self.user_id, message, episode_id, recalled, messages, not_configured_message())
        if self.configured:
            result.reply = self.run_model(messages, result.tool_calls)
            result.model = self.model
            self.history += [{"role": "user", "content": message}, {"role": "assistant", "content": result.reply}]
        if self.on_turn is not None:
            self.on_turn(result)
        return result

    def run_model(self, messages: list[dict], calls: list[ToolCall]) -> str:
        """Call the model, run its tool calls, repeat until it answers in words."""
        for _ in range(self.max_steps):
            reply = complete(self.client, model=self.model, messages=messages,  # type: ignore[arg-type]
                             parse=first_message, tools=openai_tools(), **self.retry_options)
            if not reply.tool_calls:
                messages.append({"role": "assistant", "content": reply.content or ""})
                return reply.content or ""
            messages.append({"role": "assistant", "content": reply.content, "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in reply.tool_calls]})
            for c in reply.tool_calls:
                call = self.execute(c.function.name, c.function.arguments)
                calls.append(call)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": call.result.text()})
        raise LLMError(f"the model was still calling tools after {self.max_steps} steps: raise max_steps, or use a "
                       "model that is better at tool calling")

    def execute(self, name: str, raw_arguments: str | None) -> ToolCall:
        """One tool call of the model, for this agent's user; bad JSON becomes an error the model can correct."""
        arguments = parse_arguments(raw_arguments)
        if isinstance(arguments, ToolResult):
            return ToolCall(name, raw_arguments or "", arguments)
        return ToolCall(name, arguments, call_tool(self.store, self.user_id, name, arguments))
