"""A memory inspector for notebooks: one user's episodic, semantic and procedural memory, side by side.

Live (a kernel whose frontend answers: JupyterLab, Notebook, VS Code): an ipywidgets user
picker, one tab per memory type with its counters, supersession chains on the semantic tab,
and a refresh button; call `refresh()` after writes or a consolidation, and the counters
show what changed since the read before. Headless (papermill, nbconvert, nbval, a terminal)
it renders the same data as a static HTML snapshot (and as aligned text), so an executed
notebook shows what the widget would have shown. Reads go through the user's own client, so
the inspector sees exactly what that user may see.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastic_transport import ObjectApiResponse
from IPython import get_ipython

from atlas import constants as C
from atlas.core.documents import VECTOR_FIELDS
from atlas.core.memory import users_with_memory
from atlas.core.schemas import archive_name, index_name
from atlas.core.store import Store
from atlas.core.validation import check_user
from atlas.notebook.display import short_id
from atlas.reporting import Table, table, truncate

TYPES: tuple[C.MemoryType, ...] = C.USER_MEMORY_TYPES
#: Rows shown per tab (newest first); the counters always count everything.
DEFAULT_LIMIT = 50
#: Most retired-or-retiring facts read to draw supersession chains.
MAX_CHAIN_DOCUMENTS = 1000


def interactive_frontend() -> bool:
    """A live frontend: the kernel request running now lets the kernel ask its user for input.

    JupyterLab, Notebook and VS Code send every cell with `allow_stdin`; the headless executors (papermill,
    nbconvert and nbclient, nbval) never do, and outside a kernel there is no frontend at all.
    """
    kernel = getattr(get_ipython(), "kernel", None)
    return kernel is not None and bool(kernel.get_parent().get("content", {}).get("allow_stdin"))


@dataclass
class Snapshot:
    """What the inspector shows for one user at one moment."""

    user_id: str
    counts: dict[str, dict[str, int]]
    tables: dict[str, Table]
    #: Supersession chains: per current fact that retired others, its generations, oldest first.
    chains: list[list[list[dict]]] = field(default_factory=list)
    #: {id: label} for ids a notebook knows by name; others are shortened.
    labels: Mapping[str, str] | None = None
    #: The documents behind `tables`, per memory type.
    documents: dict[str, list[dict]] = field(default_factory=dict)

    def chain_lines(self) -> list[str]:
        """ "old fact [id] + other old fact [id] → new fact [id, natural]" per chain."""
        def one(doc: dict) -> str:
            kind = f", {doc['contradiction']}" if doc.get("contradiction") else ""
            return f"{truncate(doc['text'], 40)} [{short_id(doc['id'], self.labels)}{kind}]"

        return [" → ".join(" + ".join(one(d) for d in generation) for generation in chain) for chain in self.chains]

    def counters(self) -> Table:
        return table([{"type": t, **c} for t, c in self.counts.items()], title=f"memory of {self.user_id}",
                     numeric={"total", "current", "superseded"})

    def changes_since(self, before: Snapshot) -> Table:
        """Per memory type, the current and superseded counts before and now, and what is new since `before`."""
        def new(memory_type: str) -> str:
            seen = {d["id"] for d in before.documents.get(memory_type, [])}
            return "; ".join(truncate(d.get("name") or d["text"], 40)
                             for d in self.documents.get(memory_type, []) if d["id"] not in seen)

        rows = [{"type": t, "current": f"{before.counts[t]['current']} → {c['current']}",
                 "superseded": f"{before.counts[t]['superseded']} → {c['superseded']}", "new": new(t)}
                for t, c in self.counts.items()]
        return table(rows, title=f"changes since the previous read of {self.user_id}")

    def __str__(self) -> str:
        parts = [str(self.counters())]
        for memory_type, rows in self.tables.items():
            parts += ["", str(rows)]
            if memory_type == "semantic" and self.chains:
                parts += ["supersession chains:", *("  " + line for line in self.chain_lines())]
        return "\n".join(parts)

    def tab_html(self, memory_type: str) -> str:
        body = self.tables[memory_type]._repr_html_()
        if memory_type == "semantic" and self.chains:
            items = "".join(f"<li>{html.escape(line)}</li>" for line in self.chain_lines())
            body += f"<p><b>supersession chains</b></p><ul>{items}</ul>"
        return body

    def header_html(self, changes: Table | None = None) -> str:
        """The counters, and `changes` (since an earlier read) when given."""
        return self.counters()._repr_html_() + (changes._repr_html_() if changes is not None else "")

    def to_html(self, changes: Table | None = None) -> str:
        """The static snapshot: the header, then one section per memory type."""
        sections = "".join(f"<h4>{t} ({self.counts[t]['current']} current)</h4>{self.tab_html(t)}"
                           for t in self.tables)
        return f"<div class='atlas-inspector'>{self.header_html(changes)}{sections}</div>"


def _search(store: Store, user_id: str, indices: Sequence[str], query: dict, size: int, *,
            sort: list[dict] | None = None, track_total_hits: bool | None = None,
            aggs: dict | None = None) -> ObjectApiResponse[Any]:
    """A search through the user's own client; an option left at None is not sent."""
    return store.read_client(user_id).search(index=",".join(indices), routing=user_id, query=query, size=size,
                                             ignore_unavailable=True,
                                             source_excludes=list(VECTOR_FIELDS), sort=sort,
                                             track_total_hits=track_total_hits, aggs=aggs)


