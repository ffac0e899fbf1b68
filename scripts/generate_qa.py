"""Write persona evaluation questions with a language model, in the schema of data/persona/qa.jsonl.

    OPENAI_BASE_URL=http://localhost:8000/v1 ATLAS_LLM_MODEL=my-model \
        python scripts/generate_qa.py --out data/persona/qa.llm.jsonl --per-doc 2

The committed data/persona/qa.jsonl is hand-authored (data/persona/README.md) and this
script never overwrites it by default. Each current document of the corpus (superseded
facts are never answers) gets `--per-doc` questions, asked by its owner, or for a catalog
item by a user chosen with `random.Random(--seed)`. Every line records
`provenance: "llm:<model>"`. Replies are cached under `.cache/qa/`, keyed by model and
prompt, so a rerun asks the model only for what is new. Without a configured model the
script says how to configure one and exits with status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from openai import OpenAI
from openai.types.chat import ChatCompletion

from atlas.config import load_settings
from atlas.models.llm import LLMError, complete, first_message, llm_client, not_configured_message
from atlas.research.datasets import PERSONA_DIR, QUESTION_KINDS, read_persona_corpus

SYSTEM = (
    "You write evaluation questions for the long-term memory of a smart-home support assistant. "
    "A question is asked by the user named below, in their own voice, and must be answered by the given document "
    "alone. Paraphrase: do not copy the document's wording, except for the literal token an exact-token question "
    f"hinges on. Label each question with one kind of: {', '.join(QUESTION_KINDS)}. "
    'Reply with JSON only: {"questions": [{"question": "...", "kind": "..."}]}.'
)


def answerable(corpus: Sequence[dict]) -> list[dict]:
    """Documents that may be answers: every document no other one supersedes."""
    retired = {key for doc in corpus for key in doc.get("supersedes_keys", [])}
    return [doc for doc in corpus if doc["key"] not in retired]


def asker(doc: dict, users: Sequence[str], rng: random.Random) -> str:
    """The owner of a memory; anyone may ask about a catalog item."""
    return doc.get("user_id") or rng.choice(users)


def build_messages(doc: dict, user: str, count: int) -> list[dict]:
    fields = {k: v for k, v in doc.items() if k in ("memory_type", "text", "timestamp", "created_at", "title")}
    prompt = (f"User: {user}. The corpus's 'now' is 2026-11-01; relative time words are relative to it.\n"
              f"Write {count} different questions answered by this document:\n{json.dumps(fields, ensure_ascii=False)}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def parse_reply(completion: ChatCompletion) -> list[dict]:
    """The questions of a reply; anything else is unusable output (`complete` retries it)."""
    content = first_message(completion).content or ""
    try:
        items = json.loads(content[content.find("{"):content.rfind("}") + 1])["questions"]
        questions = [{"question": str(i["question"]).strip(), "kind": str(i["kind"]).strip()} for i in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise LLMError(f"not the JSON asked for ({exc}): {content[:200]!r}") from None
    bad = [q for q in questions if not q["question"] or q["kind"] not in QUESTION_KINDS]
    if bad:
        raise LLMError(f"empty question or unknown kind in {bad[:2]}")
    return questions


def cached_questions(client: OpenAI, model: str, messages: list[dict], cache_dir: Path) -> list[dict]:
    """The model's questions for one prompt, from the cache when this model already answered it."""
    key = hashlib.sha256(json.dumps([model, messages], sort_keys=True).encode("utf-8")).hexdigest()
    path = cache_dir / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    questions = complete(client, model=model, messages=messages, parse=parse_reply, temperature=0)
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    return questions


def generate(client: OpenAI, model: str, corpus: Sequence[dict], *, per_doc: int, seed: int, limit: int | None,
             cache_dir: Path) -> list[dict]:
    """qa.jsonl lines, qids `g-0001`..., without duplicate questions and without copies of the document."""
    rng = random.Random(seed)
    users = sorted({doc["user_id"] for doc in corpus if doc.get("user_id")})
    docs = answerable(corpus)[:limit]
    lines: list[dict] = []
    seen: set[str] = set()
    for doc in docs:
        user = asker(doc, users, rng)
        for item in cached_questions(client, model, build_messages(doc, user, per_doc), cache_dir):
            text = item["question"]
            if text.lower() in seen or text.lower() in doc["text"].lower():
                continue
            seen.add(text.lower())
            lines.append({"qid": f"g-{len(lines) + 1:04d}", "user_id": user, "question": text,
                          "answer_keys": [doc["key"]], "memory_type": doc["memory_type"], "kind": item["kind"],
                          "provenance": f"llm:{model}"})
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    settings = load_settings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=PERSONA_DIR, help="folder holding corpus.jsonl")
    parser.add_argument("--out", type=Path, default=PERSONA_DIR / "qa.llm.jsonl", help="where to write the questions")
    parser.add_argument("--per-doc", type=int, default=2, help="questions asked of each answer document")
    parser.add_argument("--limit", type=int, default=None, help="only the first N answer documents (a trial run)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the asking user of catalog items")
    args = parser.parse_args(argv)
    client = llm_client(settings)
    if client is None or not settings.llm_model:
        print(f"generate_qa: {not_configured_message()}. The committed data/persona/qa.jsonl is hand-authored "
              "and needs no model.", file=sys.stderr)
        return 2
    if args.out.resolve() == (PERSONA_DIR / "qa.jsonl").resolve():
        print("generate_qa: refusing to overwrite the hand-authored data/persona/qa.jsonl; choose another --out",
              file=sys.stderr)
        return 2
    try:
        lines = generate(client, settings.llm_model, read_persona_corpus(args.corpus), per_doc=args.per_doc,
                         seed=args.seed, limit=args.limit, cache_dir=settings.cache_dir / "qa")
    except LLMError as exc:
        print(f"generate_qa: {exc}", file=sys.stderr)
        return 1
    args.out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"wrote {len(lines)} questions to {args.out} (provenance llm:{settings.llm_model})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
