"""The MCP server: Atlas's memory tools over streamable HTTP at /api/atlas/mcp/{user_id}, inside a FastAPI app.

One low-level MCP server serves every user. The bearer credential is an Atlas token
(`atlas.security.tokens`), never an Elasticsearch credential: the token file says whose it is,
the path must name that same user (403 otherwise), and the tools act for that user only,
reading through the user's DLS key, which stays on the server, and writing with the user as
owner, never an id the client sent. Failed authentications are throttled per client address
(429). The transport is stateless JSON: every request carries and proves its own credential,
so there is no session to hijack. Tool bodies live in `atlas.serve.tools`, shared with the
agent loop.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from importlib.metadata import version
from urllib.parse import urlsplit

import anyio
import httpx2
import uvicorn
from elasticsearch import Elasticsearch
from fastapi import FastAPI, HTTPException
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
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from atlas import constants as C
from atlas.core.errors import AtlasError, AuthError, ConnectionFailed
from atlas.core.store import Store
from atlas.core.validation import check_user
from atlas.security.tenancy import KeyReader
from atlas.security.tokens import TokenVerifier
from atlas.serve.tools import TOOLS, ToolResult, call_tool, error_result
from atlas.stack import open_store

MCP_PATH = "/api/atlas/mcp/{user_id}"
INFO_PATH = MCP_PATH + "/info"
TRANSPORT = "streamable-http"
SERVER_NAME = "atlas-memory"
#: ASGI scope key the auth guard fills for the tools: the user the token belongs to.
USER_KEY = "atlas.user_id"
#: What an MCP client is told when the cluster is unreachable (never its address).
CLUSTER_DOWN = "Elasticsearch is not answering: retry later, or tell the operator if it persists"
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
    """`store.reader` for one request: the authenticated user's stored key, and only for that user."""

    reader: Callable[[str], Elasticsearch]
    user_id: str

    def __call__(self, user_id: str) -> Elasticsearch:
        if user_id != self.user_id:
            raise AuthError(f"this request is authenticated as {self.user_id}, not {user_id}")
        return self.reader(user_id)


def public(result: ToolResult) -> ToolResult:
    """A tool result fit for a client: a lost cluster is reported without the cluster's address."""
    if result.is_error and result.payload["error"] == "ConnectionFailed":
        return error_result("ConnectionFailed", CLUSTER_DOWN)
    return result


def run_for_request(store: Store, reader: KeyReader, scope: Scope, name: str, arguments: object) -> ToolResult:
    """Run a tool as the user the guard authenticated, reading through that user's stored key; a write or forget
    runs only while that key still authenticates in the cluster (`KeyReader.check_live`)."""
    user_id = scope.get(USER_KEY)
    if user_id is None:
        return error_result("AuthError", "this request was not authenticated: connect through /api/atlas/mcp/<user>")
    tool = TOOLS.get(name)
    if tool is not None and not tool.read_only:
        try:
            reader.check_live(user_id)  # a write: the user's key must still work in the cluster, not only here
        except AtlasError as exc:
            return public(error_result(type(exc).__name__, str(exc)))
    request_store = replace(store, reader=KeyBoundReader(reader, user_id))
    return public(call_tool(request_store, user_id, name, arguments))


def build_mcp_server(store: Store, reader: KeyReader) -> Server:
    """One MCP server for all users: each call acts for the user its HTTP request authenticated."""

    async def list_tools(ctx: ServerRequestContext, params: object) -> ListToolsResult:
        return ListToolsResult(tools=mcp_tools())

    async def run_tool(ctx: ServerRequestContext, params: CallToolRequestParams) -> CallToolResult:
        scope = ctx.request.scope if ctx.request is not None else {}
        job = partial(run_for_request, store, reader, scope, params.name, params.arguments)
        return to_mcp(await anyio.to_thread.run_sync(job))

    return Server(SERVER_NAME, version=version("atlas-memory"), instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=run_tool)


# --- authentication ----------------------------------------------------------------------------


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def refusal(status: int, message: str, *, retry_after: int | None = None) -> JSONResponse:
    """401/403/429 as a JSON-RPC error body, so that MCP clients show the message (and a Bearer challenge on 401)."""
    headers = {"WWW-Authenticate": 'Bearer realm="atlas", error="invalid_token"'} if status == 401 else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    body = {"jsonrpc": "2.0", "id": None,
            "error": {"code": INVALID_REQUEST, "message": f"{status}: {message}", "data": {"status": status}}}
    return JSONResponse(body, status_code=status, headers=headers)


class FailureThrottle:
    """Failed authentications per client address in a sliding window: past `limit`, the client waits.

    In memory, per process (a replica behind a load balancer counts its own share); at most
    `clients` addresses are remembered, the stalest forgotten first.
    """

    def __init__(self, *, limit: int = C.AUTH_FAILURE_LIMIT, window: float = C.AUTH_FAILURE_WINDOW,
                 clients: int = C.AUTH_THROTTLE_CLIENTS, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clients, self.clock = limit, window, clients, clock
        self.failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str) -> deque[float]:
        times = self.failures.get(client, deque())
        while times and self.clock() - times[0] >= self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> int | None:
        """Whole seconds until `client` may try again, or None when it may now."""
        times = self._recent(client)
        if len(times) < self.limit:
            return None
        return max(1, math.ceil(times[-self.limit] + self.window - self.clock()))

    def fail(self, client: str) -> None:
        times = self._recent(client)
        times.append(self.clock())
        self.failures[client] = times
        self.failures.move_to_end(client)
        while len(self.failures) > self.clients:
            self.failures.popitem(last=False)