def _newest_first(docs: list[dict]) -> list[dict]:
    """Newest first, ties (a fixed clock) by text: the same order on every run."""
    docs = sorted(docs, key=lambda d: d.get("text", ""))
    return sorted(docs, key=lambda d: d.get("timestamp") or d.get("created_at") or "", reverse=True)


def _documents(store: Store, user_id: str, memory_type: C.MemoryType, limit: int) -> tuple[list[dict], dict[str, int]]:
    """The newest documents of one type and the type's counters (total, current, superseded)."""
    resp = _search(store, user_id, [index_name(store.prefix, memory_type)],
                   {"bool": {"filter": [{"term": {"user_id": user_id}}]}}, limit,
                   sort=[{"created_at": "desc"}], track_total_hits=True,
                   aggs={"superseded": {"filter": {"exists": {"field": "superseded_by"}}}})
    total = resp["hits"]["total"]["value"]
    superseded = resp.get("aggregations", {}).get("superseded", {}).get("doc_count", 0)
    docs = _newest_first([{"id": h["_id"], **h["_source"]} for h in resp["hits"]["hits"]])
    return docs, {"total": total, "current": total - superseded, "superseded": superseded}


def _chain_documents(store: Store, user_id: str) -> list[dict]:
    """Every fact of the user that retired or was retired by another, archive included."""
    query = {"bool": {"filter": [{"term": {"user_id": user_id}}, {"term": {"memory_type": "semantic"}}],
                      "should": [{"exists": {"field": "supersedes"}}, {"exists": {"field": "superseded_by"}}],
                      "minimum_should_match": 1}}
    resp = _search(store, user_id, [index_name(store.prefix, "semantic"), archive_name(store.prefix)], query,
                   MAX_CHAIN_DOCUMENTS)
    return [{"id": h["_id"], **h["_source"]} for h in resp["hits"]["hits"]]


def _chains(docs: Sequence[dict]) -> list[list[list[dict]]]:
    """Supersession chains among `docs`: per current head, its generations from the oldest to the head.

    A generation holds every fact one step retired ("lives in Bristol" + "commutes to Temple Meads" -> "lives
    in Edinburgh").
    """
    by_id = {d["id"]: d for d in docs}
    chains = []
    for head in (d for d in docs if d.get("supersedes") and not d.get("superseded_by")):
        generations, seen, current = [[head]], {head["id"]}, [head]
        while current:
            older = [by_id[i] for d in current for i in d.get("supersedes") or [] if i in by_id and i not in seen]
            seen |= {d["id"] for d in older}
            if older:
                generations.insert(0, sorted(older, key=lambda d: d.get("text", "")))
            current = older
        chains.append(generations)
    return sorted(chains, key=lambda c: (c[-1][0].get("created_at", ""), c[-1][0].get("text", "")))


