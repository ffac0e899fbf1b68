"""Atlas-issued bearer tokens against the real cluster (security issue: tokens, not keys, leave the server).

Each test is one attack of the issue, or a property the fix must keep: a tenant never holds an
Elasticsearch credential (its DLS key leaks term statistics), keys are believed only when Atlas's
service principal made them and registered them, revoke kills every key and token of the user,
bad tokens are throttled, /info ignores the Host header, MCP errors never name the cluster, and
concurrent tenants stay apart. Keys and tokens live in the prefix's credentials index and die with the store.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest
from elasticsearch import AuthenticationException, AuthorizationException

from atlas import constants as C
from atlas.cli import app
from atlas.config import load_settings
from atlas.core.clock import utcnow
from atlas.core.errors import AuthError, NotFound
from atlas.core.memory import write_memory
from atlas.core.schemas import index_name
from atlas.core.store import Store
from atlas.security import tenancy, tokens
from atlas.security.connection import AtlasClient
from atlas.security.credentials import credentials_name
from atlas.security.privacy import erase_user
from atlas.security.secrets import read_secret
from atlas.security.tenancy import authenticate_user_key, build_role_descriptor, create_user_key, revoke_user_key
from atlas.serve import mcp_server
from atlas.serve.mcp_server import BackgroundServer, call_remote, create_app, mcp_url
from tests.test_mcp import leaves, run

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


class Clocks:
    """A token verifier's clocks: the real ones, moved on (no sleeping) or back by the test."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def now(self) -> datetime:
        return utcnow() + timedelta(seconds=self.ahead)

    def advance(self, seconds: float) -> None:
        self.ahead += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def issued(tstore) -> dict[str, tokens.Issued]:
    return {user: tokens.create_user(tstore, user) for user in ("sarah", "tom")}


@pytest.fixture
def server(tstore, issued, clocks, monkeypatch) -> Iterator[BackgroundServer]:
    """The MCP app in a thread, its token verifier on `clocks`."""
    monkeypatch.setattr(mcp_server, "TokenVerifier", partial(tokens.TokenVerifier, clock=clocks.monotonic,
                                                             now=clocks.now))
    with BackgroundServer(create_app(tstore)) as background:
        yield background


