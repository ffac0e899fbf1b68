"""LangGraph's long-term memory store on Atlas: `AtlasStore`, a `BaseStore` whose items are Atlas memories.

    from atlas import open_store
    from atlas.integrations.langgraph import AtlasStore

    store = AtlasStore(open_store("agents"))
    store.put(("sarah", "memories"), "home", {"content": "Sarah lives in Edinburgh"})
    store.search(("sarah",), query="where does Sarah live?")

How a LangGraph item maps onto Atlas:

- **User**: the first label of a namespace is the Atlas user id (`check_user`). Every read of an item runs through
  that user's own client (`Store.read_client`: the user's DLS key, with tenancy) and the code filter, so a namespace
  of one user never reads another's. An empty namespace, a bad user id, or a label that is empty, not printable or
  holds "." raises `InvalidNamespace`; a namespace and a key are keywords of at most 256 characters each.
  `AtlasStore(store, user_id="sarah")` serves one user: another user's namespace raises `AuthError`, and a search
  or listing whose path names no user is that user's. An unbound store refuses those.
- **Item**: one current semantic or procedural memory with the whole namespace (`namespace`: the labels joined by
  "."), the `key` and the value as given (`value`: kept in `_source`, not indexed; passed through JSON). The text
  recall searches is the value's "content", else its "text" (when a string), else the value as JSON.
- **Memory type**: a semantic fact, typed by the value's "fact_type" if it has one; a procedural playbook when the
  value has "memory_type": "procedural" (with "steps", and optionally "name" and "trigger").
- **Overwrite**: a put of an existing key writes a new memory that supersedes the current one
  (`supersession.supersede`). get and search return the current value only; the old one stays in the audit chain
  (`atlas.history`, `recall(..., include_superseded=True)`).
- **Delete** (a put of None): a hard delete of every version of the key, its audit chain included, in one `_bulk`.
  Forgetting the current version alone would make the previous value current again (`memory.forget_memory`).
- **Timestamps**: `created_at` and `updated_at` are both the write time of the current version (LangGraph's
  InMemoryStore also sets both on every put).
- **Search with a query**: Atlas recall (BM25 and kNN fused, decay, the second stage) over the user's semantic and
  procedural memories, its best `MAX_K`; the namespace prefix and the filter are applied to those here, then offset
  and limit. An item outside the user's best MAX_K for the query is not found. The order is recall's and `score` its
  fused (RRF) score, which the second stage may reorder. A search only reads, like `atlas.recall`: it does not
  count as a use of what it returns (the MCP recall tool does), so paging through a query's results is stable.
- **Search without a query**: the current items under the prefix, newest first (then by namespace and key), the
  filter applied here page by page; `score` is None.
- **Filters** are applied to the stored value: a plain value or a nested dict must be equal; "$eq" and "$ne" compare
  any value, "$gt", "$gte", "$lt" and "$lte" numbers with numbers and strings with strings (nothing else matches).
- **list_namespaces**: the user's namespaces with a current item (a composite aggregation), then the prefix and
  suffix conditions ("*" matches any label), max_depth, offset and limit, in sorted order.
- **Batches** run their reads first and their writes after, as LangGraph's InMemoryStore does, and the last put of a
  key wins. Per user, the gets, the searches without a query and the look-ups of the writes are one `_msearch`;
  each search with a query is one recall; the deletes of a batch are one `_bulk`, and so are its puts of new keys
  (embedded in one batch; each one's hubness among the user's memories as they stood before the batch, in one
  `_msearch`). An overwrite is a supersession of its own. Every op is checked before anything is read or written.
- **Not supported**: TTL (Atlas decays memories instead of expiring them) and an index configuration, the store's
  or a put's (Atlas embeds with its own models): both raise `Unsupported`, which says what to do instead.
"""

from __future__ import annotations

import asyncio
import json
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from elasticsearch import Elasticsearch

from atlas import constants as C
from atlas.core.clock import parse_date
from atlas.core.documents import build_document, index_documents
from atlas.core.errors import AtlasError, AuthError, NotFound, ValidationError
from atlas.core.recall import recall
from atlas.core.schemas import archive_name, build_sole_owner_filter, index_name
from atlas.core.store import Store
from atlas.core.supersession import supersede
from atlas.core.validation import check_choice, check_k, check_label, check_steps, check_text, check_user

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
    )
except ImportError as exc:
    raise ImportError("atlas.integrations.langgraph needs LangGraph: pip install 'atlas-memory[langgraph]'") from exc

