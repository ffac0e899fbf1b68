"""Atlas: long-term memory for agents on Elasticsearch.

    import atlas
    store = atlas.open_store("demo")
    atlas.write_episode(store, "sarah", "My Lumio Hub v2 shows E-0x41 again", session_id="s1")
    atlas.core.recall(store, "sarah", "hub error code").hits
"""

from atlas.core.connection import connect
from atlas.core.errors import (
                     AlreadySuperseded,
                     AtlasError,
                     AuthError,
                     ConflictError,
                     ConnectionFailed,
                     NotFound,
                     ValidationError,
)
from atlas.core.memory import forget_memory, record_outcome, write_episode, write_memory
from atlas.core.recall import RecallResult, pre_recall, recall
from atlas.core.store import Store
from atlas.core.supersession import archive, history, repair
from atlas.stack import open_store

__all__ = [
    "AlreadySuperseded", "AtlasError", "AuthError", "ConflictError", "ConnectionFailed", "NotFound", "RecallResult",
    "Store", "ValidationError", "archive", "connect", "forget_memory", "history", "open_store", "pre_recall", "recall",
    "record_outcome", "repair", "write_episode", "write_memory",
]
