"""The credentials index: every user's read key and every token's hash, in the cluster, for every server.

One index per prefix, `<prefix>-credentials`, outside the names a user's DLS key may search
(`schemas.all_indices`), so only the service principal reads it. A user's key is the document
`key-<user_id>`; a token is the document named by its id and holds only the token's sha256. Two MCP
servers in front of one cluster therefore accept the same tokens, read through the same key, and
see the same revocations (docs/security.md). The requests are plain: a realtime `GET` for a key,
one `_search` per page for a listing, `_bulk` for a revocation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from elasticsearch import BadRequestError, Elasticsearch, NotFoundError

from atlas import constants as C
from atlas.core.errors import AtlasError
from atlas.core.schemas import check_prefix

KEYWORD = {"type": "keyword"}
DATE = {"type": "date"}
#: Secrets are stored, never searched: the encoded key is neither indexed nor kept in doc values.
SECRET = {"type": "keyword", "index": False, "doc_values": False}
CREDENTIALS_MAPPINGS = {"dynamic": "strict", "properties": {
    "id": KEYWORD, "kind": KEYWORD, "user_id": KEYWORD, "key_id": KEYWORD, "sha256": KEYWORD, "name": KEYWORD,
    "encoded": SECRET, "created_at": DATE, "expiration": KEYWORD, "expires_at": DATE, "revoked_at": DATE}}
#: One small shard, copied to a second node when there is one: losing it would lock every user out.
CREDENTIALS_SETTINGS = {"number_of_shards": 1, "auto_expand_replicas": "0-1"}
#: Writes of each prefix's credentials by this process: a cache of them that has seen fewer is stale.
_WRITES: Counter[str] = Counter()


def writes(prefix: str) -> int:
    """How many times this process has changed the prefix's credentials (a verifier reloads when this moves)."""
    return _WRITES[prefix]


def credentials_name(prefix: str) -> str:
    return f"{check_prefix(prefix)}-{C.CREDENTIALS_SUFFIX}"


def key_doc_id(user_id: str) -> str:
    return f"key-{user_id}"


def ensure_credentials(es: Elasticsearch, prefix: str) -> str:
    """Create the prefix's credentials index unless it exists; its name."""
    name = credentials_name(prefix)
    if not es.indices.exists(index=name):
        try:
            es.indices.create(index=name, mappings=CREDENTIALS_MAPPINGS, settings=CREDENTIALS_SETTINGS)
        except BadRequestError as exc:
            if exc.error != "resource_already_exists_exception":
                raise
            # another server created it meanwhile
    return name


def put_credential(es: Elasticsearch, prefix: str, doc_id: str, record: dict, *, create: bool = False) -> None:
    """Store one record, visible to every server's next search (`refresh=true`). With `create`, a record
    that exists already raises Elasticsearch's `ConflictError` (two servers provisioning one user at once)."""
    es.index(index=ensure_credentials(es, prefix), id=doc_id, document={"id": doc_id, **record}, refresh=True,
             op_type="create" if create else "index")
    _WRITES[prefix] += 1


def get_credential(es: Elasticsearch, prefix: str, doc_id: str) -> dict | None:
    """One record by id (a realtime read: no refresh needed), or None."""
    try:
        return es.get(index=credentials_name(prefix), id=doc_id)["_source"]
    except NotFoundError:  # no such record, or no index yet
        return None


def find_credentials(es: Elasticsearch, prefix: str, *filters: dict) -> Iterator[dict]:
    """Every record matching all `filters` (term queries), by id, one `_search` page at a time."""
    name, after = credentials_name(prefix), None
    if not es.indices.exists(index=name):
        return
    while True:
        body: dict = {"query": {"bool": {"filter": list(filters)}}, "sort": [{"id": "asc"}],
                      "size": C.LIST_PAGE_SIZE}
        if after is not None:
            body["search_after"] = after
        hits = es.search(index=name, **body)["hits"]["hits"]
        yield from (hit["_source"] for hit in hits)
        if len(hits) < C.LIST_PAGE_SIZE:
            return
        after = hits[-1]["sort"]


def update_credentials(es: Elasticsearch, prefix: str, changes: dict[str, dict]) -> None:
    """Apply partial updates {doc id: fields} in one `_bulk`, visible at once."""
    if not changes:
        return
    operations: list[dict] = []
    for doc_id, fields in changes.items():
        operations += [{"update": {"_index": credentials_name(prefix), "_id": doc_id}}, {"doc": fields}]
    response = es.bulk(operations=operations, refresh=True)
    _WRITES[prefix] += 1
    if response["errors"]:
        failed = [item["update"]["error"]["reason"] for item in response["items"] if "error" in item["update"]]
        raise AtlasError(f"the credentials index refused {len(failed)} update(s) ({failed[0]}): run the command again")


def drop_credentials(es: Elasticsearch, prefix: str) -> None:
    es.indices.delete(index=credentials_name(prefix), ignore_unavailable=True)
    _WRITES[prefix] += 1
