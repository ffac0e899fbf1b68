"""`AtlasStore`, LangGraph's `BaseStore` on Atlas.

One behaviour suite, written from LangGraph's documented store semantics, runs against LangGraph's own
`InMemoryStore` and against `AtlasStore`, so that the two are shown to agree; where Atlas legitimately differs
(the order of a search without a query, what a score means) the suite asserts what both promise. Then what only
Atlas does: the audit chain of an overwrite, tenant isolation through every op, clear errors; and LangMem's memory
tools, called directly, on both stores.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import subprocess
import sys
import textwrap

import pytest
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from langmem import create_manage_memory_tool, create_search_memory_tool

from atlas import constants as C
from atlas.core.documents import build_document, embed_documents, neighbour_hubness
from atlas.core.errors import AuthError, ValidationError
from atlas.core.schemas import index_name
from atlas.core.store import Store
from atlas.core.supersession import history
from atlas.integrations import langgraph as langgraph_module
from atlas.integrations.langgraph import (
    AtlasStore,
    InvalidNamespace,
    Unsupported,
    build_listing_body,
    item_text,
    matches,
)
from tests.conftest import requests_sent

DIMS = 256


def bag_of_words(texts: list[str]) -> list[list[float]]:
    """InMemoryStore's embedding for these tests: word counts hashed into DIMS buckets (md5, not `hash()`)."""
    vectors = []
    for text in texts:
        vector = [0.0] * DIMS
        for word in re.findall(r"[a-z]+", text.lower()):
            vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMS] += 1.0
        vectors.append(vector)
    return vectors


@pytest.fixture(params=["memory", pytest.param("atlas", marks=pytest.mark.cluster)])
def lg(request) -> BaseStore:
    """LangGraph's InMemoryStore (searching the "content" field by a bag of words), or an AtlasStore on a fresh
    prefix (the `store` fixture: tenancy on, fixed clock)."""
    if request.param == "memory":
        return InMemoryStore(index={"dims": DIMS, "embed": bag_of_words, "fields": ["content"]})
    return AtlasStore(request.getfixturevalue("store"))


#: (namespace, key, value) of the suite's items: all of user sarah, at several depths.
ITEMS = [
    (("sarah", "prefs"), "coffee", {"content": "Sarah drinks her coffee black", "rating": 5, "kind": "drink"}),
    (("sarah", "prefs"), "tea", {"content": "Sarah dislikes green tea", "rating": 1, "kind": "drink"}),
    (("sarah", "prefs", "food"), "fish", {"content": "Sarah is allergic to shellfish", "rating": 2, "kind": "food",
                                          "meta": {"source": "doctor"}}),
    (("sarah", "home"), "city", {"content": "Sarah lives in Edinburgh", "rating": 4, "kind": "place"}),
    (("sarah", "pets"), "dog", {"content": "Sarah's dog is called Biscuit", "rating": 3, "kind": "pet"}),
    (("sarah", "prefsx"), "stamps", {"content": "Sarah collects old stamps", "rating": 3, "kind": "hobby"}),
]
DOG_QUESTION = "what is my dog called"


def fill(lg: BaseStore) -> None:
    for namespace, key, value in ITEMS:
        lg.put(namespace, key, value)


def keys(items: list) -> list[str]:
    return [item.key for item in items]


# --- the shared behaviour suite --------------------------------------------------------------------------


def test_put_then_get_returns_the_item(lg):
    lg.put(("sarah", "prefs"), "coffee", ITEMS[0][2])
    item = lg.get(("sarah", "prefs"), "coffee")
    assert (item.namespace, item.key, item.value) == (("sarah", "prefs"), "coffee", ITEMS[0][2])
    assert item.created_at.tzinfo is not None and item.updated_at >= item.created_at
    assert lg.get(("sarah", "prefs"), "tea") is None
    assert lg.get(("sarah", "home"), "coffee") is None  # the key belongs to its namespace
    assert lg.get(("sarah",), "coffee") is None  # a parent namespace is another namespace


def test_overwrite_replaces_the_value(lg):
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Leeds"})
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Edinburgh"})
    assert lg.get(("sarah", "home"), "city").value == {"content": "Sarah lives in Edinburgh"}
    assert [item.value for item in lg.search(("sarah",))] == [{"content": "Sarah lives in Edinburgh"}]
    assert [item.value["content"] for item in lg.search(("sarah",), query="where does Sarah live")] == \
        ["Sarah lives in Edinburgh"]