def _status(doc: dict, labels: Mapping[str, str] | None) -> str:
    return f"superseded by {short_id(doc['superseded_by'], labels)}" if doc.get("superseded_by") else "current"


def _rows(memory_type: str, docs: Sequence[dict], labels: Mapping[str, str] | None) -> Table:
    if memory_type == "episodic":
        rows = [{"id": short_id(d["id"], labels), "when": str(d.get("timestamp", ""))[:10],
                 "session": d.get("session_id"), "text": truncate(d["text"])} for d in docs]
        return table(rows, title="episodic: the user's own words, newest first")
    if memory_type == "semantic":
        rows = [{"id": short_id(d["id"], labels), "text": truncate(d["text"]), "type": d.get("fact_type"),
                 "confidence": d.get("confidence"), "uses": d.get("use_count"),
                 "episodes": len(d.get("supporting_episode_ids") or []), "status": _status(d, labels)} for d in docs]
        return table(rows, title="semantic: facts, newest first", numeric={"confidence", "uses", "episodes"})
    rows = [{"id": short_id(d["id"], labels), "name": truncate(d.get("name") or d["text"], 40),
             "steps": len(d.get("refined_steps") or d.get("steps") or []), "worked": d.get("success_count"),
             "failed": d.get("failure_count"), "rate": d.get("success_rate"),
             "refined": bool(d.get("refined_steps"))} for d in docs]
    return table(rows, title="procedural: playbooks, newest first", numeric={"steps", "worked", "failed", "rate"})


def snapshot(store: Store, user_id: str, *, limit: int = DEFAULT_LIMIT,
             labels: Mapping[str, str] | None = None) -> Snapshot:
    check_user(user_id)
    counts: dict[str, dict[str, int]] = {}
    tables: dict[str, Table] = {}
    documents: dict[str, list[dict]] = {}
    chains: list[list[list[dict]]] = []
    for memory_type in TYPES:
        documents[memory_type], counts[memory_type] = _documents(store, user_id, memory_type, limit)
        tables[memory_type] = _rows(memory_type, documents[memory_type], labels)
        if memory_type == "semantic":
            chains = _chains(_chain_documents(store, user_id))
    return Snapshot(user_id, counts, tables, chains, labels, documents)


