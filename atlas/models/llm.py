"""The OpenAI-compatible endpoint: a client from the settings, and one chat request retried with backoff.

Used by the agent loop and the LLM consolidation proposer. Timeouts, connection errors,
rate limits, server errors and unusable output are retried with exponential backoff;
after the last attempt (or at once, for a refusal that retrying cannot fix) the caller
gets an `LLMError` that says what to check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import openai
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionMessage, ChatCompletionMessageParam

from atlas import constants as C
from atlas.config import Settings
from atlas.core.errors import AtlasError


class LLMError(AtlasError):
    """The configured OpenAI-compatible endpoint failed or returned something unusable."""


T = TypeVar("T")
#: The names of a vocabulary (`bullets`): any string type, such as a `Literal` of `atlas.constants`.
Name = TypeVar("Name", bound=str)

#: Failures that may pass if the same request is sent again later (timeouts are connection errors).
TRANSIENT = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError,
             openai.APIResponseValidationError)


def llm_configured(settings: Settings) -> bool:
    """A model name and somewhere to send it (a base URL, or an OpenAI key for the default endpoint)."""
    return bool(settings.llm_model and (settings.llm_base_url or settings.llm_api_key))


def not_configured_message() -> str:
    return ("no language model is configured: OPENAI_BASE_URL or OPENAI_API_KEY names an endpoint but ATLAS_LLM_MODEL "
            "names no model; set it, or unset both to use the local server (`atlas llm up`)")


def llm_client(settings: Settings, *, timeout: float = C.LLM_TIMEOUT) -> OpenAI | None:
    """A client on the configured endpoint, or None when none is configured. Retries are ours (`complete`)."""
    if not llm_configured(settings):
        return None
    return OpenAI(base_url=settings.llm_base_url, api_key=settings.llm_api_key or "unused", timeout=timeout,
                  max_retries=0)


def first_message(completion: ChatCompletion) -> ChatCompletionMessage:
    """The first choice's message; an empty answer is unusable output (retried)."""
    if not completion.choices:
        raise LLMError("the endpoint answered without any choice")
    return completion.choices[0].message


def rejected(exc: openai.APIStatusError) -> bool:
    """A server error that is a verdict on the request, not a passing fault: llama.cpp's server answers a message it
    cannot validate with a 500 that lists the validation errors."""
    return exc.status_code == 500 and "validation error" in str(exc).lower()


def complete(client: OpenAI, *, model: str, messages: Sequence[ChatCompletionMessageParam],
             parse: Callable[[ChatCompletion], T], attempts: int = C.LLM_ATTEMPTS, backoff: float = C.LLM_BACKOFF,
             sleep: Callable[[float], None] | None = None, **options: Any) -> T:
    """One chat completion passed through `parse`, which raises `LLMError` on output it cannot use.

    `sleep` waits between attempts (`time.sleep` unless given; tests pass a recorder).
    """
    last = ""
    for attempt in range(attempts):
        if attempt:
            (sleep or time.sleep)(backoff * 2 ** (attempt - 1))
        try:
            return parse(client.chat.completions.create(model=model, messages=list(messages), **options))
        except openai.APIStatusError as exc:
            if isinstance(exc, TRANSIENT) and not rejected(exc):
                last = f"{type(exc).__name__}: {exc}"
                continue
            raise LLMError(f"the model endpoint refused the request ({exc.status_code}: {exc.message}): sending it "
                           "again would not help; check ATLAS_LLM_MODEL, OPENAI_BASE_URL and OPENAI_API_KEY, or what "
                           "the server says it cannot accept") from None
        except TRANSIENT as exc:
            last = f"{type(exc).__name__}: {exc}"
        except LLMError as exc:
            last = f"unusable output: {exc}"
    raise LLMError(f"the model endpoint failed {attempts} times (last: {last}): check that it is up (the local one "
                   "starts with `atlas llm up`), or retry later")


def bullets(meanings: Mapping[Name, str], *, indent: str = "") -> str:
    """A vocabulary and its meanings as a bullet list (descriptions and prompts)."""
    return "\n".join(f"{indent}- {name}: {meaning}" for name, meaning in meanings.items())


def json_format(settings: Settings, name: str, schema: dict) -> dict:
    """The `response_format` that asks the endpoint for JSON matching `schema`, in the form it understands
    (`Settings.llm_json`): OpenAI's `json_schema`, or llama.cpp's `json_object` with the schema, which its server
    turns into a grammar that the model's sampling cannot leave."""
    if settings.llm_json == "llama.cpp":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
