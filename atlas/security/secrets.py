"""Secrets files: git-ignored JSON files readable by their owner only, and where each one lives.

The local node's passwords (`atlas.ops`), the service credential (`connection`), user keys (`tenancy`) and
token hashes (`tokens`) are each one such file under `Settings.secrets_dir`.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from atlas.config import Settings

USERS_FILE = "users.json"
TOKENS_FILE = "tokens.json"


def users_path(settings: Settings) -> Path:
    """The secrets file of user keys: {prefix: {user_id: key}}."""
    return settings.secrets_dir / USERS_FILE


def tokens_path(settings: Settings) -> Path:
    """The secrets file of token hashes: {prefix: {token id: record}}."""
    return settings.secrets_dir / TOKENS_FILE


def write_secret(path: Path, data: dict) -> None:
    """Write a JSON secret file readable by its owner only (folder 0700, file 0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600, unique per writer
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(tmp, path)


def read_secret(path: Path) -> dict | None:
    """The JSON secret at `path`, or None when it does not exist."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def update_secret(path: Path, change: Callable[[dict], object]) -> dict:
    """Read-modify-write a secret file under an exclusive lock, so concurrent writers (threads,
    processes, a CLI beside a notebook) never lose each other's entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = read_secret(path) or {}
        change(data)
        write_secret(path, data)
    return data
