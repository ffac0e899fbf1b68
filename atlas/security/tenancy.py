"""Tenant isolation: per-user read keys with document-level security, and the checks that prove it.

Every read of a user's memory can go through an API key whose only privilege is `read`
on the prefix's indices, restricted by a DLS query to the documents the user alone owns and
the shared catalog (the catalog index's documents without `user_id`). Writes keep the service
credential (a DLS key may not use the update API); `documents.prove_ownership` first proves
ownership with a read through the user's key. The same clause in every recall query
(`recall.build_filters`) is the second guard, and `warn_if_unrestricted` says loudly when it
is the only one. Keys are stored in the cluster (`atlas.security.credentials`), so every server in front of it
reads through the same key. See docs/security.md.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Protocol

from elasticsearch import AuthenticationException, AuthorizationException, Elasticsearch, NotFoundError
from elasticsearch import ConflictError as StoredMeanwhile

from atlas import constants as C
from atlas.config import Settings, load_settings
from atlas.core.clock import es_date, parse_date, utcnow
from atlas.core.errors import AuthError, NotFound, ValidationError
from atlas.core.schemas import all_indices, build_owner_filter, check_prefix
from atlas.core.store import Store
from atlas.core.validation import USER_ID_PATTERN, check_user
from atlas.security.connection import AtlasClient, connect
from atlas.security.credentials import (
    drop_credentials,
    find_credentials,
    get_credential,
    key_doc_id,
    put_credential,
    writes,
)

#: What `create_api_key` accepts that an operator would type: 30d, 12h, 90m, 45s.
EXPIRATION_PATTERN = re.compile(r"^[1-9][0-9]{0,5}[dhms]$")


class UnrestrictedReadWarning(UserWarning):
    """A credential that reads memory has no document-level security: the code filter alone keeps users apart."""


class Scope(Protocol):
    """What key management needs of a store: a `Store`, or a `KeyScope` (the CLI loads no models). Read only."""

    @property
    def es(self) -> Elasticsearch: ...

    @property
    def prefix(self) -> str: ...

    @property
    def settings(self) -> Settings: ...


@dataclass(frozen=True)
class KeyScope:
    es: Elasticsearch
    prefix: str
    settings: Settings


def key_scope(prefix: str | None = None, *, settings: Settings | None = None) -> KeyScope:
    """The service client and a checked prefix, for commands that manage keys without a full store."""
    settings = settings or load_settings()
    return KeyScope(connect(settings), check_prefix(prefix or settings.index_prefix), settings)


# --- request bodies ----------------------------------------------------------------------


def build_dls_query(prefix: str, user_id: str) -> dict:
    """The user's own documents or the catalog's ownerless ones: the twin of the code filter.

    DLS queries may use neither `now` nor templates, so the id goes in literally, after
    `check_user` made sure it is a plain token.
    """
    return build_owner_filter(check_prefix(prefix), check_user(user_id))


def key_name(prefix: str, user_id: str) -> str:
    return f"atlas-{check_prefix(prefix)}-{check_user(user_id)}"


def build_role_descriptor(prefix: str, user_id: str) -> dict:
    """Search (`C.USER_KEY_PRIVILEGES`) on the prefix's exact index names (memory + archive), nothing else, through
    the DLS query."""
    return {f"{key_name(prefix, user_id)}-read": {
        "cluster": [],
        "indices": [{"names": all_indices(prefix), "privileges": list(C.USER_KEY_PRIVILEGES),
                     "query": build_dls_query(prefix, user_id),
                     "allow_restricted_indices": False}],
    }}


def check_expiration(expiration: str) -> str:
    if not isinstance(expiration, str) or not EXPIRATION_PATTERN.match(expiration):
        raise ValidationError(f"expiration {expiration!r} is invalid: use a number and a unit, e.g. 30d, 12h, 90m")
    return expiration


def build_create_key_body(prefix: str, user_id: str, *, expiration: str | None = None) -> dict:
    """POST _security/api_key: the user's read key, its owner in the metadata."""
    body = {"name": key_name(prefix, user_id), "role_descriptors": build_role_descriptor(prefix, user_id),
            "metadata": {"atlas_user_id": user_id, "atlas_prefix": prefix}}
    if expiration is not None:
        body["expiration"] = check_expiration(expiration)
    return body


