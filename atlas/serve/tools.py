"""The three memory tools (recall, write, forget): one implementation behind the MCP server and the agent loop.

The caller supplies the user, from the authenticated key (MCP) or the session (agent):
no tool takes a user id as an argument, so a client can never write for someone else.
Argument models are built from the vocabularies of `atlas.constants`, so the JSON schemas
that MCP clients and the OpenAI API see are generated from them; bad arguments and
refused operations come back as an error result that names what to fix, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from elasticsearch import ApiError, TransportError
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticError

from atlas import constants as C
from atlas.core.clock import es_date
from atlas.core.errors import AtlasError, ValidationError
from atlas.core.memory import forget_memory, write_memory
from atlas.core.recall import Hit, RecallResult, recall, record_recall
from atlas.core.schemas import memory_type_of
from atlas.core.store import Store
from atlas.models.llm import bullets

# --- arguments ----------------------------------------------------------------------


class ToolArgs(BaseModel):
    """Unknown arguments are refused: a misspelt option must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class RecallArgs(ToolArgs):
    query: str = Field(min_length=1, max_length=C.MAX_QUERY_CHARS,
                       description="What to look for, in the user's words: a question, a device, an error code, "
                                   "a person.")
    k: int = Field(C.RECALL_K, ge=1, le=C.MAX_K, description="How many memories to return, best first.")
    types: list[C.MemoryType] | None = Field(None, min_length=1,
                                             description="Only these memory types; leave out to search all.")
    include_superseded: bool = Field(False, description="Also return facts that newer facts retired (for "
                                                        "\"what did I say before?\"); they carry superseded_by.")
    as_of: datetime | None = Field(None, description="What the memory held at this past moment (ISO 8601, UTC "
                                                     "unless it names a zone), for \"what did you know about me "
                                                     "in May?\": memories written by then, facts not yet superseded "
                                                     "then.")


class WriteArgs(ToolArgs):
    text: str = Field(min_length=1, description="The memory. A fact is one self-contained third-person sentence "
                                                "built from the user's own words.")
    memory_type: C.UserMemoryType = Field(description="semantic for a fact, procedural for a playbook, episodic for a "
                                                    "verbatim user message (only if your host does not log turns).")
    supersedes_id: list[str] | str | None = Field(
        None, description="Ids of EVERY current fact this one makes false (from recall_memory). They stay in the "
                          "audit trail, marked superseded; recall stops returning them.")
    contradiction: C.Contradiction | None = Field(
        None, description="With supersedes_id: why the old facts stopped being true. Default natural.")
    fact_type: C.FactType | None = Field(None, description="For a semantic fact: what it is about.")
    name: str | None = Field(None, description="For a playbook: a short name.")
    trigger: str | None = Field(None, description="For a playbook: the situation it fixes.")
    steps: list[str] | None = Field(None, min_length=1, description="For a playbook (required): the ordered steps.")
    context: str | None = Field(None, min_length=1, description="For an episode: the message it answers (your "
                                                                "previous reply), so a bare \"yes, that one\" can "
                                                                "be found later.")
    valid_from: datetime | None = Field(None, description="For a fact: since when it holds, if the user said so "
                                                          "(ISO 8601). Left out: a date its text names, else now.")
    valid_to: datetime | None = Field(None, description="For a fact: when it stopped holding, if the user said so "
                                                        "(ISO 8601). A fact it supersedes ends when it begins.")


class ForgetArgs(ToolArgs):
    id: str = Field(min_length=1, description="Id of the memory to delete, as returned by recall_memory.")


def parse_args(model: type[ToolArgs], arguments: object) -> ToolArgs:
    """Validate tool arguments; the error names each bad field and why, never the caller's values."""
    try:
        return model.model_validate(arguments if arguments is not None else {})
    except PydanticError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                             for err in exc.errors())
        raise ValidationError(f"invalid arguments ({problems}): follow the tool's input schema") from None


# --- results ----------------------------------------------------------------------------

#: Fields of a hit worth showing a model, per memory type (besides id, type, text, score, when).
PAYLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    "episodic": ("session_id", "context"),
    "semantic": ("fact_type", "confidence", "supersedes", "contradiction", "valid_from", "valid_to"),
    "procedural": ("name", "trigger", "steps", "refined_steps", "success_rate", "success_count", "failure_count"),
    "catalog": ("title", "category"),
}


def hit_payload(hit: Hit) -> dict:
    """One recalled memory as a model sees it."""
    source = hit.source
    out: dict[str, Any] = {"id": hit.id, "type": hit.memory_type, "text": hit.text, "score": round(hit.score, 4)}
    when = source.get("timestamp") or source.get("created_at")
    if when:
        out["when"] = when
    for name in (*PAYLOAD_FIELDS.get(hit.memory_type, ()), "superseded_by", "superseded_at"):
        if source.get(name) is not None:
            out[name] = source[name]
    return out


