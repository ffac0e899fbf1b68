"""Secrets files: git-ignored JSON files readable by their owner only.

The local node's passwords (`atlas.ops`) and the service credential (`connection`) are each one such file under
`Settings.secrets_dir`. Users' keys and token hashes live in the cluster (`atlas.security.credentials`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


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