# --- the stored keys (atlas.security.credentials) ------------------------------------------


@dataclass(frozen=True)
class UserKey:
    """One user's read key as kept in the credentials index; `encoded` is the secret.

    Times are wall-clock (key lifetimes are real time, whatever clock the store runs on).
    """

    user_id: str
    prefix: str
    id: str
    name: str
    encoded: str = field(repr=False)
    created_at: str
    expiration: str | None = None
    expires_at: str | None = None
    revoked_at: str | None = None

    def state(self, *, now: datetime | None = None) -> str:
        """"active", "expired" or "revoked" as this machine knows it (the cluster has the last word)."""
        return lifetime_state(revoked_at=self.revoked_at, expires_at=self.expires_at, now=now)


def lifetime_state(*, revoked_at: str | None, expires_at: str | None, now: datetime | None = None) -> str:
    """"active", "expired" or "revoked": one rule for user keys and Atlas tokens (wall-clock times)."""
    if revoked_at:
        return "revoked"
    if expires_at and parse_date(expires_at) <= (now or utcnow()):
        return "expired"
    return "active"


def _record(key: UserKey) -> dict:
    """The key's document: the API key's own id is `key_id` (`id` names the document)."""
    fields = {k: v for k, v in asdict(key).items() if k not in ("prefix", "id")}
    return {"kind": "key", "key_id": key.id, **fields}


def _key(prefix: str, record: dict) -> UserKey:
    fields = {k: v for k, v in record.items() if k not in ("kind", "id", "key_id")}
    return UserKey(prefix=prefix, id=record["key_id"], **fields)


def _save(scope: Scope, key: UserKey, *, create: bool = False) -> None:
    put_credential(scope.es, key.prefix, key_doc_id(key.user_id), _record(key), create=create)


def list_user_keys(scope: Scope) -> list[UserKey]:
    """Every stored key of the prefix, by user."""
    return [_key(scope.prefix, record) for record in find_credentials(scope.es, scope.prefix,
                                                                       {"term": {"kind": "key"}})]


def unknown_user(user_id: str, prefix: str, settings: Settings) -> NotFound:
    option = "" if prefix == settings.index_prefix else f" --prefix {prefix}"
    return NotFound(f"unknown user {user_id}: create a key with `atlas users create {user_id}{option}`")


def revoked(user_id: str) -> AuthError:
    return AuthError(f"key for user {user_id} was revoked or expired: run `atlas users rotate {user_id}`")


def stored_key(scope: Scope, user_id: str) -> UserKey:
    """The user's key as every server sees it (a realtime `GET` of the credentials index)."""
    record = get_credential(scope.es, scope.prefix, key_doc_id(check_user(user_id)))
    if record is None:
        raise unknown_user(user_id, scope.prefix, scope.settings)
    return _key(scope.prefix, record)


# --- key lifecycle -----------------------------------------------------------------------


def _issue(scope: Scope, user_id: str, expiration: str | None, *, first: bool = False) -> UserKey:
    """Create the key in the cluster and store it. The `first` key of a user is stored only if no server stored
    one meanwhile; if one did, the new key is invalidated and the stored one returned."""
    body = build_create_key_body(scope.prefix, user_id, expiration=expiration)
    try:
        # refresh=true: the key is usable at once, without waiting for the next security-index refresh (~1 s).
        resp = scope.es.security.create_api_key(**body, refresh=True)
    except AuthorizationException:
        raise AuthError("the service credential may not create API keys: it needs the `manage_own_api_key` "
                        "cluster privilege (Atlas's service role has it: `atlas service create`)") from None
    expires = resp.get("expiration")
    key = UserKey(user_id, scope.prefix, resp["id"], resp["name"], resp["encoded"], es_date(utcnow()), expiration,
                  es_date(datetime.fromtimestamp(expires / 1000, tz=UTC)) if expires else None)
    try:
        _save(scope, key, create=first)
    except StoredMeanwhile:
        scope.es.security.invalidate_api_key(ids=[key.id], owner=True)
        return stored_key(scope, user_id)
    return key


