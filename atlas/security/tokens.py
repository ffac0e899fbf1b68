"""Atlas-issued bearer tokens: what a tenant holds instead of an Elasticsearch credential.

A user's DLS key stops them reading other users' documents, but not from learning about them:
term statistics (`_termvectors` with `term_statistics`, BM25's IDF) count every document of a
shard, so a key holder can ask, word by word, whether anyone's memory contains a word. So the
key never leaves the server. A tenant gets an opaque token (`atl_` + 256 random bits), shown
once; the server keeps only its sha256, maps it to the user, and reads with the user's stored
key itself. Elasticsearch does not know the token, so it is worthless against the cluster.

Tokens live in the git-ignored `.atlas/tokens.json` ({prefix: {token_id: record}}), beside
the keys of `atlas.security.tenancy`; `create_user`, `rotate_user` and `revoke_user` manage both
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

from atlas import constants as C
from atlas.config import Settings
from atlas.core.clock import es_date, utcnow
from atlas.core.errors import AuthError, NotFound
from atlas.core.validation import check_user
from atlas.security.secrets import read_secret, tokens_path, update_secret
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
    """What `revoke_user` killed: every key id found in the cluster, every token id in the file."""

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
    return {k: v for k, v in asdict(token).items() if k not in ("id", "prefix")}


def list_tokens(settings: Settings, *, prefix: str | None = None) -> list[UserToken]:
    """Every stored token (of one prefix, when given), by prefix, user, then creation."""
    data = read_secret(tokens_path(settings)) or {}
    found = [UserToken(prefix=p, id=token_id, **record) for p, records in data.items() if prefix in (None, p)
             for token_id, record in records.items()]
    return sorted(found, key=lambda t: (t.prefix, t.user_id, t.created_at, t.id))


def issue_token(scope: Scope, user_id: str, *, expiration: str = C.TOKEN_EXPIRATION) -> Issued:
    """A new token for a user who has a stored key (other tokens of the user stay valid)."""
    stored_key(scope.settings, scope.prefix, user_id)  # NotFound, with the fix, for a user without a key
    now = utcnow()
    secret = C.TOKEN_PREFIX + secrets.token_urlsafe(C.TOKEN_BYTES)
    token = UserToken(user_id, scope.prefix, f"tok_{secrets.token_hex(8)}", digest(secret), es_date(now),
                      es_date(now + lifetime(expiration)))
    update_secret(tokens_path(scope.settings),
                  lambda data: data.setdefault(scope.prefix, {}).__setitem__(token.id, _record(token)))
    return Issued(token, secret)


def revoke_tokens(scope: Scope, user_id: str) -> list[str]:
    """Mark every live token of the user revoked; the ids of those that were live."""
    check_user(user_id)
    revoked: list[str] = []
    stamp = es_date(utcnow())

    def mark(data: dict) -> None:
        for token_id, record in data.get(scope.prefix, {}).items():
            if record["user_id"] == user_id and not record.get("revoked_at"):
                record["revoked_at"] = stamp
                revoked.append(token_id)

    update_secret(tokens_path(scope.settings), mark)
    return revoked


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
    """Whose token this is, from the token file alone: no cluster call, so a bad token costs nothing there.

    The file is cached in memory for `ttl` seconds (`C.TOKEN_CACHE_SECONDS`), then read again: a
    token revoked or rotated by any process stops working within that bound; expiry is checked on
    every call. Lookup is by the sha256 of the presented token, so its timing tells a caller only
    about a hash they chose themselves, never about a stored one (no compare needs to be
    constant-time). `clock` times the cache, `now` (wall clock) the expiry: tests move them on.
    """

    def __init__(self, settings: Settings, prefix: str, *, ttl: float = C.TOKEN_CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], datetime] = utcnow) -> None:
        self.path, self.prefix, self.ttl, self.clock, self.now = tokens_path(settings), prefix, ttl, clock, now
        self.lock = threading.Lock()
        self.by_digest: dict[str, UserToken] = {}
        self.loaded_at: float | None = None

    def table(self) -> dict[str, UserToken]:
        """sha256 -> token of the prefix, at most `ttl` seconds old."""
        with self.lock:
            if self.loaded_at is None or self.clock() - self.loaded_at >= self.ttl:
                records = (read_secret(self.path) or {}).get(self.prefix, {})
                self.by_digest = {r["sha256"]: UserToken(prefix=self.prefix, id=token_id, **r)
                                  for token_id, r in records.items()}
                self.loaded_at = self.clock()
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