def post(server: BackgroundServer | ServerElsewhere, user: str, token: str | None, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(server.url(user), json=INIT, headers={**ACCEPT, **auth, **headers})


def live_keys(store: Store, user_id: str) -> list[str]:
    query = {"bool": {"filter": [{"term": {"metadata.atlas_prefix": store.prefix}},
                                 {"term": {"metadata.atlas_user_id": user_id}}, {"term": {"invalidated": False}}]}}
    return [key["id"] for key in store.es.security.query_api_keys(query=query, size=100)["api_keys"]]


def semantic_docs(store: Store, user_id: str) -> list[dict]:
    """The user's facts as stored, read with the service credential."""
    index = index_name(store.prefix, "semantic")
    store.es.indices.refresh(index=index)
    hits = store.es.search(index=index, query={"term": {"user_id": user_id}}, size=100)["hits"]["hits"]
    return [hit["_source"] for hit in hits]


# --- 1. a tenant never holds an Elasticsearch credential ------------------------------------------------


def documents_counted(explanation: dict) -> int:
    """The `n` of BM25's IDF in a hit's `_explanation`: the documents of the shard that contain the term."""
    if explanation["description"].startswith("n, number of documents containing term"):
        return int(explanation["value"])
    return max((documents_counted(detail) for detail in explanation.get("details", [])), default=0)


def test_a_dls_key_may_not_read_term_statistics_and_its_scores_count_nothing(tstore):
    """Issue 36, item 6: through alice's own DLS key, `_termvectors` printed how many of bob's documents hold a word
    (doc_freq 3); the key may now only search, and is refused. Its scores counted bob's documents too (BM25's IDF,
    n = 4); the indices' `boolean` similarity reads no term statistics (items 1 and 4). The key still stays on the
    server (docs/security.md: a query that expands terms reads the shard's term dictionary), and tenants get
    tokens. A token is useless to the cluster."""
    for i in range(3):
        write_memory(tstore, "bob", f"Bob's secret project zanzibar, note {i}", fact_type="person")
    write_memory(tstore, "alice", "My dog Biscuit has a zanzibar-blue collar", fact_type="person")
    alice_key = tenancy.user_client(tstore.es, "alice", tenancy.stored_key(tstore, "alice").encoded)
    semantic = index_name(tstore.prefix, "semantic")
    with pytest.raises(AuthorizationException, match="indices:data/read/tv"):
        alice_key.termvectors(index=semantic, doc={"text": "zanzibar"}, fields=["text"], term_statistics=True)
    found = alice_key.search(index=semantic, query={"match": {"text": "zanzibar"}}, explain=True)["hits"]["hits"]
    assert len(found) == 1, "DLS hides bob's documents"
    assert documents_counted(found[0]["_explanation"]) == 0 and found[0]["_score"] == 1.0, "no term statistics"
    issued = tokens.create_user(tstore, "carol")
    assert issued.secret.startswith(C.TOKEN_PREFIX) and issued.secret not in repr(issued)
    with pytest.raises(AuthenticationException):  # Elasticsearch itself refuses an Atlas token
        tstore.es.options(api_key=issued.secret).security.authenticate()
    with pytest.raises(AuthenticationException):
        tstore.es.options(bearer_auth=issued.secret).security.authenticate()
    stored = tstore.es.get(index=credentials_name(tstore.prefix), id=issued.token.id)["_source"]
    assert issued.secret not in str(stored) and len(stored["sha256"]) == 64


def test_cli_shows_a_token_once_never_the_key(tstore, runner):
    created = runner.invoke(app, ["users", "create", "alice", "--prefix", tstore.prefix])
    assert created.exit_code == 0, created.output
    key = tenancy.stored_key(tstore, "alice")
    assert key.encoded not in created.output
    [token] = [w for w in created.output.split() if w.startswith(C.TOKEN_PREFIX)]
    assert tokens.TokenVerifier(tstore.es, tstore.prefix).verify(token) == "alice"
    listed = runner.invoke(app, ["users", "list", "--prefix", tstore.prefix]).output
    assert "alice" in listed and token not in listed and key.encoded not in listed
    rotated = runner.invoke(app, ["users", "rotate", "alice", "--prefix", tstore.prefix])
    [new] = [w for w in rotated.output.split() if w.startswith(C.TOKEN_PREFIX)]
    verifier = tokens.TokenVerifier(tstore.es, tstore.prefix)
    assert verifier.verify(new) == "alice"
    with pytest.raises(AuthError, match="revoked"):
        verifier.verify(token)
    assert runner.invoke(app, ["users", "revoke", "alice", "--prefix", tstore.prefix]).exit_code == 0
    with pytest.raises(AuthError, match="revoked"):
        tokens.TokenVerifier(tstore.es, tstore.prefix).verify(new)
    assert live_keys(tstore, "alice") == []


def test_mcp_refuses_raw_keys_and_forged_expired_revoked_rotated_tokens(tstore, issued, server, clocks):
    sarah_key = tenancy.stored_key(tstore, "sarah").encoded
    assert post(server, "sarah", issued["sarah"].secret).status_code == 200
    assert post(server, "sarah", sarah_key).status_code == 401, "a raw Elasticsearch key is not a bearer any more"
    forged = C.TOKEN_PREFIX + issued["sarah"].secret[len(C.TOKEN_PREFIX):][::-1]
    assert post(server, "sarah", forged).status_code == 401
    assert post(server, "sarah", issued["tom"].secret).status_code == 403
    short = tokens.issue_token(tstore, "sarah", expiration="1s")
    rotated = tokens.rotate_user(tstore, "tom")
    revoked_at = tokens.revoke_user(tstore, "sarah")
    assert revoked_at.token_ids and revoked_at.key_ids
    clocks.advance(C.TOKEN_CACHE_SECONDS + 1.1)  # the server's cache honours revocation within this bound
    for token, user in ((short.secret, "sarah"), (issued["sarah"].secret, "sarah"), (issued["tom"].secret, "tom")):
        response = post(server, user, token)
        assert response.status_code == 401, (user, response.text)
        assert "Traceback" not in response.text
    assert post(server, "tom", rotated.secret).status_code == 200


def test_expired_token_is_refused(tstore, clocks):
    tokens.create_user(tstore, "alice")
    short = tokens.issue_token(tstore, "alice", expiration="1s")
    verifier = tokens.TokenVerifier(tstore.es, tstore.prefix, clock=clocks.monotonic, now=clocks.now)
    assert verifier.verify(short.secret) == "alice"
    clocks.advance(1.2)
    with pytest.raises(AuthError, match="expired"):
        verifier.verify(short.secret)


# --- 2. keys minted by someone else are not believed -----------------------------------------------


@pytest.fixture
def own_key_user(operator_es) -> Iterator[tuple[str, str]]:
    """A native user whose only privilege is manage_own_api_key."""
    name, password = f"own-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    operator_es.security.put_role(name=name, cluster=["manage_own_api_key"])
    operator_es.security.put_user(username=name, password=password, roles=[name])
    yield name, password
    operator_es.security.invalidate_api_key(username=name)
    operator_es.security.delete_user(username=name)
    operator_es.security.delete_role(name=name)


def test_a_key_minted_by_another_principal_is_not_believed(tstore, own_key_user):
    write_memory(tstore, "bob", "Bob's hub is called Lantern", fact_type="device")
    forged = tstore.es.options(basic_auth=own_key_user).security.create_api_key(
        name=tenancy.key_name(tstore.prefix, "bob"), role_descriptors=build_role_descriptor(tstore.prefix, "bob"),
        metadata={"atlas_user_id": "bob", "atlas_prefix": tstore.prefix})
    with pytest.raises(AuthError, match="not created by|not registered"):
        authenticate_user_key(tstore, forged["encoded"])
    with BackgroundServer(create_app(tstore)) as server:
        response = httpx.post(server.url("bob"), headers={**ACCEPT, "Authorization": f"Bearer {forged['encoded']}"},
                              json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                    "params": {"name": "write_memory",
                                               "arguments": {"text": "Bob wants his hub reset", "memory_type":
                                                             "semantic"}}})
    assert response.status_code == 401
    tstore.es.indices.refresh(index=tstore.indices)
    assert tstore.es.count(index=tstore.indices, query={"term": {"user_id": "bob"}})["count"] == 1
    registered = tenancy.stored_key(tstore, "bob")
    assert authenticate_user_key(tstore, registered.encoded) == "bob"


