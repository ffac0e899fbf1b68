"""The agent loop: each turn stores the user's words, recalls on them, then lets the model use the memory tools.

A turn (1) writes the verbatim message as an episode, (2) runs `pre_recall` on it, then (3) lets the model
decide what to remember, in one of two modes (`C.AGENT_MODES`):
- `guided` (the default): the model answers narrow questions with constrained JSON (which facts the message
  states, which recalled facts they make untrue, ...; `atlas.serve.guided`), the loop runs the writes they imply,
  and the model then answers in words with the memories in its prompt. What a small local model can do.
- `tools`: the pre-recall is injected as if the model had called `recall_memory` itself (an assistant tool call
  and its tool result), and the model is called with the three tools until it answers. For an endpoint whose
  model calls tools well (docs/llm.md).
Either way the tools run through `atlas.serve.tools`, the same code the MCP server runs. The model's replies are
not stored: memory holds what the user said, not what the assistant guessed. A `forget_memory` call runs only when
the user's message asks for a deletion (`asks_to_forget`): what the model read in a memory cannot delete anything.
The model is the local server's (`atlas llm up`) unless the settings name another endpoint; an endpoint without a
model name is not configured, and then the turn still stores and recalls, and says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from openai import OpenAI
from openai.types.chat import (
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from atlas import constants as C
from atlas.config import Settings
from atlas.core.memory import write_episode
from atlas.core.passages import context_before
from atlas.core.recall import RecallResult, pre_recall, record_recall
from atlas.core.store import Store
from atlas.core.validation import check_choice, check_user
from atlas.models.llm import LLMError, bullets, complete, first_message, llm_client, not_configured_message
from atlas.models.questions import Model
from atlas.serve.guided import Decision, answer, decide
from atlas.serve.tools import ToolResult, call_tool, error_result, openai_tools, recall_payload

#: The id of the injected recall call, so a transcript shows which call the loop made for the model.
PRE_RECALL_CALL_ID = "pre_recall"


#: The system prompt names the tools' rules instead of retyping them: the model receives every tool's
#: description with the tools (`atlas.serve.tools.openai_tools`), the one text MCP clients see too.
SYSTEM_PROMPT = f"""You are a support assistant for a smart-home platform, with long-term memory of this user.

Memory types:
{bullets(C.MEMORY_TYPE_MEANINGS, indent="  ")}

Each turn starts with a recall_memory on the user's message, already done for you: read its result before
answering, and recall again with a focused query when you need more.

Write and forget memory exactly as the descriptions of write_memory and forget_memory say. The user's
message itself is already stored as an episode: do not write it again.
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
    messages: list[ChatCompletionMessageParam]
    reply: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: The model that answered; None when no model is configured.
    model: str | None = None
    #: A guided turn's narrow questions and the model's answers.
    decisions: list[Decision] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.model is not None


def injected_recall(k: int, result: RecallResult) -> list[ChatCompletionMessageParam]:
    """The pre-recall as an assistant tool call plus its tool result, exactly as if the model had asked
    (its query is the message, or the head of a message longer than a query may be)."""
    call: ChatCompletionMessageFunctionToolCallParam = {"id": PRE_RECALL_CALL_ID, "type": "function",
            "function": {"name": "recall_memory", "arguments": json.dumps({"query": result.query, "k": k})}}
    # A string content, never null: llama.cpp's server refuses a null one (the OpenAI API takes both).
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": PRE_RECALL_CALL_ID,
             "content": json.dumps(recall_payload(result), ensure_ascii=False)}]


