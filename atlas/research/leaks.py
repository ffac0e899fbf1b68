"""The leak sweep: every tenant's questions, and other tenants' own words as queries, under each guard.

Zero cross-tenant leaks is a release gate. The sweep runs the same recalls three ways,
(a) per-user DLS keys + the code filter, (b) DLS keys alone, (c) the service credential
+ the code filter, so that each guard is shown to hold on its own; an `unguarded`
configuration exists to show the sweep can fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from atlas.core import constants as C
from atlas.core.errors import ValidationError
from atlas.core.recall import clip_query, recall
from atlas.core.schemas import index_name
from atlas.core.store import Store
from atlas.core.tenancy import KeyReader
from atlas.core.validation import check_choice, check_user

#: Longest adversarial query (another tenant's document text), in characters.
ADVERSARIAL_QUERY_CHARS = 1000


@dataclass(frozen=True)
class Guard:
    """One way of reading: through per-user DLS keys or the service credential, with or without the code filter."""

    keys: bool
    code_filter: bool
    description: str


GUARDS: dict[str, Guard] = {
    "dls+filter": Guard(True, True, "per-user DLS keys and the code filter (production)"),
    "dls-only": Guard(True, False, "per-user DLS keys, code filter off: DLS alone"),
    "service+filter": Guard(False, True, "service credential and the code filter: the filter alone"),
    "unguarded": Guard(False, False, "service credential, no code filter: must leak (shows the sweep can fail)"),
}
DEFAULT_GUARDS = ("dls+filter", "dls-only", "service+filter")


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
            for tenant, queries in plan.items():
                for query in queries:
                    hits = recall(store, tenant, query, k=k, mode=mode, include_superseded=include_superseded,
                                  touch=False).hits
                    result.queries += 1
                    result.hits += len(hits)
                    for hit in hits:
                        if hit.user_id is None:
                            result.catalog += 1
                        elif hit.user_id == tenant:
                            result.own += 1
                        else:
                            result.leaks.append(Leak(tenant, query[:80], hit.id, hit.user_id, hit.text[:120]))
                    bar.update()
    finally:
        store.reader, store.code_filter = saved
        bar.close()
    return LeakReport(results)
