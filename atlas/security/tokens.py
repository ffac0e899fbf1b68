"""Atlas-issued bearer tokens: what a tenant holds instead of an Elasticsearch credential.

A user's DLS key stops them reading other users' documents, but not from learning about them:
term statistics (`_termvectors` with `term_statistics`, BM25's IDF) count every document of a
shard, so a key holder can ask, word by word, whether anyone's memory contains a word. So the
key never leaves the server. A tenant gets an opaque token (`atl_` + 256 random bits), shown
once; the server keeps only its sha256, maps it to the user, and reads with the user's stored
key itself. Elasticsearch does not know the token, so it is worthless against the cluster.

Token records live in the prefix's credentials index (`atlas.security.credentials`), beside the
keys of `atlas.security.tenancy`, so every server in front of the cluster accepts the same tokens
and sees the same revocations; `create_user`, `rotate_user` and `revoke_user` manage both
(`atlas users create|rotate|revoke`). See docs/security.md.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from elasticsearch import Elasticsearch

from atlas import constants as C
from atlas.core.clock import es_date, utcnow
from atlas.core.errors import AuthError, NotFound
from atlas.core.validation import check_user
from atlas.security.credentials import find_credentials, put_credential, update_credentials, writes
from atlas.security.tenancy import (
    Scope,
    UserKey,
    check_expiration,
    create_user_key,
    invalidate_user_keys,
    lifetime_state,
    revoke_user_key,
    rotate_user_key,
    stored_key,
)

UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


@dataclass(frozen=True)
class UserToken:
    """One token as stored: never the token itself, only its sha256. Times are wall-clock."""

    user_id: str
    prefix: str
    id: str
    sha256: str = field(repr=False)
    created_at: str
    expires_at: str | None = None
    revoked_at: str | None = None

    def state(self, *, now: datetime | None = None) -> str:
        """"active", "expired" or "revoked"."""
        return lifetime_state(revoked_at=self.revoked_at, expires_at=self.expires_at, now=now)


@dataclass(frozen=True)
class Issued:
    """A new token and its secret, which exists only here: print it once, then drop it."""

    token: UserToken
    secret: str = field(repr=False)
    key: UserKey | None = None


@dataclass(frozen=True)
class Revocation:
    """What `revoke_user` killed: every key id found in the cluster, every token id stored."""

    user_id: str
    prefix: str
    key_ids: list[str]
    token_ids: list[str]


def digest(secret: str) -> str:
    """sha256 hex of a token: enough for 256 random bits (no dictionary to guess from, so no slow hash)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def lifetime(expiration: str) -> timedelta:
    """30d, 12h, 90m, 45s as a duration (the syntax of key expirations)."""
    check_expiration(expiration)
    return timedelta(**{UNITS[expiration[-1]]: int(expiration[:-1])})


def _record(token: UserToken) -> dict:
    return {"kind": "token", **{k: v for k, v in asdict(token).items() if k not in ("id", "prefix")}}


def _tokens(es: Elasticsearch, prefix: str, *filters: dict) -> list[UserToken]:
    return [UserToken(prefix=prefix, **{k: v for k, v in record.items() if k != "kind"})
            for record in find_credentials(es, prefix, {"term": {"kind": "token"}}, *filters)]


def list_tokens(scope: Scope) -> list[UserToken]:
    """Every stored token of the prefix, by user, then creation."""
    return sorted(_tokens(scope.es, scope.prefix), key=lambda t: (t.user_id, t.created_at, t.id))


def issue_token(scope: Scope, user_id: str, *, expiration: str = C.TOKEN_EXPIRATION) -> Issued:
    """A new token for a user who has a stored key (other tokens of the user stay valid)."""
    stored_key(scope, user_id)  # NotFound, with the fix, for a user without a key
    now = utcnow()
    secret = C.TOKEN_PREFIX + secrets.token_urlsafe(C.TOKEN_BYTES)
    token = UserToken(user_id, scope.prefix, f"tok_{secrets.token_hex(8)}", digest(secret), es_date(now),
                      es_date(now + lifetime(expiration)))
    put_credential(scope.es, scope.prefix, token.id, _record(token), create=True)
    return Issued(token, secret)


