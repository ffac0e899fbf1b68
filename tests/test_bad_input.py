"""Bad input, through the Python API and the command line: always an `AtlasError` that says what is wrong,
never another exception, and nothing written (issue 8).

Hypothesis draws texts, queries, user ids and document ids; runs are derandomised and kept small
(the suite's time matters). Every accepted write is read back and must be stored verbatim.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from functools import partial

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from atlas import constants as C
from atlas.cli import app
from atlas.core.errors import AtlasError, NotFound, ValidationError
from atlas.core.memory import forget_memory, record_outcome, write_episode, write_memory
from atlas.core.recall import Tuning, recall
from atlas.core.store import Store
from atlas.core.supersession import archive, history
from atlas.core.validation import DOC_ID_PATTERN, USER_ID_PATTERN
from atlas.models.embed import TruncationWarning
from atlas.stack import open_store
from tests.conftest import NOW

EXAMPLES = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
USER_IDS = st.one_of(st.text(max_size=70), st.from_regex(USER_ID_PATTERN, fullmatch=True))
DOC_IDS = st.one_of(st.text(max_size=70), st.from_regex(DOC_ID_PATTERN, fullmatch=True))
#: Stored verbatim and recalled without error: terminal escapes, bidi overrides, BOM, separators, emoji.
ODD_BUT_VALID = ["bell \x07 ring", "ansi \x1b[31mred\x1b[0m", "rtl \u202egnp.exe", "\ufeffbom first",
                 "crlf\r\nline", "tab\tseparated", "line\u2028separator", "zero\u200bwidth", "emoji 🧯🏠",
                 "combining e\u0301", "del \x7f char", "tags <script>alert(1)</script> and {\"json\": true}"]
INVALID_TEXTS = ["", "   \t\n ", "nul \x00 inside", "lone \ud800 surrogate"]


def docs_in(store: Store) -> int:
    store.es.indices.refresh(index=store.indices)
    return store.es.count(index=store.indices)["count"]


def refused(store: Store, call: Callable[[], object], error: type[AtlasError] = AtlasError) -> AtlasError:
    """`call` raises `error` with a one-line message, and the prefix holds as many documents as before."""
    before = docs_in(store)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert message.strip() and "\n" not in message and "Traceback" not in message
    assert docs_in(store) == before
    return info.value


def valid_text(text: str) -> bool:
    return bool(text.strip()) and "\x00" not in text


@pytest.fixture
def store(module_store: Store) -> Store:
    """One prefix for the whole module (creating five indices per test would dominate its time):
    every check counts the documents right before and after its own call."""
    return module_store


@pytest.fixture(scope="module")
def seeded(module_store: Store) -> dict[str, str]:
    """One fact, episode and playbook each for sarah and tom."""
    return {f"{user}_{kind}": write(user) for user in ("sarah", "tom") for kind, write in {
        "fact": lambda u: write_memory(module_store, u, f"{u} likes warm white light", "semantic"),
        "episode": lambda u: write_episode(module_store, u, f"{u} says the hub blinks red", session_id="s1"),
        "playbook": lambda u: write_memory(module_store, u, f"{u}'s hub reset", "procedural", steps=["unplug", "wait"]),
    }.items()}


# --- hypothesis: strings ----------------------------------------------------------------------


@EXAMPLES
@given(text=st.text(max_size=300))
def test_any_text_is_stored_verbatim_or_refused(store, text):
    if not valid_text(text):
        refused(store, lambda: write_memory(store, "sarah", text, "semantic"), ValidationError)
        return
    before = docs_in(store)
    doc_id = write_memory(store, "sarah", text, "semantic")
    assert docs_in(store) == before + 1
    assert store.es.get(index=f"{store.prefix}-semantic", id=doc_id)["_source"]["text"] == text


@EXAMPLES
@given(query=st.text(max_size=200), mode=st.sampled_from(C.RECALL_MODES))
def test_any_query_recalls_or_is_refused(store, seeded, query, mode):
    if not valid_text(query):
        refused(store, lambda: recall(store, "sarah", query, mode=mode), ValidationError)
        return
    before = docs_in(store)
    result = recall(store, "sarah", query, mode=mode)
    assert all(hit.user_id in ("sarah", None) for hit in result.hits)
    assert docs_in(store) == before


@EXAMPLES
@given(user=USER_IDS)
def test_any_user_id_is_used_or_refused(store, user):
    if not USER_ID_PATTERN.fullmatch(user):
        refused(store, lambda: write_episode(store, user, "the porch light is on"), ValidationError)
        refused(store, lambda: recall(store, user, "porch light", mode="bm25"), ValidationError)
        return
    doc_id = write_episode(store, user, "the porch light is on")
    assert store.es.get(index=f"{store.prefix}-episodic", id=doc_id)["_source"]["user_id"] == user
    assert doc_id in recall(store, user, "porch light", mode="bm25").ids()


@EXAMPLES
@given(doc_id=DOC_IDS)
def test_any_unknown_id_is_not_found_or_refused(store, seeded, doc_id):
    expected = NotFound if DOC_ID_PATTERN.fullmatch(doc_id) else ValidationError
    for call in (lambda: forget_memory(store, "sarah", doc_id), lambda: history(store, "sarah", doc_id),
                 lambda: record_outcome(store, "sarah", doc_id, True),
                 lambda: write_memory(store, "sarah", "a new fact", supersedes_id=doc_id),
                 lambda: write_memory(store, "sarah", "a new fact", supporting_episode_ids=[doc_id])):
        refused(store, call, expected)


# --- other tenants, unknown ids --------------------------------------------------------------


def test_other_tenants_ids_look_exactly_like_unknown_ones(store, seeded):
    theirs = {key: store.es.get(index=f"{store.prefix}-{index}", id=seeded[key])["_source"]
              for key, index in (("tom_fact", "semantic"), ("tom_episode", "episodic"), ("tom_playbook", "procedural"))}
    for key in theirs:
        doc_id = seeded[key]
        for call in (partial(forget_memory, store, "sarah", doc_id), partial(history, store, "sarah", doc_id),
                     partial(record_outcome, store, "sarah", doc_id, False),
                     partial(write_memory, store, "sarah", "Sarah moved", supersedes_id=doc_id),
                     partial(write_memory, store, "sarah", "Sarah moved", supporting_episode_ids=[doc_id])):
            error = refused(store, call, NotFound)
            assert str(error) == f"no memory {doc_id} belongs to user sarah"
    for key, index in (("tom_fact", "semantic"), ("tom_episode", "episodic"), ("tom_playbook", "procedural")):
        assert store.es.get(index=f"{store.prefix}-{index}", id=seeded[key])["_source"] == theirs[key]


def test_a_supersession_with_one_foreign_id_retires_nothing(store, seeded):
    refused(store, lambda: write_memory(store, "sarah", "Sarah prefers daylight bulbs",
                                        supersedes_id=[seeded["sarah_fact"], seeded["tom_fact"]]), NotFound)
    assert "superseded_by" not in store.es.get(index=f"{store.prefix}-semantic", id=seeded["sarah_fact"])["_source"]


# --- wrong types, sizes, characters --------------------------------------------------------------

WRONG_TYPES: dict[str, Callable[[Store, dict], object]] = {
    "user id int": lambda s, ids: write_episode(s, 123, "x"),
    "user id trailing newline": lambda s, ids: write_episode(s, "sarah\n", "x"),
    "text bytes": lambda s, ids: write_episode(s, "sarah", b"bytes"),
    "text list": lambda s, ids: write_memory(s, "sarah", ["a", "b"]),
    "session id dict": lambda s, ids: write_episode(s, "sarah", "x", session_id={"a": 1}),
    "session id multi-line": lambda s, ids: write_episode(s, "sarah", "x", session_id="s1\ns2"),
    "session id huge": lambda s, ids: write_episode(s, "sarah", "x", session_id="s" * 40_000),
    "ts string": lambda s, ids: write_episode(s, "sarah", "x", ts="yesterday"),
    "memory type list": lambda s, ids: write_memory(s, "sarah", "x", ["semantic"]),
    "catalog by a user": lambda s, ids: write_memory(s, "sarah", "x", "catalog"),
    "supersedes int": lambda s, ids: write_memory(s, "sarah", "x", supersedes_id=5),
    "supersedes empty": lambda s, ids: write_memory(s, "sarah", "x", supersedes_id=[]),
    "supporting ids int": lambda s, ids: write_memory(s, "sarah", "x", supporting_episode_ids=5),
    "fact type list": lambda s, ids: write_memory(s, "sarah", "x", fact_type=["device"]),
    "confidence string": lambda s, ids: write_memory(s, "sarah", "x", confidence="1"),
    "confidence nan": lambda s, ids: write_memory(s, "sarah", "x", confidence=float("nan")),
    "confidence bool": lambda s, ids: write_memory(s, "sarah", "x", confidence=True),
    "name dict": lambda s, ids: write_memory(s, "sarah", "x", "procedural", steps=["a"], name={"a": 1}),
    "trigger int": lambda s, ids: write_memory(s, "sarah", "x", "procedural", steps=["a"], trigger=5),
    "steps string": lambda s, ids: write_memory(s, "sarah", "x", "procedural", steps="unplug it"),
    "steps dicts": lambda s, ids: write_memory(s, "sarah", "x", "procedural", steps=[{"a": 1}]),
    "forget None": lambda s, ids: forget_memory(s, "sarah", None),
    "outcome success string": lambda s, ids: record_outcome(s, "sarah", ids["sarah_playbook"], "yes"),
    "outcome steps string": lambda s, ids: record_outcome(s, "sarah", ids["sarah_playbook"], True, refined_steps="x"),
    "recall k float": lambda s, ids: recall(s, "sarah", "hub", k=2.0),
    "recall k string": lambda s, ids: recall(s, "sarah", "hub", k="3"),
    "recall types int": lambda s, ids: recall(s, "sarah", "hub", types=5),
    "recall types None item": lambda s, ids: recall(s, "sarah", "hub", types=[None]),
    "recall mode None": lambda s, ids: recall(s, "sarah", "hub", mode=None),
    "recall window 0": lambda s, ids: recall(s, "sarah", "hub", tuning=Tuning(window=0)),
    "recall pool string": lambda s, ids: recall(s, "sarah", "hub", tuning=Tuning(pool="all")),  # type: ignore[arg-type]
    "recall routed string": lambda s, ids: recall(s, "sarah", "hub", tuning=Tuning(routed="yes")),  # type: ignore[arg-type]
    "recall include_superseded string": lambda s, ids: recall(s, "sarah", "hub", include_superseded="no"),
    "archive duration word": lambda s, ids: archive(s, older_than="soon", now=NOW, progress=False),
    "archive duration int": lambda s, ids: archive(s, older_than=90, now=NOW, progress=False),
    "open_store prefix int": lambda s, ids: open_store(5, es=s.es),
    "open_store prefix upper": lambda s, ids: open_store("Bad Prefix", es=s.es),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_wrong_types_are_validation_errors(store, seeded, case):
    refused(store, lambda: WRONG_TYPES[case](store, seeded), ValidationError)


@pytest.mark.parametrize("what", ["write_episode", "write_memory", "recall"])
def test_text_over_the_limit_is_refused(store, what):
    huge = "x" * (C.MAX_TEXT_CHARS + 1)
    call = {"write_episode": lambda: write_episode(store, "sarah", huge),
            "write_memory": lambda: write_memory(store, "sarah", huge),
            "recall": lambda: recall(store, "sarah", huge)}[what]
    limit = C.MAX_QUERY_CHARS if what == "recall" else C.MAX_TEXT_CHARS  # a query is far shorter than a memory
    assert f"the limit is {limit}" in str(refused(store, call, ValidationError))


def test_a_100kb_message_is_embedded_truncated_and_stored_whole(store):
    words = [f"hub{uuid.uuid4().hex[:6]}" for _ in range(10)]  # new text: the embedding cache cannot answer it
    text = (" ".join(words) + " ") * (100_000 // (len(" ".join(words)) + 1))
    text = text.ljust(100_000, "x")
    before = docs_in(store)
    with pytest.warns(TruncationWarning, match="longer than"):
        doc_id = write_episode(store, "sarah", text, session_id="long")
    assert docs_in(store) == before + 1
    assert store.es.get(index=f"{store.prefix}-episodic", id=doc_id)["_source"]["text"] == text
    assert doc_id in recall(store, "sarah", words[0], mode="bm25").ids()


@pytest.mark.parametrize("text", ODD_BUT_VALID)
def test_control_and_odd_characters_are_stored_verbatim(store, text):
    doc_id = write_episode(store, "sarah", text)
    assert store.es.get(index=f"{store.prefix}-episodic", id=doc_id)["_source"]["text"] == text
    hits = {hit.id: hit for hit in recall(store, "sarah", text, mode="hybrid").hits}
    assert doc_id in hits and hits[doc_id].text == text, "the text as its own query finds it, verbatim"


@pytest.mark.parametrize("text", INVALID_TEXTS)
def test_invalid_texts_are_refused_everywhere(store, seeded, text):
    for call in (lambda: write_episode(store, "sarah", text), lambda: write_memory(store, "sarah", text),
                 lambda: recall(store, "sarah", text),
                 lambda: write_memory(store, "sarah", text, supersedes_id=seeded["sarah_fact"])):
        refused(store, call, ValidationError)


# --- the command line ---------------------------------------------------------------------------

runner = CliRunner()


def no_traceback(result) -> None:
    """A CLI failure is an exit code and a message, never an uncaught exception."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


