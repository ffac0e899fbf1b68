"""The `AtlasError` hierarchy: every error Atlas raises says what went wrong and what to do."""

from __future__ import annotations


class AtlasError(Exception):
    """Base of every error Atlas raises; messages say what to do."""


class ConnectionFailed(AtlasError):
    """The cluster is down, refuses the credentials, or speaks another major version."""


class EmbeddingError(AtlasError):
    """An embedding model could not be loaded or run."""


class ValidationError(AtlasError, ValueError):
    """Bad input (empty text, unknown type, malformed id, bad k): nothing was written (see `PartialWrite`)."""


class PartialWrite(AtlasError):
    """A bulk write stopped part-way: the documents in `indexed_ids` were written and stay; the rest were not.

    Raised instead of `ValidationError` once something was written. Loading again with the same `ids`
    overwrites instead of duplicating; without them, delete `indexed_ids` before loading again.
    """

    def __init__(self, message: str, indexed_ids: list[str]) -> None:
        super().__init__(message)
        self.indexed_ids = indexed_ids


class NotFound(AtlasError, LookupError):
    """The id does not exist, or is not visible to this user (the two are not told apart)."""


class ConflictError(AtlasError):
    """A concurrent writer changed the document first; re-read and retry."""


class AlreadySuperseded(ConflictError):
    """The document is already superseded; supersede the head of its chain instead."""

    def __init__(self, doc_id: str, head_id: str) -> None:
        super().__init__(
            f"document {doc_id} is already superseded; the current head of its chain is {head_id}: "
            f"supersede {head_id} instead"
        )
        self.doc_id = doc_id
        self.head_id = head_id


class SchemaMismatch(AtlasError):
    """An existing index's mapping differs from the one Atlas expects."""


class AuthError(AtlasError, PermissionError):
    """A credential is missing, revoked, expired, or belongs to another user."""