def revoke_tokens(scope: Scope, user_id: str) -> list[str]:
    """Mark every live token of the user revoked, for every server; the ids of those that were live. This
    process's verifiers forget their cache at once, another server's within `C.TOKEN_CACHE_SECONDS`."""
    live = [t.id for t in _tokens(scope.es, scope.prefix, {"term": {"user_id": check_user(user_id)}})
            if not t.revoked_at]
    update_credentials(scope.es, scope.prefix, dict.fromkeys(live, {"revoked_at": es_date(utcnow())}))
    return live


def create_user(scope: Scope, user_id: str, *, expiration: str | None = None) -> Issued:
    """The user's read key (kept on the server) and their first token (for them); `atlas users create`."""
    key = create_user_key(scope, user_id, expiration=expiration)
    issued = issue_token(scope, user_id, expiration=expiration or C.TOKEN_EXPIRATION)
    return Issued(issued.token, issued.secret, key)


def rotate_user(scope: Scope, user_id: str, *, expiration: str | None = None) -> Issued:
    """A new key and a new token; every other key and token of the user stops working."""
    key = rotate_user_key(scope, user_id, expiration=expiration)
    revoke_tokens(scope, user_id)
    issued = issue_token(scope, user_id, expiration=expiration or C.TOKEN_EXPIRATION)
    return Issued(issued.token, issued.secret, key)


def revoke_user(scope: Scope, user_id: str) -> Revocation:
    """Kill every key of the user in the prefix (found in the cluster by metadata, wherever it was minted)
    and every token; NotFound for a user this prefix has never seen."""
    key_ids = invalidate_user_keys(scope, user_id)
    try:
        revoke_user_key(scope, user_id)  # marks the stored key, so that reads say "revoked"
        known = True
    except NotFound:
        known = False  # no key in this machine's file: the cluster may still have held some
    token_ids = revoke_tokens(scope, user_id)
    if not (known or key_ids or token_ids):
        raise NotFound(f"user {user_id} has no key or token in prefix {scope.prefix}: nothing to revoke")
    return Revocation(user_id, scope.prefix, key_ids, token_ids)


class TokenVerifier:
    """Whose token this is, from a cached table of the prefix's token hashes: a bad token costs no cluster call.

    The table is read from the credentials index (every page of it) at most every `ttl` seconds
    (`C.TOKEN_CACHE_SECONDS`): a token revoked or rotated by another server stops working within that
    bound, one revoked or issued by this process at once (`credentials.writes`); expiry is checked on every call.
    Lookup is by the sha256 of the presented token, so its timing tells a caller only about a hash they
    chose themselves, never about a stored one (no compare needs to be constant-time). `clock` times the
    cache, `now` (wall clock) the expiry: tests move them on.
    """

    def __init__(self, es: Elasticsearch, prefix: str, *, ttl: float = C.TOKEN_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = utcnow) -> None:
        self.es, self.prefix, self.ttl, self.clock, self.now = es, prefix, ttl, clock, now
        self.lock = threading.Lock()
        self.by_digest: dict[str, UserToken] = {}
        self.loaded: tuple[float, int] | None = None

    def table(self) -> dict[str, UserToken]:
        """sha256 -> token of the prefix, at most `ttl` seconds old and newer than this process's last change."""
        with self.lock:
            if self.loaded is None or self.clock() - self.loaded[0] >= self.ttl \
                    or self.loaded[1] != writes(self.prefix):
                seen = writes(self.prefix)
                self.by_digest = {t.sha256: t for t in _tokens(self.es, self.prefix)}
                self.loaded = (self.clock(), seen)
            return self.by_digest

    def verify(self, secret: str) -> str:
        """The user of an active token, else `AuthError` saying what to do."""
        if not secret.startswith(C.TOKEN_PREFIX):
            raise AuthError(f"this is not an Atlas token (they start with {C.TOKEN_PREFIX}): ask the operator "
                            "for one (`atlas users create <user>`)")
        token = self.table().get(digest(secret))
        if token is None:
            raise AuthError("this token is unknown: ask the operator for a new one (`atlas users rotate <user>`)")
        state = token.state(now=self.now())
        if state != "active":
            raise AuthError(f"this token was {state}: ask the operator for a new one "
                            f"(`atlas users rotate {token.user_id}`)")
        return token.user_id