def test_delete_removes_the_item(lg):
    fill(lg)
    lg.delete(("sarah", "home"), "city")
    assert lg.get(("sarah", "home"), "city") is None
    assert "city" not in keys(lg.search(("sarah",), limit=100))
    assert "city" not in keys(lg.search(("sarah",), query="where does Sarah live", limit=100))
    lg.delete(("sarah", "home"), "city")  # deleting what is gone is no error
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Glasgow"})
    assert lg.get(("sarah", "home"), "city").value == {"content": "Sarah lives in Glasgow"}


def test_search_without_query_takes_a_namespace_prefix_label_by_label(lg):
    fill(lg)
    assert set(keys(lg.search(("sarah",), limit=100))) == {key for _, key, _ in ITEMS}
    # ("sarah", "prefsx") does not start with ("sarah", "prefs"): prefixes compare whole labels.
    assert set(keys(lg.search(("sarah", "prefs")))) == {"coffee", "tea", "fish"}
    assert keys(lg.search(("sarah", "prefs", "food"))) == ["fish"]
    assert lg.search(("sarah", "garden")) == []
    found = lg.search(("sarah", "pets"))
    assert isinstance(found[0], SearchItem) and found[0].value == ITEMS[4][2] and found[0].score is None


@pytest.mark.parametrize(("conditions", "expected"), [
    ({"kind": "drink"}, {"coffee", "tea"}),
    ({"kind": {"$eq": "drink"}}, {"coffee", "tea"}),
    ({"kind": {"$ne": "drink"}}, {"fish", "city", "dog", "stamps"}),
    ({"rating": {"$gt": 3}}, {"coffee", "city"}),
    ({"rating": {"$gte": 3}}, {"coffee", "city", "dog", "stamps"}),
    ({"rating": {"$lt": 2}}, {"tea"}),
    ({"rating": {"$lte": 2}}, {"tea", "fish"}),
    ({"rating": {"$gt": 1, "$lt": 5}}, {"fish", "city", "dog", "stamps"}),
    ({"kind": "drink", "rating": {"$gte": 3}}, {"coffee"}),
    ({"meta": {"source": "doctor"}}, {"fish"}),
    ({"kind": "garden"}, set()),
], ids=lambda x: json.dumps(x) if isinstance(x, dict) else None)
def test_search_filters_on_the_value(lg, conditions, expected):
    fill(lg)
    assert set(keys(lg.search(("sarah",), filter=conditions, limit=100))) == expected
    assert set(keys(lg.search(("sarah",), query=DOG_QUESTION, filter=conditions, limit=100))) == expected


def test_limit_and_offset_page_through_a_search(lg):
    """The order of a search without a query is the store's own (LangGraph leaves it open: InMemoryStore's is
    insertion order, Atlas's newest first): pages must be disjoint and cover everything."""
    fill(lg)
    pages = [keys(lg.search(("sarah",), limit=2, offset=offset)) for offset in (0, 2, 4, 6)]
    assert [len(page) for page in pages] == [2, 2, 2, 0]
    assert sorted(sum(pages, [])) == sorted(key for _, key, _ in ITEMS)
    drinks = [keys(lg.search(("sarah",), filter={"kind": "drink"}, limit=1, offset=offset)) for offset in (0, 1, 2)]
    assert sorted(sum(drinks, [])) == ["coffee", "tea"] and drinks[2] == []


def test_search_with_a_query_ranks_the_best_match_first(lg):
    """Scores mean different things (InMemoryStore: a cosine; Atlas: the fused RRF score), so only the ranking
    and the kind of score are compared."""
    fill(lg)
    found = lg.search(("sarah",), query=DOG_QUESTION, limit=3)
    assert len(found) == 3 and found[0].key == "dog" and found[0].value == ITEMS[4][2]
    assert all(isinstance(item.score, float) for item in found)
    assert set(keys(lg.search(("sarah", "prefs"), query=DOG_QUESTION))) == {"coffee", "tea", "fish"}
    whole = keys(lg.search(("sarah",), query=DOG_QUESTION, limit=6))
    assert sorted(whole) == sorted(key for _, key, _ in ITEMS)  # a few items: every one is ranked
    pages = [keys(lg.search(("sarah",), query=DOG_QUESTION, limit=2, offset=offset)) for offset in (0, 2, 4)]
    assert sum(pages, []) == whole