def create_user_key(scope: Scope, user_id: str, *, expiration: str | None = None) -> UserKey:
    """A new read key for `user_id`; refused while the user has an active one (rotate it instead)."""
    check_user(user_id)
    if expiration is not None:
        check_expiration(expiration)
    try:
        current = stored_key(scope, user_id)
    except NotFound:
        current = None
    if current is not None and current.state() == "active":
        raise ValidationError(f"user {user_id} already has an active key ({current.id}): "
                              f"run `atlas users rotate {user_id}` for a new one")
    return _issue(scope, user_id, expiration, first=current is None)


def rotate_user_key(scope: Scope, user_id: str, *, expiration: str | None = None) -> UserKey:
    """Replace the user's key: the new one is stored before every other key of the user is invalidated."""
    old = stored_key(scope, user_id)
    new = _issue(scope, user_id, expiration or old.expiration)
    invalidate_user_keys(scope, user_id, keep=new.id)
    return new


def revoke_user_key(scope: Scope, user_id: str) -> UserKey:
    """Invalidate every key of the user in the prefix, not only the stored one (another server may have
    minted its own); the stored one stays, marked, so that reads say what happened."""
    key = stored_key(scope, user_id)
    invalidate_user_keys(scope, user_id)
    key = replace(key, revoked_at=es_date(utcnow()))
    _save(scope, key)
    return key


def live_user_keys_query(prefix: str, user_id: str) -> dict:
    """The `_security/_query/api_key` query for one user's keys of the prefix that are not invalidated."""
    return {"bool": {"filter": [{"term": {"metadata.atlas_prefix": prefix}},
                                {"term": {"metadata.atlas_user_id": check_user(user_id)}},
                                {"term": {"invalidated": False}}]}}


def invalidate_user_keys(scope: Scope, user_id: str, *, keep: str | None = None) -> list[str]:
    """Invalidate every live key the cluster holds for the user (found by metadata, paged), but `keep`."""
    return _invalidate_all(scope.es, live_user_keys_query(scope.prefix, user_id), keep=keep)


def _invalidate_all(es: Elasticsearch, query: dict, *, keep: str | None = None) -> list[str]:
    done: list[str] = []
    while page := [key["id"] for key in es.security.query_api_keys(query=query, size=C.LIST_PAGE_SIZE)["api_keys"]
                   if key["id"] not in done and key["id"] != keep]:  # an invalidated key leaves the query
        es.security.invalidate_api_key(ids=page, owner=True)
        done.extend(page)
    return done


# --- reads through the user's key -----------------------------------------------------------


class UserClient(AtlasClient):
    """A client on one user's key: a refused key becomes an `AuthError` that says how to fix it
    (and, as for every Atlas client, a lost connection a `ConnectionFailed`)."""

    user_id = ""

    def perform_request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().perform_request(*args, **kwargs)
        except AuthenticationException:
            raise revoked(self.user_id) from None

    def options(self, **kwargs: Any) -> UserClient:
        client = super().options(**kwargs)
        client.user_id = self.user_id
        return client


def user_client(es: Elasticsearch, user_id: str, api_key: str) -> UserClient:
    """A client sharing `es`'s connections, authenticated with the user's key instead of the service credential."""
    client = UserClient(_transport=es.transport, api_key=api_key)
    client.user_id = user_id
    return client