def test_every_command_rejects_an_unknown_option():
    """Parsing fails before any command runs (so `es down` is never executed here)."""
    command = typer.main.get_command(app)
    paths = [[name] for name in command.commands]
    paths += [[group, name] for group, sub in command.commands.items() for name in getattr(sub, "commands", {})]
    for path in paths:
        result = runner.invoke(app, [*path, "--no-such-option-xyz"])
        no_traceback(result)
        assert result.exit_code == 2 and "No such option" in result.output, path
    assert runner.invoke(app, ["no-such-command"]).exit_code == 2


@pytest.mark.parametrize("args, message", [
    (["bench", "--scale", "abc"], "Invalid value"),
    (["bench", "--scale", "5"], "error: scales must be"),
    (["bench", "--prefix", "Bad Prefix"], "error: index prefix"),
    (["bench", "--plan", "billion"], "error: --plan must be one of smoke, quick, full, million"),
    # archive connects before it checks the prefix: marked `cluster`
    pytest.param(["archive", "--prefix", "Bad Prefix"], "error: index prefix", marks=pytest.mark.cluster),
])
def test_cli_bad_values_fail_with_a_message(args, message):
    result = runner.invoke(app, args)
    no_traceback(result)
    assert result.exit_code in (1, 2) and message in result.output


