"""Checks on everything a caller hands Atlas, before anything is written or searched.

User ids go into DLS role queries, so their pattern is strict: a crafted id must
never be able to widen a query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from atlas import constants as C
from atlas.core.clock import as_utc, es_date
from atlas.core.errors import ValidationError

USER_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
#: Elasticsearch auto-generated ids are 20 URL-safe base64 characters; allow a little more.
DOC_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Session ids and playbook names are stored as keywords: short, printable, one line.
MAX_LABEL_CHARS = 256


def check_user(user_id: object) -> str:
    if not isinstance(user_id, str) or not USER_ID_PATTERN.fullmatch(user_id):
        raise ValidationError(f"user id {user_id!r} is invalid: use 1-64 characters of a-z, 0-9, '_' or '-', "
                              "starting with a letter or digit")
    return user_id


def check_owner(doc: Mapping) -> str | None:
    """The owner of a document about to be written: one user id for a memory, none for a catalog item.

    Reads let through the user's own documents and the catalog's ownerless ones
    (`schemas.build_owner_filter`); a memory without an owner, with an empty list or with a list
    of owners would be nobody's, so it is refused before anything is written.
    """
    memory_type = check_type(doc.get("memory_type"))
    owner = doc.get("user_id")
    if memory_type == "catalog":
        if "user_id" in doc:
            raise ValidationError(f"a catalog item is shared by every user: leave out its user_id (found {owner!r})")
        return None
    if not isinstance(owner, str) or not USER_ID_PATTERN.fullmatch(owner):
        raise ValidationError(f"a {memory_type} memory belongs to exactly one user: its user_id must be one user id "
                              f"(1-64 characters of a-z, 0-9, '_' or '-'), not {owner!r}")
    return owner


def check_text(text: object, *, what: str = "text") -> str:
    if not isinstance(text, str):
        raise ValidationError(f"{what} must be a string, not {type(text).__name__}")
    if not text.strip():
        raise ValidationError(f"{what} is empty")
    if "\x00" in text:
        raise ValidationError(f"{what} contains a NUL character")
    if len(text) > C.MAX_TEXT_CHARS:
        raise ValidationError(f"{what} has {len(text)} characters; the limit is {C.MAX_TEXT_CHARS}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(f"{what} is not valid Unicode (a lone surrogate at position {exc.start}): "
                              "decode the input with errors='replace'") from None
    return text


def check_query(query: object, *, limit: int = C.MAX_QUERY_CHARS) -> str:
    """A search query: a text no longer than `limit`, far below what a memory may hold (`MAX_TEXT_CHARS`).

    A query is parsed and embedded on every request: a pasted document is no question, and reading
    it whole would hold the server for nothing (BM25 and the embedders read only its head anyway).
    """
    if isinstance(query, str) and len(query) > limit:
        raise ValidationError(f"query has {len(query)} characters; the limit is {limit}: ask with a question or a "
                              "passage, not a whole document")
    return check_text(query, what="query")


def check_type(memory_type: object, *, allowed: Iterable[C.MemoryType] = C.MEMORY_TYPES) -> C.MemoryType:
    allowed = tuple(allowed)
    if memory_type not in allowed:
        raise ValidationError(f"unknown memory type {memory_type!r}: use one of {', '.join(allowed)}")
    return memory_type


def check_types(types: Iterable[str] | None) -> tuple[C.MemoryType, ...]:
    if types is None:
        return C.MEMORY_TYPES
    if isinstance(types, str):
        types = [types]
    if not isinstance(types, Iterable):
        raise ValidationError(f"types must be a list of memory types, not {types!r}")
    checked = tuple(check_type(t) for t in types)
    if not checked:
        raise ValidationError("types is empty: leave it out to search every memory type")
    return checked


def check_k(k: object, *, limit: int = C.MAX_K, what: str = "k", low: int = 1) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not low <= k <= limit:
        raise ValidationError(f"{what} must be an integer from {low} to {limit}, not {k!r}")
    return k


def check_number(value: object, *, low: float, high: float, what: str) -> float:
    """A real number from `low` to `high` (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValidationError(f"{what} must be a number from {low:g} to {high:g}, not {value!r}")
    return value


def check_id(doc_id: object) -> str:
    if not isinstance(doc_id, str) or not DOC_ID_PATTERN.fullmatch(doc_id):
        raise ValidationError(f"{doc_id!r} is not a memory id (ids are 20 URL-safe characters, as returned by recall)")
    return doc_id


def check_choice(value: object, choices: Iterable[str], what: str) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValidationError(f"{what} must be one of {', '.join(choices)}, not {value!r}")
    return value


def check_ids(ids: object, *, what: str = "ids") -> list[str]:
    """One id or a list of ids; a bare string is one id, never a list of characters."""
    if isinstance(ids, str):
        return [check_id(ids)]
    if not isinstance(ids, (list, tuple)):
        raise ValidationError(f"{what} must be a memory id or a list of them, not {type(ids).__name__}")
    return [check_id(i) for i in ids]


def check_label(value: object, what: str) -> str | None:
    """An optional keyword such as a session id: None, or one printable line of at most MAX_LABEL_CHARS."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_LABEL_CHARS or not value.isprintable():
        raise ValidationError(f"{what} must be one printable line of 1-{MAX_LABEL_CHARS} characters, "
                              f"not {repr(value)[:80]}")
    return value


def check_steps(steps: object, *, what: str = "steps") -> list[str]:
    """Ordered playbook steps: a list of texts (a bare string would become one step per character)."""
    if not isinstance(steps, (list, tuple)):
        raise ValidationError(f"{what} must be a list of texts, not {type(steps).__name__}")
    return [check_text(step, what=f"each of {what}") for step in steps]


def check_context(context: object) -> str | list[str]:
    """An episode's context: the message it replies to, or the messages it follows, oldest first."""
    if isinstance(context, str):
        return check_text(context, what="context")
    if not isinstance(context, (list, tuple)) or not context:
        raise ValidationError(f"context must be a text or a non-empty list of texts, not {context!r}")
    return [check_text(message, what="each message of context") for message in context]


def check_flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{what} must be True or False, not {value!r}")
    return value


def check_when(value: object, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise ValidationError(f"{what} must be a datetime, not {value!r}")
    return value


def check_valid_time(memory_type: C.MemoryType, valid_from: datetime | None, valid_to: datetime | None, *,
                     now: datetime) -> None:
    """A valid time is a fact's, starts by `now` and ends after it starts (after `now` without a start: a fact
    written now holds from now unless its text names an earlier start, which this check does not read)."""
    if valid_from is None and valid_to is None:
        return
    if memory_type != "semantic":
        raise ValidationError(f"only a fact has a valid time (valid_from, valid_to), not a {memory_type} memory")
    start = as_utc(check_when(valid_from, "valid_from")) if valid_from is not None else None
    end = as_utc(check_when(valid_to, "valid_to")) if valid_to is not None else None
    if start is not None and start > as_utc(now):
        raise ValidationError(f"valid_from {es_date(start)} is after the store's clock ({es_date(now)}): "
                              "write a fact when it holds")
    if end is not None and end <= (start or as_utc(now)):
        raise ValidationError(f"valid_to {es_date(end)} is not after "
                              + (f"valid_from {es_date(start)}" if start else "now: give valid_from too"))