def recall_payload(result: RecallResult) -> dict:
    """What `recall_memory` returns; the agent injects the same for its pre-recall."""
    payload: dict[str, Any] = {"query": result.query, "memories": [hit_payload(h) for h in result.hits]}
    if result.period:
        payload["period"] = [es_date(moment) for moment in result.period]  # episodes said then were boosted
    if result.note:
        payload["note"] = result.note
    return payload


# --- the tools ------------------------------------------------------------------------------


def run_recall(store: Store, user_id: str, args: RecallArgs) -> dict:
    """Recall, then count it as a use of the facts it returned (`record_recall`), unless the store says not to or
    the recall was as of a past moment."""
    result = recall(store, user_id, args.query, k=args.k, types=args.types, include_superseded=args.include_superseded,
                    as_of=args.as_of)
    if store.record_use and args.as_of is None:  # a look at the past is not a use of today's facts
        record_recall(store, result)
    return recall_payload(result)


def run_write(store: Store, user_id: str, args: WriteArgs) -> dict:
    fields = args.model_dump(exclude_none=True)
    new_id = write_memory(store, user_id, **fields)
    olds = [args.supersedes_id] if isinstance(args.supersedes_id, str) else list(args.supersedes_id or [])
    return {"id": new_id, "memory_type": args.memory_type, "superseded": olds}


def run_forget(store: Store, user_id: str, args: ForgetArgs) -> dict:
    index = forget_memory(store, user_id, args.id)
    return {"forgotten": args.id, "memory_type": memory_type_of(index, store.prefix)}


@dataclass(frozen=True)
class MemoryTool:
    name: str
    description: str
    args: type[ToolArgs]
    run: Callable[[Store, str, Any], dict]
    read_only: bool = False
    destructive: bool = False

    @property
    def input_schema(self) -> dict:
        return self.args.model_json_schema()


RECALL_DESCRIPTION = f"""Search the user's long-term memory (keyword + semantic search), best first.
Memory types:
{bullets(C.MEMORY_TYPE_MEANINGS)}
Use it before answering anything that depends on the user's home, devices, people, preferences or past
problems, and before writing a fact, to find the current facts the new one may make false.
Superseded facts are hidden unless include_superseded is true, or they held during a period the query names
("where did I live in 2024?"); as_of asks what was held at a past moment."""

WRITE_DESCRIPTION = f"""Store a memory for the user.
Write a semantic fact when the user states something durable about themselves, their home, devices, people,
routines or preferences: one third-person sentence from the user's own words, never from your suggestions or
the catalog. Before writing, scan the recalled facts for EVERY current fact the new statement makes false and
pass all their ids in supersedes_id (one move can retire a city, an address and a commute). Never leave a
contradicted fact current, never write a duplicate of a fact that still holds. contradiction:
{bullets(C.CONTRADICTION_MEANINGS)}
Write a procedural playbook (name, trigger, ordered steps) when a multi-step fix worked."""

FORGET_DESCRIPTION = """Permanently delete one of the user's memories by id.
Only when the user explicitly asks you to forget or delete something ("forget my old address", "delete that").
Never to correct or update a fact: write the new fact with supersedes_id instead, which keeps the audit trail.
Forgetting a fact that replaced an older one makes the older one current again: forget both if both should go."""

TOOLS: dict[str, MemoryTool] = {tool.name: tool for tool in (
    MemoryTool("recall_memory", RECALL_DESCRIPTION, RecallArgs, run_recall, read_only=True),
    MemoryTool("write_memory", WRITE_DESCRIPTION, WriteArgs, run_write),
    MemoryTool("forget_memory", FORGET_DESCRIPTION, ForgetArgs, run_forget, destructive=True),
)}


@dataclass(frozen=True)
class ToolResult:
    """A tool's JSON payload; on error {"error": kind, "message": what to do}."""

    payload: dict
    is_error: bool = False

    def text(self) -> str:
        if self.is_error:
            return f"{self.payload['error']}: {self.payload['message']}"
        return json.dumps(self.payload, ensure_ascii=False)


def error_result(kind: str, message: str) -> ToolResult:
    return ToolResult({"error": kind, "message": message}, is_error=True)


def call_tool(store: Store, user_id: str, name: str, arguments: object) -> ToolResult:
    """Run one tool for `user_id` (who comes from the credential, never from `arguments`)."""
    tool = TOOLS.get(name)
    if tool is None:
        return error_result("UnknownTool", f"there is no tool {name!r}: use one of {', '.join(TOOLS)}")
    try:
        return ToolResult(tool.run(store, user_id, parse_args(tool.args, arguments)))
    except AtlasError as exc:
        return error_result(type(exc).__name__, str(exc))
    except (ApiError, TransportError) as exc:
        return error_result("ClusterError", f"Elasticsearch failed the request ({type(exc).__name__}): retry later, "
                                            "or tell the operator if it persists")


def openai_tools() -> list[dict]:
    """The tools in the OpenAI chat-completions `tools=` format, same schemas as over MCP."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.input_schema}} for t in TOOLS.values()]
