"""The leak sweep: every tenant's questions, and other tenants' own words as queries, under each guard.

Zero cross-tenant leaks is a release gate. The sweep runs the same recalls four ways,
(a) per-user DLS keys + the code filter, (b) DLS keys alone, (c) the service credential
+ the code filter, so that each guard is shown to hold on its own, and (d) through the MCP
server over HTTP, each tenant holding only their Atlas token, as a tenant really reads; an
`unguarded` configuration exists to show the sweep can fail.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import anyio
from tqdm.auto import tqdm

from atlas import constants as C
from atlas.core.errors import AtlasError, ValidationError
from atlas.core.recall import clip_query, recall
from atlas.core.schemas import all_indices, index_name
from atlas.core.store import Store
from atlas.core.validation import check_choice, check_user
from atlas.security.tenancy import KeyReader
from atlas.security.tokens import issue_token, revoke_tokens
from atlas.serve.mcp_server import BackgroundServer, create_app, open_client

#: Longest adversarial query (another tenant's document text), in characters.
ADVERSARIAL_QUERY_CHARS = 1000
#: The owner `SweepResult.by_owner` gives the shared catalog's hits.
CATALOG_OWNER = "(catalog)"  # not a valid user id, so never a tenant


@dataclass(frozen=True)
class Guard:
    """One way of reading: through per-user DLS keys or the service credential, with or without the code filter."""

    keys: bool
    code_filter: bool
    description: str
    #: Ask through the MCP server over HTTP with each tenant's Atlas token (the default recall mode).
    mcp: bool = False


GUARDS: dict[str, Guard] = {
    "dls+filter": Guard(True, True, "per-user DLS keys and the code filter (production)"),
    "dls-only": Guard(True, False, "per-user DLS keys, code filter off: DLS alone"),
    "service+filter": Guard(False, True, "service credential and the code filter: the filter alone"),
    "mcp+tokens": Guard(True, True, "the MCP server over HTTP, each tenant holding only their Atlas token", mcp=True),
    "unguarded": Guard(False, False, "service credential, no code filter: must leak (shows the sweep can fail)"),
}
DEFAULT_GUARDS = ("dls+filter", "dls-only", "service+filter", "mcp+tokens")


@dataclass(frozen=True)
class Seen:
    """One hit a tenant got: its id, its owner (None for the catalog) and its text."""

    id: str
    owner: str | None
    text: str


@dataclass(frozen=True)
class Leak:
    tenant: str
    query: str
    hit_id: str
    owner: str
    text: str


@dataclass
class SweepResult:
    """What one configuration returned over the whole sweep."""

    configuration: str
    description: str
    queries: int = 0
    hits: int = 0
    own: int = 0
    catalog: int = 0
    leaks: list[Leak] = field(default_factory=list)
    #: {tenant asking: {owner of the hit (`CATALOG_OWNER` for the catalog): hits}}: the tenant-by-tenant picture.
    by_owner: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))


@dataclass
class LeakReport:
    results: dict[str, SweepResult]

    def leaks(self, configuration: str) -> int:
        return len(self.results[configuration].leaks)

    def table(self, examples: int = 3) -> str:
        """One line per configuration, then a few leaks of each that leaked."""
        lines = [f"{'configuration':16} {'queries':>7} {'hits':>6} {'own':>6} {'catalog':>7} {'leaks':>6}"]
        lines += [f"{r.configuration:16} {r.queries:7} {r.hits:6} {r.own:6} {r.catalog:7} {len(r.leaks):6}"
                  for r in self.results.values()]
        for r in self.results.values():
            lines += [f"  {r.configuration}: {leak.tenant} asked {leak.query!r} and got {leak.owner}'s "
                      f"{leak.hit_id}: {leak.text!r}" for leak in r.leaks[:examples]]
        return "\n".join(lines)


def tenant_texts(store: Store, tenants: Sequence[str], per_tenant: int) -> dict[str, list[str]]:
    """The first `per_tenant` texts each tenant wrote, read with the service credential (adversarial queries)."""
    index = ",".join(index_name(store.prefix, t) for t in C.USER_MEMORY_TYPES)
    searches: list[dict] = []
    for tenant in tenants:
        searches += [{"index": index, "ignore_unavailable": True},
                     {"query": {"term": {"user_id": tenant}}, "size": per_tenant, "_source": ["text"],
                      "sort": [{"created_at": "asc"}]}]
    responses = store.es.msearch(searches=searches)["responses"]
    return {tenant: [h["_source"]["text"][:ADVERSARIAL_QUERY_CHARS] for h in resp.get("hits", {}).get("hits", [])]
            for tenant, resp in zip(tenants, responses, strict=True)}


def adversarial_queries(texts: Mapping[str, Sequence[str]], tenant: str, count: int) -> list[str]:
    """Up to `count` other tenants' texts (as queries: the head of a long one), round-robin over the tenants after
    `tenant`."""
    order = list(texts)
    others = order[order.index(tenant) + 1:] + order[:order.index(tenant)]
    picked: list[str] = []
    for depth in range(max((len(texts[o]) for o in others), default=0)):
        picked += [clip_query(texts[o][depth]) for o in others if depth < len(texts[o])]
    return picked[:count]


def leak_sweep(store: Store, questions: Mapping[str, Sequence[str]], *, k: int = 10,
               mode: C.RecallMode = C.DEFAULT_RECALL_MODE, adversarial: int = 3,
               configurations: Sequence[str] = DEFAULT_GUARDS, include_superseded: bool = True,
               progress: bool = True) -> LeakReport:
    """Ask every tenant's questions (and other tenants' texts) under each configuration; count foreign hits.

    A hit leaks when it carries another tenant's `user_id`. The DLS configurations need
    a key for every tenant (`create_user_key`). The store's reader and code filter are
    restored afterwards.
    """
    tenants = [check_user(t) for t in questions]
    if len(tenants) < 2:
        raise ValidationError("a leak sweep needs at least two tenants")
    for name in configurations:
        check_choice(name, GUARDS, "configuration")
    texts = tenant_texts(store, tenants, adversarial)
    plan = {t: [*questions[t], *adversarial_queries(texts, t, adversarial)] for t in tenants}
    saved = (store.reader, store.code_filter)
    results: dict[str, SweepResult] = {}
    bar = tqdm(total=len(configurations) * sum(map(len, plan.values())), desc="leak sweep", unit="query",
               disable=not progress)
    try:
        for name in configurations:
            guard = GUARDS[name]
            store.reader = KeyReader(store) if guard.keys else None
            store.code_filter = guard.code_filter
            result = results[name] = SweepResult(name, guard.description)
            ask = ask_over_mcp if guard.mcp else ask_in_process
            for tenant, answers in ask(store, plan, k=k, mode=mode, include_superseded=include_superseded,
                                       done=bar.update).items():
                for query, seen in zip(plan[tenant], answers, strict=True):
                    result.queries += 1
                    result.hits += len(seen)
                    for hit in seen:
                        result.by_owner[tenant][hit.owner or CATALOG_OWNER] += 1
                        if hit.owner is None:
                            result.catalog += 1
                        elif hit.owner == tenant:
                            result.own += 1
                        else:
                            result.leaks.append(Leak(tenant, query[:80], hit.id, hit.owner, hit.text[:120]))
    finally:
        store.reader, store.code_filter = saved
        bar.close()
    return LeakReport(results)


Answers = dict[str, list[list[Seen]]]


def ask_in_process(store: Store, plan: Mapping[str, Sequence[str]], *, k: int, mode: C.RecallMode,
                   include_superseded: bool, done: Callable[[], object]) -> Answers:
    """Each tenant's queries through `recall`, as the store is configured."""
    answers: Answers = {}
    for tenant, queries in plan.items():
        answers[tenant] = []
        for query in queries:
            hits = recall(store, tenant, query, k=k, mode=mode, include_superseded=include_superseded).hits
            answers[tenant].append([Seen(h.id, h.user_id, h.text) for h in hits])
            done()
    return answers