__all__ = ["AtlasStore", "InvalidNamespace", "Unsupported"]

#: The memory types an item can be (episodes are the agent loop's; the catalog has no owner).
ITEM_TYPES: tuple[C.UserMemoryType, ...] = ("semantic", "procedural")
#: Joins the labels of a namespace into the `namespace` keyword; LangGraph refuses it inside a label.
SEPARATOR = "."
#: What a read of items takes from `_source`.
ITEM_FIELDS = ["namespace", "key", "value", "created_at"]
#: The order of a search without a query: newest first, ties in namespace and key order.
NEWEST = [{"created_at": "desc"}, {"namespace": "asc"}, {"key": "asc"}]
#: The comparisons a filter may use besides "$eq" and "$ne".
ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt,
                                                    "$lte": operator.le}
OPERATORS = ("$eq", "$ne", *ORDERINGS)


class Unsupported(AtlasError, NotImplementedError):
    """A LangGraph store feature Atlas does not have; the message says what to use instead."""


class InvalidNamespace(ValidationError, InvalidNamespaceError):
    """A namespace Atlas cannot map to a user: empty, a bad user id as its first label, or a bad label."""


TTL_UNSUPPORTED = ("AtlasStore has no TTL: Atlas keeps memories until they are deleted and lets unused ones decay in "
                   "recall instead of expiring them. Leave ttl out, and delete an item (a put of None) to remove it")
INDEX_UNSUPPORTED = ("AtlasStore takes no index configuration: Atlas embeds every item with its own models "
                     "(ATLAS_EMBEDDER, ATLAS_RERANKER) and searches the value's \"content\" or \"text\", else the "
                     "whole value. Put the text to search under \"content\" and leave index out")


class ItemFields(TypedDict, total=False):
    """What an item's memory stores beside its text (`None`: left out, see `build_document`)."""

    namespace: str
    key: str
    value: dict
    fact_type: C.FactType | None
    name: str | None
    trigger: str | None
    steps: list[str] | None


class Memory(NamedTuple):
    """What a put writes: the text recall searches, the memory type, the fields beside them."""

    text: str
    memory_type: C.UserMemoryType
    fields: ItemFields


@dataclass(frozen=True)
class Write:
    """A checked put: the memory to write, or None to delete the item."""

    user_id: str
    namespace: tuple[str, ...]
    key: str
    memory: Memory | None


# --- namespaces, values and filters --------------------------------------------------------------


def check_labels(path: object, *, what: str) -> tuple[str, ...]:
    """A namespace path: a tuple (or list) of non-empty one-line labels without the separator."""
    if not isinstance(path, tuple | list):
        raise InvalidNamespace(f"{what} must be a tuple of labels, not {type(path).__name__}")
    for label in path:
        if not isinstance(label, str) or not label or SEPARATOR in label or not label.isprintable():
            raise InvalidNamespace(f"{what} {tuple(path)!r} has the label {label!r}: labels are non-empty, printable "
                                   f"strings without {SEPARATOR!r}")
    return tuple(path)


def check_namespace(namespace: object, *, what: str = "namespace") -> tuple[str, ...]:
    """A namespace (or a prefix of one) whose first label is the Atlas user id."""
    labels = check_labels(namespace, what=what)
    if not labels:
        raise InvalidNamespace(f"{what} is empty: its first label must be the Atlas user id, as in ('sarah', ...)")
    try:
        check_user(labels[0])
    except ValidationError as exc:
        raise InvalidNamespace(f"the first label of {what} {labels!r} must be the Atlas user id: {exc}") from None
    check_label(SEPARATOR.join(labels), what)
    return labels


def join(namespace: tuple[str, ...]) -> str:
    return SEPARATOR.join(namespace)


def split(stored: str) -> tuple[str, ...]:
    return tuple(stored.split(SEPARATOR))


