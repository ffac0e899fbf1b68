"""The MCP server over real HTTP with the real MCP client: tools, auth, errors, ownership (issue 7).

The app runs under uvicorn in a background thread on a free loopback port. Clients present
Atlas tokens (`atlas.security.tokens`); tokens and keys live in a test-local secrets folder
(ATLAS_HOME=tmp_path) and the keys are invalidated at the end. The attacks on the tokens
themselves are in tests/test_tokens.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import anyio
import httpx
import pytest
from mcp.shared.exceptions import MCPError

from atlas.constants import CONTRADICTIONS, FACT_TYPES, MEMORY_TYPES, USER_MEMORY_TYPES
from atlas.core.memory import write_memory
from atlas.core.store import Store
from atlas.security.tokens import create_user
from atlas.serve.mcp_server import BackgroundServer, create_app, open_client
from tests.conftest import NOW


@pytest.fixture
def keyed(store: Store, tmp_path, monkeypatch) -> Iterator[tuple[Store, dict[str, str]]]:
    """The isolated store with keys and tokens for sarah and tom in tmp_path; the store fixture's drop invalidates
    the keys (`forget_prefix`)."""
    monkeypatch.setenv("ATLAS_HOME", str(tmp_path))
    store.settings = replace(store.settings, home=tmp_path)
    made = {user: create_user(store, user) for user in ("sarah", "tom")}
    yield store, {user: issued.secret for user, issued in made.items()}


@pytest.fixture
def served(keyed) -> Iterator[tuple[Store, dict[str, str], BackgroundServer]]:
    store, keys = keyed
    with BackgroundServer(create_app(store)) as server:
        yield store, keys, server
    assert not server.thread.is_alive(), "the MCP server did not stop"


def run(coroutine_fn, *args):
    """Run a client flow; one that stalls fails after two minutes instead of hanging the suite."""
    async def bounded():
        with anyio.fail_after(120):
            return await coroutine_fn(*args)
    return anyio.run(bounded)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, as the SDK's task groups raise them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def enum_of(prop: dict) -> list[str]:
    """The enum of a (possibly optional, possibly array) JSON-schema property."""
    for option in prop.get("anyOf", [prop]):
        option = option.get("items", option)
        if "enum" in option:
            return option["enum"]
    raise AssertionError(f"no enum in {prop}")


def test_tools_round_trip_with_the_real_client(served):
    store, keys, server = served

    async def session_flow():
        async with open_client(server.url("sarah"), keys["sarah"]) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            written = await session.call_tool("write_memory", {"text": "Sarah's hub is called Beacon",
                                                               "memory_type": "semantic", "fact_type": "device"})
            owner = store.es.get(index=f"{store.prefix}-semantic", id=written.structured_content["id"])["_source"]
            episode = await session.call_tool("write_memory", {"text": "The blue one", "memory_type": "episodic",
                                                               "context": "Which cable did Biscuit chew?"})
            found = await session.call_tool("recall_memory", {"query": "what is my hub called", "k": 3})
            gone = await session.call_tool("forget_memory", {"id": written.structured_content["id"]})
            after = await session.call_tool("recall_memory", {"query": "what is my hub called", "k": 3})
            return tools, written, owner, found, gone, after, episode

    tools, written, owner, found, gone, after, episode = run(session_flow)
    stored = store.es.get(index=f"{store.prefix}-episodic", id=episode.structured_content["id"])["_source"]
    assert stored["context"] == "Which cable did Biscuit chew?" and stored["text"] == "The blue one"
    assert set(tools) == {"recall_memory", "write_memory", "forget_memory"}
    write_schema = tools["write_memory"].input_schema["properties"]
    assert write_schema["memory_type"]["enum"] == list(USER_MEMORY_TYPES)
    assert enum_of(write_schema["contradiction"]) == list(CONTRADICTIONS)
    assert enum_of(write_schema["fact_type"]) == list(FACT_TYPES)
    assert enum_of(tools["recall_memory"].input_schema["properties"]["types"]) == list(MEMORY_TYPES)
    assert tools["forget_memory"].annotations.destructive_hint and tools["recall_memory"].annotations.read_only_hint
    assert "explicitly asks" in tools["forget_memory"].description
    assert "supersedes_id" in tools["write_memory"].description
    assert not written.is_error
    fact_id = written.structured_content["id"]
    assert owner["user_id"] == "sarah" and owner["fact_type"] == "device"
    assert fact_id in [m["id"] for m in found.structured_content["memories"]]
    assert not gone.is_error and gone.structured_content == {"forgotten": fact_id, "memory_type": "semantic"}
    assert fact_id not in [m["id"] for m in after.structured_content["memories"]]


def test_missing_or_wrong_credential_is_401(served):
    _, keys, server = served
    url = server.url("sarah")
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    missing = httpx.post(url, json=init, headers=headers)
    wrong = httpx.post(url, json=init, headers={**headers, "Authorization": "Bearer bm90OmEta2V5"})
    for response in (missing, wrong):
        assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
        assert "Traceback" not in response.text
    assert "Authorization: Bearer" in missing.json()["error"]["message"]

    async def connect_with(key):
        async with open_client(url, key):
            pass

    with pytest.raises(BaseException) as info:
        run(connect_with, "bm90OmEta2V5")
    messages = [str(e) for e in leaves(info.value) if isinstance(e, MCPError)]
    assert messages and messages[0].startswith("401")


def test_another_users_path_is_403(served):
    _, keys, server = served
    response = httpx.post(server.url("sarah"), json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                          headers={"Authorization": f"Bearer {keys['tom']}",
                                   "Accept": "application/json, text/event-stream"})
    assert response.status_code == 403
    assert "/api/atlas/mcp/tom" in response.json()["error"]["message"]


def test_malformed_arguments_are_clear_tool_errors(served):
    store, keys, server = served

    async def bad_calls():
        async with open_client(server.url("sarah"), keys["sarah"]) as session:
            return [await session.call_tool("recall_memory", {"query": "", "k": 0}),
                    await session.call_tool("write_memory", {"text": "Sarah owns Tom's hub", "memory_type": "semantic",
                                                             "user_id": "tom"}),
                    await session.call_tool("write_memory", {"text": "x", "memory_type": "dreams"}),
                    await session.call_tool("write_memory", {"text": "A fix", "memory_type": "procedural"}),
                    await session.call_tool("forget_memory", {"id": "../../etc/passwd"}),
                    await session.call_tool("no_such_tool", {})]

    results = run(bad_calls)
    texts = [r.content[0].text for r in results]
    assert all(r.is_error for r in results), texts
    assert texts[0].startswith("ValidationError: invalid arguments (query:") and "k:" in texts[0]
    assert "user_id: Extra inputs are not permitted" in texts[1]
    assert "memory_type" in texts[2] and "steps" in texts[3]
    assert texts[4].startswith("ValidationError") and texts[5].startswith("UnknownTool")
    assert not any("Traceback" in t or 'File "' in t for t in texts)
    store.es.indices.refresh(index=store.indices)
    assert store.es.count(index=store.indices)["count"] == 0


def test_forget_of_another_users_memory_is_refused(served):
    store, keys, server = served
    toms = write_memory(store, "tom", "Tom's garage code is the year his mum was born", "semantic")

    async def forget_toms():
        async with open_client(server.url("sarah"), keys["sarah"]) as session:
            return await session.call_tool("forget_memory", {"id": toms})

    result = run(forget_toms)
    assert result.is_error and result.content[0].text == f"NotFound: no memory {toms} belongs to user sarah"
    assert store.es.get(index=f"{store.prefix}-semantic", id=toms)["_source"]["user_id"] == "tom"


def test_info_gives_the_client_configuration(served):
    _, _, server = served
    info = httpx.get(server.url("sarah") + "/info").json()
    configured = "http://127.0.0.1:8765/api/atlas/mcp/sarah"  # the app's default bind, not this test's port
    assert info["url"] == configured and info["transport"] == "streamable-http"
    assert info["headers"] == {"Authorization": "Bearer <ATLAS_TOKEN>"}
    assert info["clients"]["cursor"]["mcpServers"]["atlas"]["url"] == configured
    assert configured in info["clients"]["claude_desktop"]["mcpServers"]["atlas"]["args"]
    assert httpx.get(server.base_url + "/api/atlas/mcp/Not%20A%20User/info").status_code == 400


def test_recall_as_of_through_the_tool(served):
    """Issue 38: recall_memory takes as_of (ISO 8601) and answers from what was held then; a bad date is refused."""
    store, keys, server = served
    bristol = write_memory(store.at(NOW - timedelta(days=400)), "sarah", "Sarah lives in Bristol", "semantic")
    edinburgh = write_memory(store.at(NOW - timedelta(days=100)), "sarah", "Sarah lives in Edinburgh", "semantic",
                             supersedes_id=bristol)

    async def flow():
        async with open_client(server.url("sarah"), keys["sarah"]) as session:
            return [await session.call_tool("recall_memory", {"query": "where do I live", **extra}) for extra in
                    ({"as_of": "2025-10-01"}, {}, {"as_of": "last year"}, {"as_of": "2099-01-01T00:00:00Z"})]

    then, now, vague, future = run(flow)
    assert [m["id"] for m in then.structured_content["memories"]] == [bristol]
    assert then.structured_content["memories"][0]["superseded_by"] == edinburgh, "what happened since is shown"
    assert [m["id"] for m in now.structured_content["memories"]] == [edinburgh]
    assert vague.is_error and "as_of" in vague.content[0].text
    assert future.is_error and "after the store's clock" in future.content[0].text


def test_valid_time_through_the_tools(served):
    """Issue 38: write_memory takes a fact's valid_from/valid_to; a recall whose question names a period returns the
    superseded fact that held then, with its valid time; a valid time on an episode is refused."""
    store, keys, server = served
    leeds = write_memory(store.at(NOW - timedelta(days=900)), "sarah", "Sarah lives in Leeds", "semantic")

    async def flow():
        async with open_client(server.url("sarah"), keys["sarah"]) as session:
            moved = await session.call_tool("write_memory", {
                "text": "Sarah lives in York", "memory_type": "semantic", "supersedes_id": leeds,
                "valid_from": "2025-06-01"})
            asked = await session.call_tool("recall_memory", {"query": "where did I live in 2024?",
                                                              "types": ["semantic"]})
            episode = await session.call_tool("write_memory", {"text": "hello", "memory_type": "episodic",
                                                               "valid_to": "2025-06-01"})
            return moved, asked, episode

    moved, asked, episode = run(flow)
    york = moved.structured_content["id"]
    [first, *rest] = asked.structured_content["memories"]
    assert first["id"] == leeds and first["superseded_by"] == york and first["valid_to"].startswith("2025-06-01")
    assert [m["id"] for m in rest] == [york] and rest[0]["valid_from"].startswith("2025-06-01")
    assert episode.is_error and "only a fact has a valid time" in episode.content[0].text
