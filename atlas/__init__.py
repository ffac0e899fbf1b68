"""Atlas: long-term memory for agents on Elasticsearch.

    import atlas
    store = atlas.open_store("demo")
    atlas.write_episode(store, "sarah", "My Lumio Hub v2 shows E-0x41 again", session_id="s1")
    atlas.recall(store, "sarah", "hub error code").hits

Everything a user of the memory needs is here; the layers below (`atlas.core`, `atlas.security`,
`atlas.models`, ...) are for those who extend it.
"""

from atlas.core.errors import (
    AlreadySuperseded,
    AtlasError,
    AuthError,
    ConflictError,
    ConnectionFailed,
    NotFound,
    PartialWrite,
    ValidationError,
)
from atlas.core.memory import bulk_load, forget_memory, record_outcome, write_episode, write_memory
from atlas.core.recall import DEFAULT_TUNING, Hit, RecallResult, Tuning, pre_recall, recall, record_recall
from atlas.core.store import Store
from atlas.core.supersession import history
from atlas.stack import open_store

__all__ = [
    "DEFAULT_TUNING", "AlreadySuperseded", "AtlasError", "AuthError", "ConflictError", "ConnectionFailed", "Hit",
    "NotFound", "PartialWrite", "RecallResult", "Store", "Tuning", "ValidationError", "bulk_load", "forget_memory",
    "history", "open_store", "pre_recall", "recall", "record_outcome", "record_recall", "write_episode",
    "write_memory",
]