class MemoryInspector:
    """`MemoryInspector(store)` in a notebook cell; `refresh()` after writes; `interactive=False` forces HTML.

    Without `users`, the picker offers every user with memory in the prefix, read again by each `refresh()`.
    """

    def __init__(self, store: Store, user: str | None = None, *, users: Sequence[str] | None = None,
                 limit: int = DEFAULT_LIMIT, labels: Mapping[str, str] | None = None,
                 interactive: bool | None = None) -> None:
        self.store, self.limit, self.labels = store, limit, labels
        self.fixed_users = list(users) if users is not None else None
        self.users = self._read_users()
        self.user = check_user(user) if user is not None else (self.users[0] if self.users else None)
        self.interactive = interactive_frontend() if interactive is None else interactive
        self.current: Snapshot | None = None
        #: The read before `current`, of the same user: what `changes()` compares with.
        self.previous: Snapshot | None = None
        self.widget = self._build_widget() if self.interactive else None
        self.refresh()

    def _read_users(self) -> list[str]:
        return list(self.fixed_users) if self.fixed_users is not None else users_with_memory(self.store, types=TYPES)

    def refresh(self) -> None:
        """Re-read the user list and the selected user's memory; the widget updates in place."""
        self.users = self._read_users()
        if self.user is not None and self.user not in self.users:
            self.users.append(self.user)
        if self.user is None:
            self.current = self.previous = None
        else:
            same_user = self.current is not None and self.current.user_id == self.user
            self.previous = self.current if same_user else None
            self.current = snapshot(self.store, self.user, limit=self.limit, labels=self.labels)
        if self.widget is not None:
            self._update_widget()

    def select(self, user: str) -> None:
        """Show `user`, whether or not the picker offered them yet."""
        self.user = check_user(user)
        self.refresh()

    def changes(self) -> Table | None:
        """What the last `refresh()` found changed since the read before it (None after a first read)."""
        if self.current is None or self.previous is None:
            return None
        return self.current.changes_since(self.previous)

    # rendering -----------------------------------------------------------------------------

    def to_html(self) -> str:
        if self.current is None:
            return "<p>no memory in this prefix yet</p>"
        return self.current.to_html(self.changes())

    def __str__(self) -> str:
        if self.current is None:
            return "no memory in this prefix yet"
        changes = self.changes()
        return str(self.current) + (f"\n\n{changes}" if changes is not None else "")

    __repr__ = __str__

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        """The widget where it is live, with the static snapshot beside it for frontends that draw no widgets."""
        static = {"text/plain": str(self), "text/html": self.to_html()}
        if self.widget is not None:
            return {**static, **self.widget._repr_mimebundle_(**kwargs)}
        return static

    # the widget ---------------------------------------------------------------------------

    def _build_widget(self):  # noqa: ANN202 (ipywidgets is imported lazily)
        import ipywidgets as widgets

        self._picker = widgets.Dropdown(options=self.users, value=self.user, description="user")
        self._button = widgets.Button(description="Refresh", icon="refresh")
        self._header = widgets.HTML()
        self._tabs = widgets.Tab(children=[widgets.HTML() for _ in TYPES])
        self._picker.observe(self._picked, names="value")
        self._button.on_click(lambda _: self.refresh())
        return widgets.VBox([widgets.HBox([self._picker, self._button]), self._header, self._tabs],
                            _dom_classes=["atlas-inspector"])

    def _picked(self, change: dict) -> None:
        if change["new"] is not None and change["new"] != self.user:
            self.select(change["new"])

    def _update_widget(self) -> None:
        # New options reset a Dropdown to its first one: set both without telling `_picked`.
        self._picker.unobserve(self._picked, names="value")
        self._picker.options, self._picker.value = self.users, self.user
        self._picker.observe(self._picked, names="value")
        snap = self.current
        if snap is None:
            self._header.value = self.to_html()
            return
        self._header.value = snap.header_html(self.changes())
        for at, memory_type in enumerate(TYPES):
            self._tabs.children[at].value = snap.tab_html(memory_type)
            self._tabs.set_title(at, f"{memory_type} ({snap.counts[memory_type]['current']})")


def user_shards(store: Store, user_id: str) -> list[dict]:
    """Where a user's memories live: per index of the prefix, the shard that `routing=user_id` picks and
    every copy of it (primary or replica, its node and state), from `_search_shards`."""
    found = store.es.search_shards(index=store.indices, routing=check_user(user_id))
    names = {node_id: node["name"] for node_id, node in found["nodes"].items()}
    return [{"index": copy["index"], "shard": copy["shard"], "primary": copy["primary"],
             "node": names.get(copy["node"]), "state": copy["state"]}
            for group in found["shards"] for copy in group]


def shards_searched(store: Store, user_id: str, requests: Sequence[dict]) -> list[dict]:
    """Send a recall's `_msearch` again (its printable `RecallResult.requests`) and say, per search, how many
    shards it asked (`_shards.total`): one per index when routed by the user, every shard otherwise."""
    searches = [part for request in requests for part in (request["header"], request["body"])]
    responses = store.read_client(check_user(user_id)).msearch(searches=searches)["responses"]
    return [{"path": request["path"], "routing": request["header"].get("routing", ""),
             "indices": len(request["header"]["index"].split(",")), "shards asked": response["_shards"]["total"],
             "answered": response["_shards"]["successful"]}
            for request, response in zip(requests, responses, strict=True)]