class KeyReader:
    """`store.reader` after `enable_tenancy`: each user reads through their own stored key.

    The stored key is read again (a realtime `GET`) once it is `C.TOKEN_CACHE_SECONDS` old, or at once after this
    process changed the prefix's credentials; clients are cached per key. A revocation through any server stops
    reads at once all the same (the cluster refuses the key); a rotation through another server leaves this one
    reading with the old key, refused, for at most that long. A key is checked once, when its
    client is made: a key with an older Atlas role is replaced first (`upgrade_user_key`), then the
    credential is inspected and must belong to the user.
    """

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.clock = store, clock
        self.clients: dict[str, tuple[str, UserClient]] = {}
        self.keys: dict[str, tuple[float, int, UserKey]] = {}

    def stored(self, user_id: str) -> UserKey:
        """The user's stored key, as read at most `C.TOKEN_CACHE_SECONDS` ago and after this process's last change."""
        cached, seen = self.keys.get(user_id), writes(self.store.prefix)
        if cached is not None and cached[1] == seen and self.clock() - cached[0] < C.TOKEN_CACHE_SECONDS:
            return cached[2]
        key = stored_key(self.store, user_id)
        self.keys[user_id] = (self.clock(), seen, key)
        return key

    def provision(self, user_id: str) -> None:
        """Before a user's write: create their read key if they have none. A key this reader has seen
        (`stored`) is not looked for again, so a user's later writes cost no `GET`."""
        try:
            self.stored(user_id)
        except NotFound:
            ensure_user_key(self.store, user_id)

    def __call__(self, user_id: str) -> Elasticsearch:
        key = self.stored(user_id)
        if key.state() != "active":
            raise revoked(user_id)
        cached = self.clients.get(user_id)
        if cached is not None and cached[0] == key.id:
            return cached[1]
        key = upgrade_user_key(self.store, key)
        client = user_client(self.store.es, user_id, key.encoded)
        report = warn_if_unrestricted(client, prefix=self.store.prefix, context=f"the stored key of user {user_id}")
        if report.user_id != user_id:
            raise AuthError(f"the key stored for user {user_id} belongs to {report.user_id!r}: "
                            f"run `atlas users rotate {user_id}`")
        self.clients[user_id] = (key.id, client)
        return client

    def check_live(self, user_id: str) -> None:
        """Ask the cluster, now, whether the user's key still authenticates; `AuthError` if it was revoked,
        rotated away or erased by any server. Writes go out with the service credential: they are checked here
        first, so that no server's cached token lets a revoked user write."""
        self(user_id).security.authenticate()


_PROVISION_LOCK = threading.Lock()


def upgrade_user_key(scope: Scope, key: UserKey) -> UserKey:
    """`key`, or its replacement when the cluster holds it with an older Atlas role than today's.

    A key keeps the DLS query it was made with, so when `build_role_descriptor` changes (as when the
    ownerless clause was limited to the catalog index) the keys made before still read by the old
    one. Such a key, live and made by Atlas for this user (its metadata and role name say so), is
    rotated: the new key is stored before the old one is invalidated. A key the cluster no longer
    accepts and a key Atlas did not make are returned as they are, for the read to refuse; a key that
    another thread or process replaced meanwhile is returned as stored.
    """
    expected = build_role_descriptor(scope.prefix, key.user_id)
    try:
        info = scope.es.security.get_api_key(id=key.id, owner=True)["api_keys"][0]
    except NotFoundError:
        return key
    except AuthorizationException:
        raise AuthError(f"the service credential may not read the key of user {key.user_id} to check its role: "
                        "it needs the `manage_own_api_key` cluster privilege (Atlas's service role has it)") from None
    roles, meta = info.get("role_descriptors") or {}, info.get("metadata") or {}
    made_by_atlas = meta.get("atlas_user_id") == key.user_id and meta.get("atlas_prefix") == scope.prefix \
        and set(roles) == set(expected)
    if info.get("invalidated") or not made_by_atlas or canonical_roles(roles) == canonical_roles(expected):
        return key
    with _PROVISION_LOCK:
        current = stored_key(scope, key.user_id)
        return current if current.id != key.id else rotate_user_key(scope, key.user_id)


def ensure_user_key(scope: Scope, user_id: str, *, verify: bool = False) -> None:
    """Create the user's read key when they have none (their first write provisions it).

    A revoked or expired key stays so until someone rotates it, unless `verify`, which
    also replaces a key the cluster no longer accepts (evaluation runs on a reset node) and
    a key with an older Atlas role (`authenticate_user_key` refuses both).
    """
    with _PROVISION_LOCK:
        try:
            key = stored_key(scope, user_id)
        except NotFound:
            create_user_key(scope, user_id)
            return
        if not verify:
            return
        if key.state() == "active":
            try:
                authenticate_user_key(scope, key.encoded)
                return
            except AuthError:
                pass  # revoked or expired in the cluster, or made for a cluster that was reset
        rotate_user_key(scope, user_id)


def enable_tenancy(store: Store) -> None:
    """From now on every read of `store` (recall, ownership checks, history) uses the user's own key,
    and a user's first write creates that key."""
    store.reader = reader = KeyReader(store)
    store.provision = reader.provision
    store.forget = lambda: forget_prefix(store)


