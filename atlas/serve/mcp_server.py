"""The MCP server: Atlas's memory tools over streamable HTTP at /api/atlas/mcp/{user_id}, inside a FastAPI app.

One low-level MCP server serves every user. The bearer credential is the user's Atlas
API key: `authenticate_user_key` says whose it is, the path must name that same user
(403 otherwise), and the tools act for that user only, reading through the presented
key (document-level security) and writing with the user as owner, never an id the
client sent. The transport is stateless JSON: every request carries and proves its own
credential, so there is no session to hijack. Tool bodies live in `atlas.serve.tools`, shared
with the agent loop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from importlib.metadata import version
from urllib.parse import urlsplit

import anyio
import httpx2
import uvicorn
from elasticsearch import ApiError, Elasticsearch, TransportError
from fastapi import FastAPI, HTTPException, Request
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import (
    INVALID_REQUEST,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    TextContent,
    Tool,
    ToolAnnotations,
)
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from atlas.core import constants as C
from atlas.core.errors import AtlasError, AuthError
from atlas.core.store import Store
from atlas.core.tenancy import authenticate_user_key, user_client
from atlas.core.validation import check_user
from atlas.serve.tools import TOOLS, ToolResult, call_tool, error_result
from atlas.stack import open_store

MCP_PATH = "/api/atlas/mcp/{user_id}"
INFO_PATH = MCP_PATH + "/info"
TRANSPORT = "streamable-http"
SERVER_NAME = "atlas-memory"
#: ASGI scope keys the auth guard fills for the tools.
USER_KEY, API_KEY = "atlas.user_id", "atlas.api_key"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSTRUCTIONS = ("Long-term memory of one user. Call recall_memory before answering questions about the user; "
                "write_memory with supersedes_id when the user changes or corrects a fact; forget_memory only "
                "when the user explicitly asks you to forget something.")


# --- tools over MCP --------------------------------------------------------------------------


def mcp_tools() -> list[Tool]:
    return [Tool(name=t.name, description=t.description, input_schema=t.input_schema,
                 annotations=ToolAnnotations(read_only_hint=t.read_only, destructive_hint=t.destructive,
                                             open_world_hint=False))
            for t in TOOLS.values()]


def to_mcp(result: ToolResult) -> CallToolResult:
    """A tool result as MCP content; errors are `isError` results with a one-line message."""
    return CallToolResult(content=[TextContent(type="text", text=result.text())],
                          structured_content=None if result.is_error else result.payload, is_error=result.is_error)


@dataclass(frozen=True)
class KeyBoundReader:
    """`store.reader` for one request: the caller's own key, and only for the caller."""

    es: Elasticsearch
    user_id: str
    api_key: str

    def __call__(self, user_id: str) -> Elasticsearch:
        if user_id != self.user_id:
            raise AuthError(f"this request is authenticated as {self.user_id}, not {user_id}")
        return user_client(self.es, self.user_id, self.api_key)


def run_for_request(store: Store, scope: Scope, name: str, arguments: object) -> ToolResult:
    """Run a tool as the user the guard authenticated, reading through the presented key."""
    user_id, api_key = scope.get(USER_KEY), scope.get(API_KEY)
    if user_id is None or api_key is None:
        return error_result("AuthError", "this request was not authenticated: connect through /api/atlas/mcp/<user>")
    request_store = replace(store, reader=KeyBoundReader(store.es, user_id, api_key))
    return call_tool(request_store, user_id, name, arguments)


def build_mcp_server(store: Store) -> Server:
    """One MCP server for all users: each call acts for the user its HTTP request authenticated."""

    async def list_tools(ctx: ServerRequestContext, params: object) -> ListToolsResult:
        return ListToolsResult(tools=mcp_tools())

    async def run_tool(ctx: ServerRequestContext, params: CallToolRequestParams) -> CallToolResult:
        scope = ctx.request.scope if ctx.request is not None else {}
        job = partial(run_for_request, store, scope, params.name, params.arguments)
        return to_mcp(await anyio.to_thread.run_sync(job))

    return Server(SERVER_NAME, version=version("atlas-memory"), instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=run_tool)


# --- authentication ----------------------------------------------------------------------------


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def refusal(status: int, message: str) -> JSONResponse:
    """401/403/503 as a JSON-RPC error body, so that MCP clients show the message (and a Bearer challenge on 401)."""
    headers = {"WWW-Authenticate": 'Bearer realm="atlas", error="invalid_token"'} if status == 401 else None
    body = {"jsonrpc": "2.0", "id": None,
            "error": {"code": INVALID_REQUEST, "message": f"{status}: {message}", "data": {"status": status}}}
    return JSONResponse(body, status_code=status, headers=headers)