def item_text(value: Mapping[str, Any]) -> str:
    """What recall searches: the value's "content", else its "text" (a non-blank string), else the value as JSON."""
    for field in ("content", "text"):
        text = value.get(field)
        if isinstance(text, str) and text.strip():
            return text
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def plain_value(value: object) -> dict:
    """The value as it will be read back: a JSON object (tuples become lists)."""
    if not isinstance(value, Mapping):
        raise ValidationError(f"an item's value must be a mapping (or None to delete it), not {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"an item's value must be JSON: {exc}") from None


def memory_of(value: dict, namespace: tuple[str, ...], key: str) -> Memory:
    """The memory an item's value becomes (the module docstring says how)."""
    fields: ItemFields = {"namespace": join(namespace), "key": key, "value": value}
    text = check_text(item_text(value), what="the item's text")
    memory_type = check_choice(value.get("memory_type", "semantic"), ITEM_TYPES, "the value's memory_type")
    if memory_type == "procedural":
        steps = check_steps(value.get("steps"), what="the value's steps")
        if not steps:
            raise ValidationError("a procedural item needs its ordered \"steps\" in the value")
        fields["steps"] = steps
        fields["name"] = check_label(value.get("name"), "the value's name")
        if value.get("trigger") is not None:
            fields["trigger"] = check_text(value["trigger"], what="the value's trigger")
        return Memory(text, "procedural", fields)
    if value.get("fact_type") is not None:
        check_choice(value["fact_type"], C.FACT_TYPES, "the value's fact_type")
        fields["fact_type"] = value["fact_type"]
    return Memory(text, "semantic", fields)


def check_filter(conditions: object) -> dict:
    """A search filter: field -> a value to equal, a nested filter, or {operator: value}."""
    if not isinstance(conditions, Mapping):
        raise ValidationError(f"a filter must be a mapping of field to condition, not {type(conditions).__name__}")
    for want in conditions.values():
        if isinstance(want, Mapping) and any(str(k).startswith("$") for k in want):
            for name in want:
                check_choice(name, OPERATORS, "a filter operator")
        elif isinstance(want, Mapping):
            check_filter(want)
    return dict(conditions)


def matches(value: Mapping[str, Any], conditions: Mapping[str, Any]) -> bool:
    """Whether a stored value satisfies a checked filter (`check_filter`)."""
    return all(_holds(value.get(field), want) for field, want in conditions.items())


def _holds(actual: object, want: object) -> bool:
    if isinstance(want, Mapping) and any(str(k).startswith("$") for k in want):
        return all(_compares(actual, name, bound) for name, bound in want.items())
    if isinstance(want, Mapping):
        return isinstance(actual, Mapping) and matches(actual, want)
    return actual == want


def _compares(actual: object, name: str, bound: object) -> bool:
    if name == "$eq":
        return actual == bound
    if name == "$ne":
        return actual != bound
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (actual, bound))
    texts = isinstance(actual, str) and isinstance(bound, str)
    return (numbers or texts) and ORDERINGS[name](actual, bound)