def test_list_namespaces_with_prefix_suffix_wildcards_and_depth(lg):
    """The example of `BaseStore.list_namespaces`, under the user's label."""
    for namespace in (("sarah", "b", "c"), ("sarah", "b", "d", "e"), ("sarah", "b", "d", "i"), ("sarah", "b", "f"),
                      ("sarah", "c", "f")):
        lg.put(namespace, "k", {"content": "/".join(namespace)})
    assert lg.list_namespaces(prefix=("sarah", "b"), max_depth=3) == [
        ("sarah", "b", "c"), ("sarah", "b", "d"), ("sarah", "b", "f")]
    assert lg.list_namespaces(prefix=("sarah",), suffix=("f",)) == [("sarah", "b", "f"), ("sarah", "c", "f")]
    assert lg.list_namespaces(prefix=("sarah", "*", "f")) == [("sarah", "b", "f"), ("sarah", "c", "f")]
    assert lg.list_namespaces(prefix=("sarah",), suffix=("d", "*")) == [("sarah", "b", "d", "e"),
                                                                       ("sarah", "b", "d", "i")]
    assert lg.list_namespaces(prefix=("sarah",), max_depth=2) == [("sarah", "b"), ("sarah", "c")]
    every = lg.list_namespaces(prefix=("sarah",))
    assert len(every) == 5 and every == sorted(every)
    assert lg.list_namespaces(prefix=("sarah",), limit=2, offset=1) == every[1:3]
    assert lg.list_namespaces(prefix=("sarah", "x")) == []


def test_a_batch_reads_first_writes_after_and_the_last_put_wins(lg):
    """The listing comes first: InMemoryStore lists a namespace once anything, a get included, touched it."""
    namespace = ("sarah", "home")
    results = lg.batch([
        ListNamespacesOp((MatchCondition("prefix", ("sarah",)),)),
        PutOp(namespace, "city", {"content": "Sarah lives in Leeds"}),
        GetOp(namespace, "city"),
        SearchOp(("sarah",)),
        PutOp(namespace, "city", {"content": "Sarah lives in Edinburgh"}),
        PutOp(namespace, "gone", {"content": "written and deleted in one batch"}),
        PutOp(namespace, "gone", None),
    ])
    assert results == [[], None, None, [], None, None, None]
    results = lg.batch([GetOp(namespace, "city"), GetOp(namespace, "gone"), SearchOp(("sarah",), query="Leeds"),
                        ListNamespacesOp((MatchCondition("prefix", ("sarah",)),))])
    assert results[0].value == {"content": "Sarah lives in Edinburgh"} and results[1] is None
    assert keys(results[2]) == ["city"] and results[3] == [namespace]


def test_async_methods_agree_with_the_sync_ones(lg):
    async def scenario() -> tuple:
        await lg.aput(("sarah", "pets"), "dog", ITEMS[4][2])
        got = await lg.aget(("sarah", "pets"), "dog")
        found = await lg.asearch(("sarah",), query=DOG_QUESTION)
        spaces = await lg.alist_namespaces(prefix=("sarah",))
        await lg.adelete(("sarah", "pets"), "dog")
        return got, found, spaces, await lg.aget(("sarah", "pets"), "dog")

    got, found, spaces, after = asyncio.run(scenario())
    assert got.value == ITEMS[4][2] and keys(found) == ["dog"] and spaces == [("sarah", "pets")] and after is None


def test_langmem_tools_store_update_find_and_delete_a_memory(lg):
    """LangMem's own tools, invoked directly with the store passed in (no graph, no model)."""
    manage = create_manage_memory_tool(namespace=("sarah", "memories"), store=lg)
    search = create_search_memory_tool(namespace=("sarah", "memories"), store=lg)
    said = manage.invoke({"content": "Sarah's dog is called Biscuit", "action": "create"})
    memory_id = said.removeprefix("created memory ")
    manage.invoke({"content": "Sarah lives in Edinburgh", "action": "create"})
    found = json.loads(search.invoke({"query": DOG_QUESTION}))
    assert found[0]["key"] == memory_id and found[0]["namespace"] == ["sarah", "memories"]
    assert found[0]["value"] == {"content": "Sarah's dog is called Biscuit"} and len(found) == 2
    manage.invoke({"content": "Sarah's dog is called Pepper", "action": "update", "id": memory_id})
    assert lg.get(("sarah", "memories"), memory_id).value == {"content": "Sarah's dog is called Pepper"}
    assert json.loads(search.invoke({"query": DOG_QUESTION}))[0]["value"]["content"].endswith("Pepper")
    manage.invoke({"action": "delete", "id": memory_id})
    assert [m["value"]["content"] for m in json.loads(search.invoke({"query": DOG_QUESTION}))] == \
        ["Sarah lives in Edinburgh"]