def ask_over_mcp(store: Store, plan: Mapping[str, Sequence[str]], *, k: int, mode: C.RecallMode,
                 include_superseded: bool, done: Callable[[], object]) -> Answers:
    """Each tenant's queries as `recall_memory` calls to the MCP server over HTTP, with a token issued to
    that tenant for the sweep (revoked after). The tool's answer carries no owner, so each hit's owner
    is looked up afterwards by id with the service credential. `mode` is the server's (the default); its
    recalls do not count as uses (`Store.record_use`), as in the other configurations."""
    tokens = {tenant: issue_token(store, tenant).secret for tenant in plan}
    arguments = {"k": k, "include_superseded": include_superseded}
    try:
        # In a thread of its own: the caller may already run an event loop (a notebook does).
        with BackgroundServer(create_app(replace(store, record_use=False))) as server, \
                ThreadPoolExecutor(max_workers=1) as pool:
            memories = {tenant: pool.submit(anyio.run, _recall_remote, server.url(tenant), tokens[tenant], queries,
                                            arguments, done).result()
                        for tenant, queries in plan.items()}
    finally:
        for tenant in plan:
            revoke_tokens(store, tenant)
    owners = owners_of(store, [m["id"] for answers in memories.values() for hits in answers for m in hits])
    return {tenant: [[Seen(m["id"], owners.get(m["id"], "(not found)"), m["text"]) for m in hits] for hits in answers]
            for tenant, answers in memories.items()}


async def _recall_remote(url: str, token: str, queries: Sequence[str], arguments: dict,
                         done: Callable[[], object]) -> list[list[dict]]:
    out = []
    async with open_client(url, token) as session:
        for query in queries:
            result = await session.call_tool("recall_memory", {"query": query, **arguments})
            if result.is_error or result.structured_content is None:
                raise AtlasError(f"recall_memory over MCP failed: {result.content}")
            out.append(result.structured_content["memories"])
            done()
    return out


def owners_of(store: Store, ids: Sequence[str]) -> dict[str, str | None]:
    """{id: user_id, None for an ownerless (catalog) document} of the prefix's documents, read with the service
    credential; an id found nowhere is absent."""
    unique = sorted(set(ids))
    if not unique:
        return {}
    hits = store.es.search(index=",".join(all_indices(store.prefix)), query={"ids": {"values": unique}},
                           size=len(unique), source_includes=["user_id"], ignore_unavailable=True)["hits"]["hits"]
    return {h["_id"]: h["_source"].get("user_id") for h in hits}