class TokenGuard:
    """ASGI guard in front of the MCP transport: 429 for a throttled client, 401 without a valid Atlas token,
    403 for another user's path, 503 while the cluster that holds the tokens does not answer. A token is checked
    against the verifier's cached table: a bad token costs the cluster nothing."""

    def __init__(self, verifier: TokenVerifier, throttle: FailureThrottle, app: ASGIApp) -> None:
        self.verifier = verifier
        self.throttle = throttle
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.check(scope)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def check(self, scope: Scope) -> JSONResponse | None:
        """None when the request may pass (and then the scope names the user)."""
        client = (scope.get("client") or ("unknown",))[0]
        wait = self.throttle.retry_after(client)
        if wait is not None:
            return refusal(429, f"too many failed authentications from this address: retry in {wait} s",
                           retry_after=wait)
        token = bearer_token(Headers(scope=scope))
        if token is None:
            self.throttle.fail(client)
            return refusal(401, "missing credential: send `Authorization: Bearer <your Atlas token>` "
                                "(an operator creates one with `atlas users create <user>`)")
        try:  # in a thread: the table is read from the cluster every `TOKEN_CACHE_SECONDS`
            owner = await anyio.to_thread.run_sync(self.verifier.verify, token)
        except AuthError as exc:
            self.throttle.fail(client)
            return refusal(401, str(exc))
        except ConnectionFailed:
            return refusal(503, CLUSTER_DOWN)
        if owner != scope["path_params"]["user_id"]:
            return refusal(403, f"this token belongs to another user: connect to {MCP_PATH.format(user_id=owner)}")
        scope[USER_KEY] = owner
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
    header = "Bearer <ATLAS_TOKEN>"
    # mcp-remote refuses plain HTTP beyond loopback unless told that the network is trusted.
    insecure = urlsplit(url).scheme == "http" and urlsplit(url).hostname not in LOOPBACK
    return {
        "url": url,
        "transport": TRANSPORT,
        "headers": {"Authorization": header},
        "token": f"the user's Atlas token, shown once by `atlas users create {user_id}` (or `atlas users rotate`)",
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


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def create_app(store: Store, *, host: str = C.MCP_HOST, port: int = C.MCP_PORT,
               public_url: str | None = None) -> FastAPI:
    """FastAPI app: the MCP endpoint (guarded by Atlas tokens) and its unauthenticated /info (no secrets in it).

    Reads always go through the user's stored DLS key, whatever `store.reader` is. The throttle counts the peer
    that connected, or the client a proxy in `settings.trusted_proxies` forwards for. /info names
    `public_url`, else the bound `host:port`, never the request's Host header (which a client chooses).
    """
    manager = StreamableHTTPSessionManager(app=build_mcp_server(store, KeyReader(store)), json_response=True,
                                           stateless=True, security_settings=transport_security(host))
    guard = TokenGuard(TokenVerifier(store.es, store.prefix), FailureThrottle(), manager.handle_request)
    advertised = public_url or base_url(host, port)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = FastAPI(title="Atlas MCP", lifespan=lifespan)
    app.router.routes.append(Route(MCP_PATH, endpoint=guard))
    if store.settings.trusted_proxies:  # uvicorn runs without proxy headers: only the listed proxies are believed
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(store.settings.trusted_proxies))

    @app.get(INFO_PATH)
    def info(user_id: str) -> dict:
        """Client configuration for `user_id`: URL, transport, the header to send."""
        try:
            return client_config(advertised, user_id)
        except AtlasError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None

    return app


def serve(*, host: str = C.MCP_HOST, port: int = C.MCP_PORT, prefix: str | None = None,
          public_url: str | None = None) -> None:
    """Run the app with uvicorn until interrupted (`atlas serve`, `make serve`)."""
    app = create_app(open_store(prefix), host=host, port=port, public_url=public_url)
    uvicorn.run(app, host=host, port=port, log_level="info", proxy_headers=False)


# --- in-process serving and a client (tests, notebooks) --------------------------------------------


class BackgroundServer:
    """The app under uvicorn in a daemon thread, on a port the OS picked; `stop()` (or `with`) ends it."""

    def __init__(self, app: FastAPI, *, host: str = C.MCP_HOST, port: int = 0, startup_timeout: float = 30) -> None:
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    proxy_headers=False))
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
        return base_url(self.host, self.port)

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
async def open_client(url: str, token: str, *, timeout: float = 60) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on `url`, authenticated with the user's Atlas token."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http, \
            streamable_http_client(url, http_client=http) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call_remote(url: str, token: str, name: str, arguments: dict) -> CallToolResult:
    """One tool call in its own client session (notebooks; an agent host keeps one session open instead)."""
    async with open_client(url, token) as session:
        return await session.call_tool(name, arguments)
