"""Atlas: long-term memory for agents on Elasticsearch.

    import atlas
    store = atlas.open_store("demo")
    atlas.write_episode(store, "sarah", "My Lumio Hub v2 shows E-0x41 again", session_id="s1")
    atlas.recall(store, "sarah", "hub error code").hits
"""

from .connection import connect
from .errors import (AlreadySuperseded, AtlasError, AuthError, ConflictError, ConnectionFailed, NotFound,
                     ValidationError)
from .memory import forget_memory, record_outcome, write_episode, write_memory
from .recall import RecallResult, pre_recall, recall
from .store import Store, open_store
from .supersession import archive, history, repair

__all__ = [
    "AlreadySuperseded", "AtlasError", "AuthError", "ConflictError", "ConnectionFailed", "NotFound", "RecallResult",
    "Store", "ValidationError", "archive", "connect", "forget_memory", "history", "open_store", "pre_recall", "recall",
    "record_outcome", "repair", "write_episode", "write_memory",
]