def test_cli_bad_values_on_an_existing_prefix_write_nothing(store, seeded):
    for args, message in ((["archive", "--older-than", "soon"], "durations are given in days"),
                          (["repair", "--user", "Not A User"], "user id 'Not A User' is invalid")):
        before = docs_in(store)
        result = runner.invoke(app, [*args, "--prefix", store.prefix])
        no_traceback(result)
        assert result.exit_code == 1 and f"error: {message}" in result.output
        assert docs_in(store) == before


@EXAMPLES
@given(user=USER_IDS)
def test_cli_repair_any_user(store, user):
    result = runner.invoke(app, ["repair", "--user", user, "--prefix", store.prefix])
    no_traceback(result)
    assert result.exit_code == (0 if USER_ID_PATTERN.fullmatch(user) else 1), result.output


def test_cli_user_keys_refuse_bad_user_ids(store):
    groups = typer.main.get_command(app).commands
    if "users" not in groups:
        pytest.skip("no `atlas users` commands in this checkout")
    for command in ("create", "rotate", "revoke"):
        result = runner.invoke(app, ["users", command, "Not A User", "--prefix", store.prefix])
        no_traceback(result)
        assert result.exit_code == 1 and "error:" in result.output, (command, result.output)


def test_naive_and_aware_datetimes_are_both_accepted(store):
    doc_id = write_episode(store, "sarah", "a dated turn", ts=datetime(2026, 1, 2, 3, 4))
    stored = store.es.get(index=f"{store.prefix}-episodic", id=doc_id)["_source"]
    assert stored["timestamp"] == "2026-01-02T03:04:00.000Z"