# --- what only Atlas does --------------------------------------------------------------------------------


def versions(store: Store, key: str) -> list[dict]:
    """Every stored version of a key, read with the service credential (the archive too)."""
    store.es.indices.refresh(index=store.indices)
    hits = store.es.search(index=store.indices, query={"term": {"key": key}}, size=100)["hits"]["hits"]
    return [{"id": hit["_id"], "index": hit["_index"], **hit["_source"]} for hit in hits]


def test_an_overwrite_supersedes_and_keeps_the_audit_chain(store):
    lg = AtlasStore(store)
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Leeds", "fact_type": "location"})
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Edinburgh", "fact_type": "location"})
    stored = versions(store, "city")
    current = [v for v in stored if not v.get("superseded_by")]
    assert len(stored) == 2 and len(current) == 1
    chain = history(store, "sarah", current[0]["id"])
    assert [entry["text"] for entry in chain] == ["Sarah lives in Leeds", "Sarah lives in Edinburgh"]
    assert chain[0]["superseded_by"] == chain[1]["id"] and chain[1]["supersedes"] == [chain[0]["id"]]
    assert {entry["fact_type"] for entry in chain} == {"location"}
    assert {entry["namespace"] for entry in chain} == {"sarah.home"}
    lg.delete(("sarah", "home"), "city")
    assert versions(store, "city") == []  # a delete takes the whole chain, so no older value comes back
    assert lg.get(("sarah", "home"), "city") is None
    # A namespace is listed while it holds an item (InMemoryStore keeps listing it after its last delete).
    assert lg.list_namespaces(prefix=("sarah",)) == []


def test_a_batch_of_puts_is_one_bulk_and_its_overwrite_a_supersession(store, monkeypatch):
    """Issue 38: a batch's new keys go in one `_bulk`, their hubness read in one `_msearch`; an overwrite supersedes
    as a single put does. Each new item's hubness is the one a put alone would give it."""
    lg = AtlasStore(store)
    lg.put(("sarah", "home"), "city", {"content": "Sarah lives in Leeds"})
    lg.put(("sarah", "home"), "street", {"content": "Sarah's street is lined with lime trees"})
    new = {"dog": "Sarah's dog is called Biscuit", "coffee": "Sarah drinks her coffee black",
           "bike": "Sarah cycles to work on a red bike"}
    before = [build_document("sarah", text, "semantic", store.now()) for text in new.values()]
    embed_documents(store, before)
    expected = dict(zip(new, neighbour_hubness(store, before), strict=True))
    assert None not in expected.values()
    requests = requests_sent(monkeypatch)
    lg.batch([PutOp(("sarah", "home"), key, {"content": text}) for key, text in new.items()]
             + [PutOp(("sarah", "home"), "city", {"content": "Sarah lives in Edinburgh"})])
    monkeypatch.undo()
    sent = [path.split("?")[0].rsplit("/", 1)[-1] for _, path in requests]
    assert sent.count("_bulk") == 1 and sent.count("_doc") == 1, f"the new keys, the overwrite's new version: {sent}"
    assert [lg.get(("sarah", "home"), key).value["content"] for key in new] == list(new.values())
    assert [v["text"] for v in versions(store, "city") if not v.get("superseded_by")] == ["Sarah lives in Edinburgh"]
    assert {key: versions(store, key)[0]["hubness"] for key in new} == expected, \
        "among Sarah's memories before the batch, as a put alone gives it (not among the batch, as a load does)"


def test_reads_and_deletes_go_on_past_a_full_page(store, monkeypatch):
    """With pages of two rows: a filtered search, a plain one, the namespaces and the delete of a chain of four."""
    monkeypatch.setattr(C, "LIST_PAGE_SIZE", 2)
    lg = AtlasStore(store)
    fill(lg)
    assert set(keys(lg.search(("sarah",), filter={"rating": {"$gte": 3}}))) == {"coffee", "city", "dog", "stamps"}
    assert len(lg.search(("sarah",), limit=5)) == 5
    assert len(lg.list_namespaces(prefix=("sarah",))) == 5
    for town in ("Leeds", "York", "Edinburgh"):
        lg.put(("sarah", "home"), "city", {"content": f"Sarah lives in {town}"})
    assert len(versions(store, "city")) == 4
    lg.delete(("sarah", "home"), "city")
    assert versions(store, "city") == []