# --- 3. revoke kills every key and token of the user --------------------------------------------------


def mint_elsewhere(store: Store, user_id: str) -> str:
    """A live key for the user that the credentials index does not hold (made by hand, by an older Atlas, or by a
    server that lost a race): revoke must find it all the same."""
    body = tenancy.build_create_key_body(store.prefix, user_id)
    return store.es.security.create_api_key(**body, refresh=True)["id"]


def test_revoke_kills_keys_minted_elsewhere(tstore):
    create_user_key(tstore, "alice")
    mint_elsewhere(tstore, "alice")
    assert len(live_keys(tstore, "alice")) == 2
    revoke_user_key(tstore, "alice")
    assert live_keys(tstore, "alice") == [], "a key minted elsewhere survived revoke"
    tokens.create_user(tstore, "bob")
    tokens.issue_token(tstore, "bob")
    mint_elsewhere(tstore, "bob")
    revocation = tokens.revoke_user(tstore, "bob")
    assert len(revocation.key_ids) == 2 and len(revocation.token_ids) == 2
    assert live_keys(tstore, "bob") == []
    assert all(t.state() == "revoked" for t in tokens.list_tokens(tstore) if t.user_id == "bob")
    with pytest.raises(NotFound):
        tokens.revoke_user(tstore, "nobody")


def test_a_user_provisioned_by_two_servers_at_once_keeps_one_key(tstore):
    """Two servers that both find no key for a user each mint one; the first stored wins, the other is invalidated."""
    first = tenancy._issue(tstore, "carol", None, first=True)
    second = tenancy._issue(tstore, "carol", None, first=True)  # a server that had not seen the first one's key
    assert second == first and live_keys(tstore, "carol") == [first.id]


# --- revocation and erase reach every server at once -------------------------------------------------------


def write_through(server: BackgroundServer | ServerElsewhere, user: str, token: str, text: str) -> str:
    """What a tenant's `write_memory` through `server` answered: "ok", the error's kind, or "401" when the server
    refused the token before any tool ran."""
    try:
        result = run(call_remote, server.url(user), token, "write_memory", {"text": text, "memory_type": "semantic"})
    except Exception as exc:
        if any(str(leaf).startswith("401") for leaf in leaves(exc)):
            return "401"
        raise
    return result.content[0].text.split(":")[0] if result.is_error else "ok"