def asks_to_forget(message: str) -> bool:
    """Whether the user's message holds one of `C.FORGET_WORDS` ("forget", "delete", ...), as a word."""
    words = set(re.findall(r"[a-z]+", message.lower()))
    return any(word in words for word in C.FORGET_WORDS)


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
                 on_turn: Callable[[TurnResult], object] | None = None, mode: C.AgentMode = "guided") -> None:
        settings = settings or store.settings
        self.store, self.user_id, self.session_id = store, check_user(user_id), session_id
        self.settings, self.mode = settings, check_choice(mode, C.AGENT_MODES, "mode")
        self.client = client or llm_client(settings)
        self.model = model or settings.llm_model
        self.k, self.max_steps = k, max_steps
        self.sleep = sleep
        #: Called after every turn, e.g. `lambda t: maybe_consolidate(store, t.user_id)`.
        self.on_turn = on_turn
        self.history: list[ChatCompletionMessageParam] = []

    @property
    def configured(self) -> bool:
        return self.client is not None and bool(self.model)

    def turn(self, message: str) -> TurnResult:
        # The message follows the last exchange (the user's previous message, the assistant's reply): stored as
        # its context and searched; the reply it answers is also embedded with it.
        exchange = [content for m in context_before(self.history, len(self.history))
                    if isinstance(content := m.get("content"), str) and content]
        episode_id = write_episode(self.store, self.user_id, message, session_id=self.session_id,
                                   context=exchange or None)
        recalled = pre_recall(self.store, self.user_id, message, k=self.k, written=episode_id)
        record_recall(self.store, recalled)
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM_PROMPT}, *self.history, {"role": "user", "content": message},
            *injected_recall(self.k, recalled)]
        result = TurnResult(self.user_id, message, episode_id, recalled, messages, not_configured_message())
        if self.configured:
            if self.mode == "guided":
                result.messages, result.reply = self.guided(result)
            else:
                result.reply = self.run_model(messages, result.tool_calls, message=message)
            result.model = self.model
            self.history += [{"role": "user", "content": message}, {"role": "assistant", "content": result.reply}]
        if self.on_turn is not None:
            self.on_turn(result)
        return result

    def guided(self, result: TurnResult) -> tuple[list[ChatCompletionMessageParam], str]:
        """A guided turn's decisions (`atlas.serve.guided.decide`) and writes, then its answer, with the memories
        recalled again when it wrote (so a fact stated in this message is there); the messages and the reply."""
        assert self.client is not None and self.model
        model = Model(self.client, self.model, self.settings, self.sleep)

        def run_tool(name: str, arguments: dict) -> ToolResult:
            result.tool_calls.append(call := ToolCall(name, arguments, call_tool(self.store, self.user_id, name,
                                                                                  arguments)))
            return call.result

        result.decisions = decide(model, self.store, run_tool, result.message, result.pre_recall,
                                  user_id=self.user_id, forget=asks_to_forget(result.message))
        memories = result.pre_recall
        if result.tool_calls:
            memories = pre_recall(self.store, self.user_id, result.message, k=self.k, written=result.episode_id)
        messages, reply = answer(model, self.history, result.message, memories, user_id=self.user_id)
        return [*messages, {"role": "assistant", "content": reply}], reply

    def run_model(self, messages: list[ChatCompletionMessageParam], calls: list[ToolCall], *, message: str) -> str:
        """Call the model, run its tool calls (for the user's `message`), repeat until it answers in words."""
        client, model = self.client, self.model
        if client is None or not model:
            raise LLMError(not_configured_message())
        for _ in range(self.max_steps):
            reply = complete(client, model=model, messages=messages, parse=first_message, tools=openai_tools(),
                             temperature=C.LLM_TEMPERATURE, sleep=self.sleep)
            # Only function tools are offered, so only function calls are run (and echoed back).
            requested = [c for c in reply.tool_calls or () if isinstance(c, ChatCompletionMessageFunctionToolCall)]
            if not requested:
                messages.append({"role": "assistant", "content": reply.content or ""})
                return reply.content or ""
            messages.append({"role": "assistant", "content": reply.content or "", "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in requested]})
            for c in requested:
                call = self.execute(c.function.name, c.function.arguments, message=message)
                calls.append(call)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": call.result.text()})
        raise LLMError(f"the model was still calling tools after {self.max_steps} steps: raise max_steps, or use a "
                       "model that is better at tool calling")

    def execute(self, name: str, raw_arguments: str | None, *, message: str) -> ToolCall:
        """One tool call of the model, for this agent's user; bad JSON becomes an error the model can correct, and
        a `forget_memory` that the user's `message` did not ask for is refused."""
        arguments = parse_arguments(raw_arguments)
        if isinstance(arguments, ToolResult):
            return ToolCall(name, raw_arguments or "", arguments)
        if name == "forget_memory" and not asks_to_forget(message):
            return ToolCall(name, arguments, error_result(
                "NotRequested", "the user did not ask to forget or delete anything in this message: forget_memory "
                                "runs only on the user's explicit request, never on what a memory says"))
        return ToolCall(name, arguments, call_tool(self.store, self.user_id, name, arguments))