def test_a_procedural_value_becomes_a_playbook(store):
    lg = AtlasStore(store)
    value = {"memory_type": "procedural", "content": "Reset the Lumio hub when it shows E-0x41", "name": "hub reset",
             "steps": ["unplug the hub", "wait ten seconds", "plug it in"]}
    lg.put(("sarah", "playbooks"), "hub", value)
    [stored] = versions(store, "hub")
    assert stored["index"] == index_name(store.prefix, "procedural") and stored["steps"] == value["steps"]
    assert lg.get(("sarah", "playbooks"), "hub").value == value
    with pytest.raises(ValidationError, match="steps"):
        lg.put(("sarah", "playbooks"), "bad", {"memory_type": "procedural", "content": "no steps"})


def test_the_module_example_runs(store):
    """The example at the top of `atlas.integrations.langgraph`, on the test's prefix instead of "agents"."""
    example = textwrap.dedent(langgraph_module.__doc__.split("\n\nHow ")[0].split("\n\n", 1)[1])
    assert 'open_store("agents")' in example
    scope: dict = {"test_store": store}
    exec(example.replace('open_store("agents")', "test_store"), scope)
    assert [item.value for item in scope["store"].search(("sarah",), query="where does Sarah live?")] == \
        [{"content": "Sarah lives in Edinburgh"}]


def test_the_text_searched_is_the_content_or_the_value_as_json():
    assert item_text({"content": "Sarah lives in Edinburgh", "text": "other"}) == "Sarah lives in Edinburgh"
    assert item_text({"text": "a note", "n": 1}) == "a note"
    assert item_text({"n": 1, "city": "Edinburgh"}) == '{"city": "Edinburgh", "n": 1}'
    assert matches({"n": 2, "s": "b"}, {"n": {"$gt": 1}, "s": {"$lt": "c"}})
    assert not matches({"n": "2"}, {"n": {"$gt": 1}})  # a string is not compared with a number
    assert not matches({}, {"n": {"$gt": 1}})


@pytest.fixture
def neighbours(store) -> AtlasStore:
    """sarah and bob, each with the same namespaces and keys and a dog of their own."""
    lg = AtlasStore(store)
    for user, dog in (("sarah", "Biscuit"), ("bob", "Rex")):
        lg.put((user, "memories"), "dog", {"content": f"{user.title()}'s dog is called {dog}", "kind": "pet"})
        lg.put((user, "memories", "home"), "city", {"content": f"{user.title()} lives in Edinburgh", "kind": "place"})
    return lg


def foreign(items: list, *, user: str = "sarah") -> list:
    """What a read of `user` returned that is not theirs: a namespace or a value of someone else."""
    return [item for item in items if item.namespace[0] != user or "Rex" in json.dumps(item.value)
            or "Bob" in json.dumps(item.value)]


@pytest.mark.parametrize("code_filter", [True, False], ids=["dls+filter", "dls-only"])
def test_two_users_never_see_each_other_through_any_op(store, neighbours, code_filter):
    store.code_filter = code_filter
    lg = neighbours
    read: list = [lg.get(("sarah", "memories"), "dog"), lg.get(("sarah", "memories", "home"), "city")]
    read += lg.search(("sarah",), limit=100)
    read += lg.search(("sarah",), query="what is the dog called, and Rex, and Bob", limit=100)
    read += lg.search(("sarah", "memories"), query="Edinburgh", filter={"kind": "place"})
    for result in lg.batch([GetOp(("sarah", "memories"), "dog"), SearchOp(("sarah",), limit=100),
                            SearchOp(("sarah",), query="Rex the dog", limit=100)]):
        read += result if isinstance(result, list) else [result]
    assert len(read) == 12 and foreign(read) == []
    assert {item.value["content"] for item in read} == {"Sarah's dog is called Biscuit", "Sarah lives in Edinburgh"}
    assert lg.list_namespaces(prefix=("sarah",)) == [("sarah", "memories"), ("sarah", "memories", "home")]
    assert lg.list_namespaces(prefix=("bob",), suffix=("home",)) == [("bob", "memories", "home")]
    lg.delete(("bob", "memories"), "dog")  # the same namespace and key under another user is another item
    assert lg.get(("sarah", "memories"), "dog").value["content"] == "Sarah's dog is called Biscuit"
    assert lg.get(("bob", "memories"), "dog") is None