class ServerElsewhere:
    """`atlas serve` in another process, as on a second machine: its Atlas home is empty (no file of the first
    server's), and it shares only the cluster, the service credential and the models (`.cache`, symlinked)."""

    def __init__(self, store: Store, home: Path) -> None:
        (home / ".atlas").mkdir(parents=True)
        (home / ".cache").symlink_to(load_settings().cache_dir)
        env = {**os.environ, "ATLAS_HOME": str(home)}
        if (real := load_settings()).local:
            creds = read_secret(real.service_credentials_path) or {}
            env |= {"ES_URL": creds["url"], "ES_USERNAME": creds["username"], "ES_PASSWORD": creds["password"]}
        with socket.socket() as probe:
            probe.bind((C.MCP_HOST, 0))
            self.port = probe.getsockname()[1]
        self.log = (home / "serve.log").open("w")
        self.process = subprocess.Popen([str(Path(sys.executable).parent / "atlas"), "serve", "--port", str(self.port),
                                         "--prefix", store.prefix], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.home = home
        deadline = time.monotonic() + 180
        while not self.ready():
            assert self.process.poll() is None, (home / "serve.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the second server did not answer within 180 s"
            time.sleep(0.5)

    def ready(self) -> bool:
        try:
            return httpx.get(self.url("probe") + "/info").status_code == 200
        except httpx.TransportError:
            return False

    def url(self, user_id: str) -> str:
        return mcp_url(f"http://{C.MCP_HOST}:{self.port}", user_id)

    def __enter__(self) -> ServerElsewhere:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def recall_through(server: BackgroundServer | ServerElsewhere, user: str, token: str, query: str) -> str:
    """The texts a tenant's `recall_memory` through `server` returned, or the error's kind."""
    result = run(call_remote, server.url(user), token, "recall_memory", {"query": query})
    return result.content[0].text.split(":")[0] if result.is_error else result.content[0].text


def test_two_servers_share_tokens_keys_and_revocations_through_the_cluster(tstore, issued, tmp_path):
    """Issue 36, item 2: two MCP servers in front of one cluster, on machines that share no file. Before, each
    server kept tokens and keys in its own `.atlas/*.json`, so the second refused the first's token (401, "this
    token is unknown"), and an operator had to copy the files, revocations included, by hand. Tokens and keys
    live in the cluster now: a token issued through either works on both, a revoke through one stops reads and
    writes through the other at once (the key is dead in the cluster) and its token within
    `C.TOKEN_CACHE_SECONDS`, and the revoking server refuses the token at once."""
    secret = issued["sarah"].secret
    with BackgroundServer(create_app(tstore)) as first, ServerElsewhere(tstore, tmp_path / "other") as second:
        assert post(second, "sarah", secret).status_code == 200, "the second server refused the first's token"
        assert write_through(second, "sarah", secret, "Sarah's hub is called Beacon") == "ok"
        assert "Beacon" in recall_through(first, "sarah", secret, "what is my hub called?")
        tokens.revoke_user(tstore, "sarah")  # through the first server's operator
        revoked = time.monotonic()
        assert post(first, "sarah", secret).status_code == 401, "the revoking server's cache still held the token"
        assert write_through(second, "sarah", secret, "written after the revocation") == "AuthError"
        assert recall_through(second, "sarah", secret, "what is my hub called?") == "AuthError"
        while post(second, "sarah", secret).status_code != 401:
            assert time.monotonic() - revoked < C.TOKEN_CACHE_SECONDS + 5, "the second server kept the token"
            time.sleep(0.5)
        again = tokens.rotate_user(tstore, "sarah")  # a new token is known to the other server within the bound too
        rotated = time.monotonic()
        while (answer := write_through(second, "sarah", again.secret, "Sarah's hub moved to the loft")) == "401":
            assert time.monotonic() - rotated < C.TOKEN_CACHE_SECONDS + 5, "the second server never took the token"
            time.sleep(1.5)  # a few failures only: ten in a minute would throttle this address
        assert answer == "ok"
    assert sorted(d["text"] for d in semantic_docs(tstore, "sarah")) == \
        ["Sarah's hub is called Beacon", "Sarah's hub moved to the loft"]


def test_an_erased_user_cannot_write_within_the_token_cache(tstore, issued, server, clocks):
    """After `erase_user` returns, the erased user's token writes nothing: the erasing process's verifiers forget
    their cache at once (401), and another server's cache (`C.TOKEN_CACHE_SECONDS`) is met by the live-key check
    (`test_two_servers_share_tokens_keys_and_revocations_through_the_cluster`)."""
    secret = issued["sarah"].secret
    assert write_through(server, "sarah", secret, "Sarah's hub is called Beacon") == "ok"
    started = time.monotonic()
    erase_user(tstore, "sarah")
    clocks.advance(started - time.monotonic())  # the erasure's merge waits ~30 s: the verifier sees none of it
    assert write_through(server, "sarah", secret, "written after the erase") == "401", \
        "an erased user's token wrote within the verifier's cache"
    assert semantic_docs(tstore, "sarah") == []


# --- 4. throttling, 7. Host header and cluster URL -------------------------------------------------------


def test_failed_authentications_are_throttled_per_client(tstore, issued, server):
    statuses = [post(server, "sarah", f"{C.TOKEN_PREFIX}wrong-{i}").status_code
                for i in range(C.AUTH_FAILURE_LIMIT + 2)]
    assert statuses[:C.AUTH_FAILURE_LIMIT] == [401] * C.AUTH_FAILURE_LIMIT
    throttled = post(server, "sarah", issued["sarah"].secret)
    assert statuses[-1] == 429 and throttled.status_code == 429
    assert 0 < int(throttled.headers["retry-after"]) <= C.AUTH_FAILURE_WINDOW


def test_forwarded_addresses_count_only_from_listed_proxies(tstore, issued, server):
    """A local process that sends a new X-Forwarded-For with each bad token is one client to the throttle, unless
    its address is listed in ATLAS_TRUSTED_PROXIES (then each forwarded address counts on its own)."""
    def failures(target: BackgroundServer, addresses: list[str]) -> list[int]:
        return [post(target, "sarah", f"{C.TOKEN_PREFIX}wrong-{i}", **{"X-Forwarded-For": address}).status_code
                for i, address in enumerate(addresses)]

    forged = [f"203.0.113.{i}" for i in range(C.AUTH_FAILURE_LIMIT + 1)]
    assert failures(server, forged)[-1] == 429, "a new X-Forwarded-For on each try escaped the throttle"
    tstore.settings = replace(tstore.settings, trusted_proxies=("127.0.0.1",))
    with BackgroundServer(create_app(tstore)) as behind_a_proxy:
        assert 429 not in failures(behind_a_proxy, forged), "a listed proxy's clients are told apart"
        assert failures(behind_a_proxy, ["198.51.100.7"] * (C.AUTH_FAILURE_LIMIT + 1))[-1] == 429


def test_info_ignores_the_host_header(tstore):
    with BackgroundServer(create_app(tstore)) as server:  # bound to a random port, configured for the default
        info = httpx.get(server.url("sarah") + "/info", headers={"Host": "evil.example:666"}).json()
    assert "evil" not in str(info)
    assert info["url"] == "http://127.0.0.1:8765/api/atlas/mcp/sarah"
    public = create_app(tstore, public_url="https://atlas.example.com")
    with BackgroundServer(public) as server:
        info = httpx.get(server.url("sarah") + "/info", headers={"Host": "evil.example"}).json()
    assert info["url"] == "https://atlas.example.com/api/atlas/mcp/sarah"


def test_mcp_errors_do_not_name_the_cluster(tstore, issued, monkeypatch):
    """A cluster that does not answer: the guard, which reads the tokens from it, says 503; a tool whose token was
    checked before the cluster went (here: tokens read from the live one) says ConnectionFailed. Neither names it."""
    dead = replace(tstore, es=AtlasClient(hosts=["http://127.0.0.1:9"], request_timeout=2, max_retries=0))
    with BackgroundServer(create_app(dead)) as server:
        refused = post(server, "sarah", issued["sarah"].secret)
    assert refused.status_code == 503 and "127.0.0.1:9" not in refused.text and "http://" not in refused.text
    monkeypatch.setattr(mcp_server, "TokenVerifier", lambda es, prefix: tokens.TokenVerifier(tstore.es, prefix))
    with BackgroundServer(create_app(dead)) as server:
        result = run(call_remote, server.url("sarah"), issued["sarah"].secret, "recall_memory", {"query": "hub"})
    text = result.content[0].text
    assert result.is_error and "127.0.0.1:9" not in text and "http://" not in text, text
    assert text.startswith("ConnectionFailed")


# --- two tenants at the same moment -----------------------------------------------------------------


def test_concurrent_tenants_stay_apart(tstore, issued, server):
    own = {"sarah": "Sarah's hub is called Beacon", "tom": "Tom's hub is called Lantern"}
    for user, text in own.items():
        write_memory(tstore, user, text, fact_type="device")
    rounds = 12
    seen: dict[str, list[set[str]]] = {"sarah": [], "tom": []}

    async def one(user: str) -> None:
        result = await call_remote(server.url(user), issued[user].secret, "recall_memory",
                                   {"query": "what is my hub called", "k": 10})
        assert not result.is_error, result.content[0].text
        seen[user].append({m["text"] for m in result.structured_content["memories"]})

    async def storm() -> None:
        async with anyio.create_task_group() as group:
            for _ in range(rounds):
                for user in own:
                    group.start_soon(one, user)

    run(storm)
    for user, texts in seen.items():
        other = own["tom" if user == "sarah" else "sarah"]
        assert len(texts) == rounds
        assert all(own[user] in t and other not in t for t in texts), (user, texts)