def live_prefix_keys_query(prefix: str) -> dict:
    """The `_security/_query/api_key` query for the prefix's keys that are not invalidated."""
    return {"bool": {"filter": [{"term": {"metadata.atlas_prefix": prefix}}, {"term": {"invalidated": False}}]}}


def forget_prefix(store: Store) -> None:
    """Invalidate every key made for the prefix (by the library, the CLI or a test) and drop the prefix's
    credentials index, keys and tokens (`Store.drop`)."""
    _invalidate_all(store.es, live_prefix_keys_query(store.prefix))
    drop_credentials(store.es, store.prefix)


def authenticate_user_key(store: Scope, api_key: str) -> str:
    """The user a key belongs to, from its metadata in the cluster: the owner of a write comes from here.

    `store` is a `Store`, or a `KeyScope` where no models are loaded.

    The key must be an Atlas user key of this prefix carrying exactly Atlas's read role,
    so metadata on a key with wider privileges is not believed. Anyone with `manage_own_api_key`
    can mint a key that looks exactly like that, so the key must also have been created by the
    service principal and be the key stored for that user in the credentials index.
    """
    client = store.es.options(api_key=api_key)
    try:
        auth = client.security.authenticate()
        if auth.get("authentication_type") != "api_key":
            raise AuthError("this credential is not an API key: authenticate with the user's Atlas key")
        info = client.security.get_api_key(id=auth["api_key"]["id"])["api_keys"][0]
    except AuthenticationException:
        raise AuthError("this API key is unknown, revoked or expired: ask the operator for a new one "
                        "(`atlas users rotate <user>`)") from None
    meta = info.get("metadata") or {}
    user = meta.get("atlas_user_id")
    if meta.get("atlas_prefix") != store.prefix or not isinstance(user, str) or not USER_ID_PATTERN.fullmatch(user):
        raise AuthError(f"this API key is not an Atlas user key of prefix {store.prefix}: "
                        f"create one with `atlas users create <user> --prefix {store.prefix}`")
    expected = canonical_roles(build_role_descriptor(store.prefix, user))
    if canonical_roles(info.get("role_descriptors") or {}) != expected:
        raise AuthError(f"the key of user {user} does not carry Atlas's read-only DLS role: "
                        f"run `atlas users rotate {user}`")
    if (info.get("username"), info.get("realm")) != service_principal(store.es):
        raise AuthError(f"this API key claims user {user} but was not created by Atlas's service credential: "
                        "it is not believed")
    try:
        registered = stored_key(store, user).id == info["id"]
    except NotFound:
        registered = False
    if not registered:
        raise AuthError(f"this API key is not registered for user {user}: run `atlas users rotate {user}`")
    return user


def service_principal(es: Elasticsearch) -> tuple[str, str]:
    """(username, realm) that the keys `es` creates are recorded under: its user, or its own key's owner."""
    auth = es.security.authenticate()
    if auth.get("authentication_type") == "api_key":
        info = es.security.get_api_key(id=auth["api_key"]["id"])["api_keys"][0]
        return info["username"], info["realm"]
    return auth["username"], auth["lookup_realm"]["name"]


def canonical_roles(roles: Mapping[str, dict]) -> dict:
    """Role descriptors as comparable values: DLS query strings parsed, empty fields and bookkeeping dropped."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()
                    if k != "transient_metadata" and v is not False and v not in (None, [], {})}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    out = {}
    for name, descriptor in roles.items():
        grants = [{**g, "query": json.loads(g["query"]) if isinstance(g.get("query"), str) else g.get("query")}
                  for g in descriptor.get("indices", [])]
        out[name] = clean({**descriptor, "indices": grants})
    return out


# --- is the credential restricted? --------------------------------------------------------


@dataclass(frozen=True)
class CredentialReport:
    """What a credential may read of the memory indices, from the cluster's own answer."""

    principal: str
    api_key_id: str | None
    #: `atlas_user_id` of the key's metadata (Atlas user keys only).
    user_id: str | None
    #: Every grant that can read the memory indices carries a DLS query (its content is not judged).
    restricted: bool
    #: Grants without DLS, or why the owner's roles could not be seen.
    reasons: tuple[str, ...] = ()