def matches_condition(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    """Whether a namespace starts (prefix) or ends (suffix) with the condition's path, "*" matching any label."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    labels = namespace[:len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(want in ("*", label) for want, label in zip(path, labels, strict=True))


# --- request bodies -------------------------------------------------------------------------------


def build_items_query(user_id: str, clauses: list[dict], *, code_filter: bool, current: bool = True) -> dict:
    """The user's items matching `clauses`, only the current versions unless `current` is off; with `code_filter`,
    filtered on the sole owner too (the twin of the DLS query)."""
    owner = [build_sole_owner_filter(user_id)] if code_filter else []
    query: dict = {"bool": {"filter": [{"exists": {"field": "namespace"}}, *clauses, *owner]}}
    if current:
        query["bool"]["must_not"] = [{"exists": {"field": "superseded_by"}}]
    return query


def build_prefix_clause(prefix: tuple[str, ...]) -> list[dict]:
    """Items whose namespace is `prefix` or lies under it (none for the empty prefix)."""
    if not prefix:
        return []
    path = join(prefix)
    return [{"bool": {"should": [{"term": {"namespace": path}}, {"prefix": {"namespace": path + SEPARATOR}}],
                      "minimum_should_match": 1}}]


def build_get_body(user_id: str, namespace: tuple[str, ...], key: str, *, code_filter: bool) -> dict:
    """The current version of an item (the newest, should two concurrent first puts have left two)."""
    clauses = [{"term": {"namespace": join(namespace)}}, {"term": {"key": key}}]
    return {"query": build_items_query(user_id, clauses, code_filter=code_filter), "sort": NEWEST, "size": 1,
            "_source": {"includes": ITEM_FIELDS}}


def build_versions_body(user_id: str, namespace: tuple[str, ...], key: str, *, code_filter: bool,
                        current: bool) -> dict:
    """The versions of an item a write acts on: the current one (two, should concurrent first puts have left two),
    which a put supersedes, or every one, current or superseded, which a delete removes."""
    clauses = [{"term": {"namespace": join(namespace)}}, {"term": {"key": key}}]
    return {"query": build_items_query(user_id, clauses, code_filter=code_filter, current=current),
            "size": C.LIST_PAGE_SIZE, "_source": False}


def build_listing_body(user_id: str, prefix: tuple[str, ...], *, code_filter: bool, size: int,
                       after: list | None = None) -> dict:
    """One page of the current items under `prefix`, newest first, after the previous page's last sort values."""
    body: dict = {"query": build_items_query(user_id, build_prefix_clause(prefix), code_filter=code_filter),
                  "sort": NEWEST, "size": size, "_source": {"includes": ITEM_FIELDS}}
    if after is not None:
        body["search_after"] = after
    return body


def build_namespaces_body(user_id: str, *, code_filter: bool, after: dict | None = None) -> dict:
    """One page of the user's namespaces that hold a current item, in order (a composite aggregation)."""
    composite: dict = {"size": C.LIST_PAGE_SIZE, "sources": [{"namespace": {"terms": {"field": "namespace"}}}]}
    if after is not None:
        composite["after"] = after
    return {"size": 0, "query": build_items_query(user_id, [], code_filter=code_filter),
            "aggs": {"namespaces": {"composite": composite}}}


def page_size(op: SearchOp) -> int:
    """The page of a search without a query: what the op returns, or a full page when a filter will thin it."""
    return C.LIST_PAGE_SIZE if op.filter else max(1, min(op.offset + op.limit, C.LIST_PAGE_SIZE))


# --- results ----------------------------------------------------------------------------------------


def to_item(source: Mapping[str, Any]) -> Item:
    written = parse_date(source["created_at"])
    return Item(value=source["value"], key=source["key"], namespace=split(source["namespace"]),
                created_at=written, updated_at=written)


def to_search_item(source: Mapping[str, Any], score: float | None) -> SearchItem:
    written = parse_date(source["created_at"])
    return SearchItem(split(source["namespace"]), source["key"], source["value"], written, written, score)


# --- the store --------------------------------------------------------------------------------------


class AtlasStore(BaseStore):
    """LangGraph's `BaseStore` on an Atlas `Store`; the module docstring says how items map onto memories.

    `user_id` binds the store to one user. `index` and `ttl` exist only to refuse what Atlas does not do.
    """

    def __init__(self, store: Store, *, user_id: str | None = None, index: IndexConfig | None = None,
                 ttl: TTLConfig | None = None) -> None:
        if index is not None:
            raise Unsupported(INDEX_UNSUPPORTED)
        if ttl is not None:
            raise Unsupported(TTL_UNSUPPORTED)
        self.store = store
        self.user_id = None if user_id is None else check_user(user_id)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run `ops`: every one checked first, then the reads, then the writes (the last put of a key wins)."""
        ops = list(ops)
        owners = [self._owner(op) for op in ops]
        writes = {(tuple(op.namespace), op.key): self._checked_write(op, user)
                  for op, user in zip(ops, owners, strict=True) if isinstance(op, PutOp)}
        results: list[Result] = [None] * len(ops)
        versions: dict[tuple[tuple[str, ...], str], list[dict]] = {}
        for user in dict.fromkeys(owners):
            reads = [i for i, op in enumerate(ops) if owners[i] == user
                     and (isinstance(op, GetOp) or isinstance(op, SearchOp) and not op.query)]
            mine = [(target, w) for target, w in writes.items() if w.user_id == user]
            pages = self._msearch(user, [self._read_request(user, ops[i]) for i in reads]
                                  + [self._versions_request(w) for _, w in mine])
            for i, page in zip(reads, pages[:len(reads)], strict=True):
                results[i] = self._answer(user, ops[i], page)
            versions.update((target, page) for (target, _), page in zip(mine, pages[len(reads):], strict=True))
        for i, op in enumerate(ops):
            if isinstance(op, SearchOp) and op.query:
                results[i] = self._recall(owners[i], op, op.query)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list(owners[i], op)
        self._write(list(writes.values()), versions)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """`batch` in a worker thread (the Elasticsearch client and the models are synchronous)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # --- checks --------------------------------------------------------------------------------------

    def _owner(self, op: Op) -> str:
        """The user whose memory `op` reads or writes, after checking the op."""
        if isinstance(op, GetOp | PutOp):
            check_label(op.key, "key")
            return self._served(check_namespace(op.namespace)[0])
        if isinstance(op, SearchOp):
            check_k(op.limit, low=0, limit=10_000, what="limit")
            check_k(op.offset, low=0, limit=10_000, what="offset")
            if op.filter is not None:
                check_filter(op.filter)
            if op.namespace_prefix:
                return self._served(check_namespace(op.namespace_prefix, what="namespace_prefix")[0])
            return self._bound("a search with an empty namespace_prefix")
        if isinstance(op, ListNamespacesOp):
            check_k(op.limit, low=0, limit=10_000, what="limit")
            check_k(op.offset, low=0, limit=10_000, what="offset")
            first = None
            for condition in op.match_conditions or ():
                check_choice(condition.match_type, ("prefix", "suffix"), "a match condition's match_type")
                path = check_labels(condition.path, what=f"the {condition.match_type} path")
                if condition.match_type == "prefix" and path and path[0] != "*":
                    first = check_namespace(path, what="the prefix")[0]
            if first is not None:
                return self._served(first)
            return self._bound("list_namespaces without a user as the first label of its prefix")
        raise ValidationError(f"unknown store operation {type(op).__name__}: use GetOp, PutOp, SearchOp or "
                              "ListNamespacesOp")

    def _served(self, user_id: str) -> str:
        if self.user_id is not None and user_id != self.user_id:
            raise AuthError(f"this AtlasStore serves user {self.user_id} only, and the namespace names {user_id}: "
                            f"use a store bound to {user_id}, or one bound to nobody")
        return user_id

    def _bound(self, what: str) -> str:
        if self.user_id is None:
            raise ValidationError(f"{what} would read every user's memory: start the path with the user id, or bind "
                                  "the store to one user (AtlasStore(store, user_id=...))")
        return self.user_id

    def _checked_write(self, op: PutOp, user_id: str) -> Write:
        if op.ttl is not None:
            raise Unsupported(TTL_UNSUPPORTED)
        if op.index is not None:
            raise Unsupported(INDEX_UNSUPPORTED)
        namespace = tuple(op.namespace)
        memory = None if op.value is None else memory_of(plain_value(op.value), namespace, op.key)
        return Write(user_id, namespace, op.key, memory)

    # --- reads -------------------------------------------------------------------------------------------

    @property
    def _current_indices(self) -> str:
        return ",".join(index_name(self.store.prefix, t) for t in ITEM_TYPES)

    def _reader(self, user_id: str) -> Elasticsearch | None:
        """The user's read client, or None for a user without a key: one who never wrote has no memory."""
        try:
            return self.store.read_client(user_id)
        except NotFound:
            return None

    def _msearch(self, user_id: str, requests: list[tuple[str, dict]]) -> list[list[dict]]:
        """The hits of each (indices, body), all in one `_msearch` through the user's client."""
        client = self._reader(user_id) if requests else None
        if client is None:
            return [[] for _ in requests]
        searches = [part for indices, body in requests
                    for part in ({"index": indices, "routing": user_id, "ignore_unavailable": True}, body)]
        responses = client.msearch(searches=searches)["responses"]
        for response in responses:
            if "error" in response:
                error = response["error"]
                raise AtlasError(f"a store read failed: {(error.get('root_cause') or [error])[0].get('reason')}")
        return [response["hits"]["hits"] for response in responses]

    def _read_request(self, user_id: str, op: Op) -> tuple[str, dict]:
        code_filter = self.store.code_filter
        if isinstance(op, GetOp):
            return self._current_indices, build_get_body(user_id, tuple(op.namespace), op.key,
                                                         code_filter=code_filter)
        assert isinstance(op, SearchOp)
        return self._current_indices, build_listing_body(user_id, tuple(op.namespace_prefix),
                                                         code_filter=code_filter, size=page_size(op))

    def _versions_request(self, write: Write) -> tuple[str, dict]:
        """The look-up of what `write` acts on (`build_versions_body`): a delete's reaches into the archive."""
        put = write.memory is not None
        indices = self._current_indices if put else f"{self._current_indices},{archive_name(self.store.prefix)}"
        return indices, build_versions_body(write.user_id, write.namespace, write.key,
                                            code_filter=self.store.code_filter, current=put)

    def _answer(self, user_id: str, op: Op, page: list[dict]) -> Result:
        """A get's item, or a search's items from its first page and, when the filter leaves too few, the next."""
        if isinstance(op, GetOp):
            return to_item(page[0]["_source"]) if page else None
        assert isinstance(op, SearchOp)
        conditions, wanted, size = op.filter or {}, op.offset + op.limit, page_size(op)
        found = [hit["_source"] for hit in page if matches(hit["_source"]["value"], conditions)]
        client = self._reader(user_id)
        while client is not None and len(found) < wanted and len(page) == size:
            body = build_listing_body(user_id, tuple(op.namespace_prefix), code_filter=self.store.code_filter,
                                      size=size, after=page[-1]["sort"])
            page = client.search(index=self._current_indices, routing=user_id, ignore_unavailable=True,
                                 **body)["hits"]["hits"]
            found += [hit["_source"] for hit in page if matches(hit["_source"]["value"], conditions)]
        return [to_search_item(source, None) for source in found[op.offset:wanted]]

    def _recall(self, user_id: str, op: SearchOp, query: str) -> list[SearchItem]:
        """Recall's best MAX_K of the user's items, then the prefix, the filter, offset and limit."""
        if self._reader(user_id) is None:
            return []
        hits = recall(self.store, user_id, query, k=C.MAX_K, types=ITEM_TYPES).hits
        prefix, conditions = tuple(op.namespace_prefix), op.filter or {}
        found = [hit for hit in hits if "namespace" in hit.source
                 and split(hit.source["namespace"])[:len(prefix)] == prefix
                 and matches(hit.source["value"], conditions)]
        return [to_search_item(hit.source, hit.score) for hit in found[op.offset:op.offset + op.limit]]

    def _list(self, user_id: str, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        namespaces = [ns for ns in self._namespaces(user_id)
                      if all(matches_condition(ns, condition) for condition in op.match_conditions or ())]
        if op.max_depth is not None:
            namespaces = list({ns[:op.max_depth] for ns in namespaces})
        return sorted(namespaces)[op.offset:op.offset + op.limit]

    def _namespaces(self, user_id: str) -> list[tuple[str, ...]]:
        """Every namespace of the user holding a current item, page by page."""
        client = self._reader(user_id)
        found: list[tuple[str, ...]] = []
        after: dict | None = None
        while client is not None:
            page = client.search(index=self._current_indices, routing=user_id, ignore_unavailable=True,
                                 **build_namespaces_body(user_id, code_filter=self.store.code_filter, after=after))
            agg = page.get("aggregations", {}).get("namespaces", {})
            found += [split(bucket["key"]["namespace"]) for bucket in agg.get("buckets", [])]
            after = agg.get("after_key")
            if after is None or len(agg.get("buckets", [])) < C.LIST_PAGE_SIZE:
                break
        return found

    # --- writes ------------------------------------------------------------------------------------------

    def _write(self, writes: list[Write], versions: dict[tuple[tuple[str, ...], str], list[dict]]) -> None:
        """The deletes in one `_bulk` (then any key with more versions than one page held), then the puts of new keys
        in one `_bulk`, then the overwrites, one supersession each."""
        deletes = [w for w in writes if w.memory is None]
        self._delete([(w.user_id, hit) for w in deletes for hit in versions[(w.namespace, w.key)]])
        for write in deletes:
            page = versions[(write.namespace, write.key)]
            while len(page) == C.LIST_PAGE_SIZE:
                page = self._msearch(write.user_id, [self._versions_request(write)])[0]
                self._delete([(write.user_id, hit) for hit in page])
        puts = [(write, write.memory) for write in writes if write.memory is not None]
        now = self.store.now()
        index_documents(self.store, [build_document(write.user_id, memory.text, memory.memory_type, now,
                                                    **memory.fields)
                                     for write, memory in puts if not versions[(write.namespace, write.key)]])
        for write, memory in puts:
            if current := [hit["_id"] for hit in versions[(write.namespace, write.key)]]:
                supersede(self.store, write.user_id, current, memory.text, memory.memory_type, **memory.fields)

    def _delete(self, hits: list[tuple[str, dict]]) -> None:
        """Hard-delete (user, hit) pairs read through that user's client: the read proved the user owns them."""
        if not hits:
            return
        operations = [{"delete": {"_index": hit["_index"], "_id": hit["_id"], "routing": user}} for user, hit in hits]
        items = self.store.es.bulk(operations=operations, refresh=self.store.refresh)["items"]
        failed = [item["delete"] for item in items if item["delete"].get("status") not in (200, 404)]
        if failed:
            raise AtlasError(f"{len(failed)} of {len(items)} deletes failed (first: {failed[0].get('error')}); "
                             "the rest are gone: delete those items again")
