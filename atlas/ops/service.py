"""Atlas's own Elasticsearch user: a role with what Atlas does and nothing more, set up by the operator.

Every Atlas process (the MCP server, the CLI, notebooks, evaluations) connects as this user; the
operator's superuser (`elastic` on the local node) only runs this set-up. The role may create, map
and drop the indices its patterns name, read and write their documents, keep index templates, read
cluster health, and make, read and invalidate the API keys it owns: the users' DLS keys, which are
therefore limited by this role too. It cannot read system indices (`.security` among them), change
cluster settings, manage users or roles, or see another principal's keys.

It is a user with a password, not an API key: a key authenticated by an API key may not carry role
descriptors, and every user key carries one.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

from elasticsearch import AuthorizationException, Elasticsearch

from atlas import constants as C
from atlas.config import Settings
from atlas.core.errors import AuthError, ValidationError
from atlas.security.secrets import read_secret, write_secret

SERVICE_USER_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def check_service_user(name: str) -> str:
    if not SERVICE_USER_PATTERN.fullmatch(name):
        raise ValidationError(f"service user {name!r} must match {SERVICE_USER_PATTERN.pattern} (ATLAS_SERVICE_USER)")
    return name


def build_service_role_body(*, indices: Sequence[str] = C.SERVICE_INDEX_PATTERNS) -> dict:
    """PUT _security/role/<service user>: the service principal's privileges (system indices excluded)."""
    names = [pattern.strip() for pattern in indices if pattern.strip()]
    if not names:
        raise ValidationError("the service role needs at least one index pattern, e.g. --indices 'atlas-*'")
    return {"cluster": list(C.SERVICE_CLUSTER_PRIVILEGES),
            "indices": [{"names": names, "privileges": list(C.SERVICE_INDEX_PRIVILEGES),
                         "allow_restricted_indices": False}],
            "metadata": {"atlas": "service principal"}}


def ensure_service_principal(admin: Elasticsearch, settings: Settings, *,
                             indices: Sequence[str] = C.SERVICE_INDEX_PATTERNS) -> dict:
    """Create or update the role and its user with the operator's client `admin`. Idempotent.

    The password is made once and kept in the secrets file (`Settings.service_credentials_path`),
    from which every later connection of this checkout to this cluster reads it.
    """
    path, name = settings.service_credentials_path, check_service_user(settings.service_user)
    known = read_secret(path) or {}
    same = (known.get("url"), known.get("username")) == (settings.url, name)
    password = known["password"] if same else secrets.token_urlsafe(24)
    creds = {"url": settings.url, "username": name, "password": password}
    try:
        admin.security.put_role(name=name, **build_service_role_body(indices=indices))
        admin.security.put_user(username=name, password=password, roles=[name], full_name="Atlas service principal")
    except AuthorizationException:
        raise AuthError("this credential may not manage users and roles: run `atlas service create` with one that "
                        "has the `manage_security` cluster privilege (e.g. the cluster's `elastic` user)") from None
    write_secret(path, creds)
    return creds