def test_the_dls_key_alone_keeps_a_namespace_from_another_user(store, neighbours):
    """The store's listing request for bob's namespace, without the code filter: sent through bob's key it finds
    his items, through sarah's it finds nothing."""
    body = build_listing_body("bob", ("bob",), code_filter=False, size=100)
    indices = ",".join(index_name(store.prefix, t) for t in ("semantic", "procedural"))
    hits = {user: store.read_client(user).search(index=indices, **body)["hits"]["hits"] for user in ("bob", "sarah")}
    assert len(hits["bob"]) == 2 and hits["sarah"] == []


def test_a_store_bound_to_one_user_serves_only_that_user(store, neighbours):
    sarah = AtlasStore(store, user_id="sarah")
    assert sarah.list_namespaces() == [("sarah", "memories"), ("sarah", "memories", "home")]
    assert sarah.list_namespaces(suffix=("home",)) == [("sarah", "memories", "home")]
    assert foreign(sarah.search((), limit=100)) == [] and len(sarah.search((), limit=100)) == 2
    for call in (lambda: sarah.get(("bob", "memories"), "dog"), lambda: sarah.search(("bob",)),
                 lambda: sarah.put(("bob", "memories"), "dog", {"content": "planted"}),
                 lambda: sarah.list_namespaces(prefix=("bob",))):
        with pytest.raises(AuthError, match="serves user sarah only"):
            call()
    assert neighbours.get(("bob", "memories"), "dog").value["content"] == "Bob's dog is called Rex"


def test_a_user_who_never_wrote_has_nothing(store):
    lg = AtlasStore(store)
    assert lg.get(("carol", "memories"), "dog") is None
    assert lg.search(("carol",)) == [] and lg.search(("carol",), query="dog") == []
    assert lg.list_namespaces(prefix=("carol",)) == []


def test_bad_namespaces_and_unsupported_features_are_clear_errors(store):
    lg = AtlasStore(store)
    with pytest.raises(InvalidNamespace, match="must be the Atlas user id") as caught:
        lg.put(("Sarah Smith", "memories"), "k", {"content": "x"})
    assert isinstance(caught.value, InvalidNamespaceError) and isinstance(caught.value, ValidationError)
    with pytest.raises(InvalidNamespace, match="without '.'"):
        lg.batch([GetOp(("sarah", "a.b"), "k")])
    with pytest.raises(InvalidNamespace, match="empty"):
        lg.batch([GetOp((), "k")])
    for call in (lambda: lg.search(()), lambda: lg.list_namespaces(), lambda: lg.list_namespaces(prefix=("*",))):
        with pytest.raises(ValidationError, match="would read every user's memory"):
            call()
    with pytest.raises(ValidationError, match="filter operator"):
        lg.search(("sarah",), filter={"rating": {"$in": [1, 2]}})
    with pytest.raises(ValidationError, match="JSON"):
        lg.put(("sarah", "m"), "k", {"when": object()})
    with pytest.raises(Unsupported, match="no TTL"):
        lg.batch([PutOp(("sarah", "m"), "k", {"content": "x"}, ttl=5.0)])
    with pytest.raises(NotImplementedError):
        lg.put(("sarah", "m"), "k", {"content": "x"}, ttl=5.0)
    with pytest.raises(Unsupported, match="no index configuration"):
        lg.put(("sarah", "m"), "k", {"content": "x"}, index=["content"])
    with pytest.raises(Unsupported, match="no index configuration"):
        AtlasStore(store, index={"dims": 8, "embed": bag_of_words})
    # A batch with a bad op writes nothing, not even the good ops before it.
    with pytest.raises(InvalidNamespace):
        lg.batch([PutOp(("sarah", "m"), "good", {"content": "x"}), PutOp(("Bad",), "k", {"content": "y"})])
    assert lg.get(("sarah", "m"), "good") is None


def test_the_core_never_imports_the_extra():
    """`import atlas` (and `atlas.integrations`) loads no LangGraph: the extra is needed only by its module."""
    code = ("import sys, atlas, atlas.integrations, atlas.stack, atlas.serve.tools; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langmem', 'langchain_core')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