class UserKeyGuard:
    """ASGI guard in front of the MCP transport: 401 without a valid user key, 403 for another user's path."""

    def __init__(self, store: Store, app: ASGIApp) -> None:
        self.store = store
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.check(scope)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def check(self, scope: Scope) -> JSONResponse | None:
        """None when the request may pass (and then the scope names the user and the key)."""
        path_user = scope["path_params"]["user_id"]
        key = bearer_token(Headers(scope=scope))
        if key is None:
            return refusal(401, "missing credential: send `Authorization: Bearer <your Atlas API key>` "
                                "(an operator creates one with `atlas users create <user> --show-secret`)")
        try:
            owner = await anyio.to_thread.run_sync(authenticate_user_key, self.store, key)
        except AuthError as exc:
            return refusal(401, str(exc))
        except (ApiError, TransportError) as exc:
            return refusal(503, f"Elasticsearch could not check the key ({type(exc).__name__}): retry later")
        if owner != path_user:
            return refusal(403, f"this key belongs to another user: connect to {MCP_PATH.format(user_id=owner)}")
        scope[USER_KEY], scope[API_KEY] = owner, key
        return None


# --- the app ---------------------------------------------------------------------------------


def transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection on loopback; behind a public bind the proxy in front must check Host."""
    if host not in LOOPBACK:
        return None
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                                     allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])


def mcp_url(base_url: str, user_id: str) -> str:
    return base_url.rstrip("/") + MCP_PATH.format(user_id=check_user(user_id))


def client_config(base_url: str, user_id: str) -> dict:
    """What a client needs: URL, transport, header, and ready-to-paste Claude Desktop and Cursor entries."""
    url = mcp_url(base_url, user_id)
    header = "Bearer <ATLAS_API_KEY>"
    # mcp-remote refuses plain HTTP beyond loopback unless told that the network is trusted.
    insecure = urlsplit(url).scheme == "http" and urlsplit(url).hostname not in LOOPBACK
    return {
        "url": url,
        "transport": TRANSPORT,
        "headers": {"Authorization": header},
        "api_key": f"the user's Atlas key: `atlas users create {user_id} --show-secret` (or `atlas users rotate`)",
        "tools": list(TOOLS),
        "clients": {
            # Claude Desktop starts local commands; mcp-remote bridges them to streamable HTTP.
            "claude_desktop": {"mcpServers": {"atlas": {
                "command": "npx", "args": ["-y", "mcp-remote", url, "--header", "Authorization:${ATLAS_AUTH}",
                                           *(["--allow-http"] if insecure else [])],
                "env": {"ATLAS_AUTH": header}}}},
            # Cursor speaks streamable HTTP natively.
            "cursor": {"mcpServers": {"atlas": {"url": url, "headers": {"Authorization": header}}}},
        },
    }


def create_app(store: Store, *, host: str = C.MCP_HOST, public_url: str | None = None) -> FastAPI:
    """FastAPI app: the MCP endpoint (guarded) and its unauthenticated /info (no secrets in it)."""
    manager = StreamableHTTPSessionManager(app=build_mcp_server(store), json_response=True, stateless=True,
                                           security_settings=transport_security(host))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = FastAPI(title="Atlas MCP", lifespan=lifespan)
    app.router.routes.append(Route(MCP_PATH, endpoint=UserKeyGuard(store, manager.handle_request)))

    @app.get(INFO_PATH)
    def info(user_id: str, request: Request) -> dict:
        """Client configuration for `user_id`: URL, transport, the header to send."""
        try:
            return client_config(public_url or str(request.base_url), user_id)
        except AtlasError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    return app


def serve(*, host: str = C.MCP_HOST, port: int = C.MCP_PORT, prefix: str | None = None,
          public_url: str | None = None) -> None:
    """Run the app with uvicorn until interrupted (`atlas serve`, `make serve`)."""
    app = create_app(open_store(prefix), host=host, public_url=public_url)
    uvicorn.run(app, host=host, port=port, log_level="info")


# --- in-process serving and a client (tests, notebooks) --------------------------------------------


class BackgroundServer:
    """The app under uvicorn in a daemon thread, on a port the OS picked; `stop()` (or `with`) ends it."""

    def __init__(self, app: FastAPI, *, host: str = C.MCP_HOST, port: int = 0, startup_timeout: float = 30) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name=f"atlas-mcp-{self.port}")
        self.thread.start()
        deadline = time.monotonic() + startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise AtlasError(f"the MCP app did not start on {self.host}:{self.port}: see the log above")
            time.sleep(0.02)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def url(self, user_id: str) -> str:
        return mcp_url(self.base_url, user_id)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@asynccontextmanager
async def open_client(url: str, api_key: str, *, timeout: float = 60) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on `url`, authenticated with the user's key."""
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call_remote(url: str, api_key: str, name: str, arguments: dict) -> CallToolResult:
    """One tool call in its own client session (notebooks; an agent host keeps one session open instead)."""
    async with open_client(url, api_key) as session:
        return await session.call_tool(name, arguments)