def _can_read(privileges: Sequence[str]) -> bool:
    return any(p in ("all", "read", "*", "indices:*", "indices:data/*") or p.startswith("indices:data/read")
               for p in privileges)


def _covers(patterns: Sequence[str], indices: Sequence[str] | None) -> bool:
    """Whether an index pattern (wildcard, or /regex/ in Lucene syntax, approximated) names one of `indices`."""
    if indices is None:
        return True
    for pattern in patterns:
        if pattern.startswith("/") and pattern.endswith("/"):
            try:
                if any(re.fullmatch(pattern[1:-1], index) for index in indices):
                    return True
            except re.error:
                return True
        elif any(fnmatchcase(index, pattern) for index in indices):
            return True
    return False


def _open_grants(grants: Sequence[dict], indices: Sequence[str] | None, label: str) -> list[str]:
    """The grants that read the memory indices without a DLS query, described."""
    return [f"{label} grants {','.join(g.get('privileges', []))} on {','.join(g.get('names', []))} without DLS"
            for g in grants
            if not g.get("query") and _can_read(g.get("privileges", [])) and _covers(g.get("names", []), indices)]


def _grants(roles: Mapping[str, dict]) -> list[dict]:
    return [grant for descriptor in roles.values() for grant in descriptor.get("indices", [])]


def inspect_credential(es: Elasticsearch, *, prefix: str | None = None) -> CredentialReport:
    """Whether `es`'s credential reads the memory indices (of `prefix`, else any) only through DLS.

    An API key's permission is the intersection of its own role descriptors and its
    owner's roles (`limited_by`, visible only with `manage_api_key`): it is unrestricted
    only when both sides grant a read without DLS. A key without role descriptors has
    its owner's privileges.
    """
    auth = es.security.authenticate().body
    indices = all_indices(prefix) if prefix else None
    if auth.get("authentication_type") != "api_key":
        grants = es.security.get_user_privileges().body.get("indices", [])
        reasons = _open_grants(grants, indices, f"user {auth['username']} ({', '.join(auth.get('roles', []))})")
        return CredentialReport(auth["username"], None, None, not reasons, tuple(reasons))
    key_id = auth["api_key"]["id"]
    try:
        info = es.security.get_api_key(id=key_id, with_limited_by=True)["api_keys"][0]
    except AuthorizationException:
        info = es.security.get_api_key(id=key_id)["api_keys"][0]
    own = info.get("role_descriptors") or {}
    reasons_own = _open_grants(_grants(own), indices, "the key's role") if own else \
        ["the key has no role descriptors, so it has all its owner's privileges"]
    if "limited_by" in info:
        owner = {name: d for roles in info["limited_by"] for name, d in roles.items()}
        reasons_owner = _open_grants(_grants(owner), indices, f"its owner {auth['username']}")
    else:
        reasons_owner = [f"the roles of its owner {auth['username']} cannot be seen with this key (assumed open)"]
    restricted = not (reasons_own and reasons_owner)
    user = (info.get("metadata") or {}).get("atlas_user_id")
    return CredentialReport(f"API key {info.get('name')} ({key_id}) of {auth['username']}", key_id, user, restricted,
                            () if restricted else tuple(reasons_own + reasons_owner))


def warn_if_unrestricted(es: Elasticsearch, *, prefix: str | None = None,
                         context: str = "a read credential") -> CredentialReport:
    """Inspect the credential and warn loudly (`UnrestrictedReadWarning`) when it reads without DLS."""
    report = inspect_credential(es, prefix=prefix)
    if not report.restricted:
        warnings.warn(
            f"{context}: {report.principal} reads memory without document-level security "
            f"({'; '.join(report.reasons)}). The code filter is the only guard between users: give each user "
            "their own key (`atlas users create <user>`, `atlas.security.tenancy.enable_tenancy`).",
            UnrestrictedReadWarning, stacklevel=2)
    return report


def warn_if_service_reads(store: Store) -> CredentialReport | None:
    """At startup: when reads go through the service credential (no tenancy), check it and warn."""
    if store.reader is not None:
        return None
    guard = "with the code filter as the only guard" if store.code_filter else \
        "with the code filter OFF, so every user reads every user's memory"
    return warn_if_unrestricted(store.es, prefix=store.prefix,
                                context=f"reads of prefix {store.prefix} use the service credential {guard}")
