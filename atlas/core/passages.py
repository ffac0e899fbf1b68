"""What of a turn is searched and embedded: its context window, its passage, a speaker's sentences.

Pure functions over text, shared by the writers, the data-set loaders (which have no cluster
of their own), the agent and consolidation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from atlas import constants as C

#: Where a sentence ends: ., ! or ? before white space.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

Message = TypeVar("Message")


def context_before(messages: Sequence[Message], i: int) -> list[Message]:
    """The context of a session's i-th message: the `CONTEXT_MESSAGES` messages before it, oldest first."""
    return list(messages[max(0, i - C.CONTEXT_MESSAGES):i])


def passage_text(doc: dict) -> str:
    """What is embedded: the text, after the message it replies to when there is one (a bare "yes,
    that one" means nothing alone). Earlier messages of the context are searched by BM25 only."""
    context = doc.get("context")
    if not context:
        return doc["text"]
    return f"{context if isinstance(context, str) else context[-1]}\n{doc['text']}"


def passage_sentences(doc: dict) -> list[str]:
    """A speaker's several sentences, each headed by the speaker ("Maria: ...") and embedded alone.

    Only for documents that name a speaker (a multi-party transcript such as LoCoMo): in a long turn
    the speaker's name and one thing said sit together in a vector of their own, and the kNN path
    takes a passage's best vector. Plain sentences, without the name, gained nothing
    (docs/evaluation.md, "Sentence vectors for a speaker's turns").
    """
    if not doc.get("speaker"):
        return []
    header = f"{doc['speaker']}: "
    sentences = [s for s in SENTENCE_END.split(doc["text"].removeprefix(header))
                 if len(s.split()) >= C.SENTENCE_MIN_WORDS]
    return [header + s for s in sentences] if len(sentences) > 1 else []
