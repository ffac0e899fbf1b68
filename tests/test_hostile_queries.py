"""One query, or one tenant's episode, must not stall or crash the server (security issue, part 5).

Attack classes: a long query whose time expressions made the parser rescan the text before each
match (work grew with the square of the length); a huge count ("1000000 days ago") that overflowed
the date arithmetic; a query far longer than a question; and one user's data aborting the
consolidation of every user after them. Work is counted (characters scanned or sliced, lines run),
never timed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from atlas import constants as C
from atlas.cli import app
from atlas.consolidation import proposers
from atlas.consolidation.consolidate import consolidate, consolidate_all, failure
from atlas.core import clock
from atlas.core.clock import mentioned_period
from atlas.core.errors import ConflictError, ValidationError
from atlas.core.memory import write_episode
from atlas.core.recall import recall
from atlas.models.embed import TruncationWarning
from atlas.serve.agent import Agent
from atlas.serve.tools import TOOLS, call_tool

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)
#: Texts longer than a query are longer than an embedder reads: their truncation warning is expected.
truncated = pytest.mark.filterwarnings(f"ignore::{TruncationWarning.__module__}.{TruncationWarning.__name__}")


# --- the parser: linear work ---------------------------------------------------------------------


class Work:
    """What one parse did: characters its patterns may scan, characters sliced off the text, lines run."""

    def __init__(self) -> None:
        self.units = 0


class CountedPattern:
    """A compiled pattern of the clock module that counts the characters each scan may read."""

    def __init__(self, pattern: re.Pattern, work: Work) -> None:
        self._pattern, self._work = pattern, work

    def __getattr__(self, name: str):
        return getattr(self._pattern, name)

    def _scan(self, method: str, string: str, pos: int = 0, endpos: int = sys.maxsize):
        self._work.units += max(0, min(endpos, len(string)) - pos)
        return getattr(self._pattern, method)(string, pos, endpos)

    def search(self, *args):
        return self._scan("search", *args)

    def match(self, *args):
        return self._scan("match", *args)

    def fullmatch(self, *args):
        return self._scan("fullmatch", *args)

    def finditer(self, *args):
        return self._scan("finditer", *args)

    def findall(self, *args):
        return self._scan("findall", *args)


def counted_text(text: str, work: Work) -> str:
    class Sliced(str):
        def __getitem__(self, key):
            part = super().__getitem__(key)
            work.units += len(part)
            return part

    return Sliced(text)


@contextmanager
def counting(work: Work, monkeypatch) -> Iterator[None]:
    """Every pattern of the clock module counted, and every line run in it."""
    with monkeypatch.context() as patch:
        for name, value in list(vars(clock).items()):
            if isinstance(value, re.Pattern):
                patch.setattr(clock, name, CountedPattern(value, work))
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, re.Pattern) for v in value):
                patch.setattr(clock, name, type(value)(CountedPattern(v, work) for v in value))

        def lines(frame, event, arg):
            if event == "line":
                work.units += 1
            return lines

        def calls(frame, event, arg):
            return lines if frame.f_code.co_filename == clock.__file__ else None

        previous = sys.gettrace()
        sys.settrace(calls)
        try:
            yield
        finally:
            sys.settrace(previous)


def parse_work(text: str, monkeypatch) -> int:
    work = Work()
    with counting(work, monkeypatch):
        mentioned_period(counted_text(text, work), NOW)
    return work.units


@pytest.mark.parametrize("unit", [
    "may ",            # an ambiguous month: the words before it were searched for "in", "this", ...
    "this fall ",      # an ambiguous season, after a cue
    "today ",          # a match each: each was compared with every match taken before
    "1 June 2024 ",    # a full date each
])
def test_parser_work_grows_linearly_with_the_text(unit, monkeypatch):
    """Twice the text costs at most twice the work (plus a constant): no rescan of the text before a match."""
    small, large = parse_work(unit * 400, monkeypatch), parse_work(unit * 800, monkeypatch)
    assert large <= 2 * small + 100, f"{unit!r}: {small} units for 400 repeats, {large} for 800"


def test_a_long_text_still_gives_its_period():
    assert mentioned_period("may " * 2_400 + "in June 2024", NOW) == (datetime(2024, 6, 1, tzinfo=UTC),
                                                                      datetime(2024, 7, 1, tzinfo=UTC))


# --- the parser: bounded numbers -----------------------------------------------------------------


@pytest.mark.parametrize("question", [
    "what did I say 1000000 days ago?",                 # overflowed timedelta
    "what did I say 99999999999 days ago?",             # too large for a C int
    "what did I say " + "9" * 5_000 + " days ago?",     # past Python's limit on converting digits
])
def test_absurd_counts_name_no_period(question):
    assert mentioned_period(question, NOW) is None


@pytest.mark.parametrize("question, start, end", [
    ("what did I say 99999999999 weeks ago?", None, None),
    ("what did I say 1000000 months ago?", None, None),
    ("what happened in the year 99999999999?", None, None),
    ("what happened in June 99999?", "2026-06-01", "2026-07-01"),   # the month alone: 99999 is no year
    ("what happened on 99 June 2024?", "2024-06-01", "2024-07-01"),  # the month of the year: 99 is no day
])
def test_huge_years_and_days_are_not_read_as_dates(question, start, end):
    expected = None if start is None else (datetime.fromisoformat(start).replace(tzinfo=UTC),
                                           datetime.fromisoformat(end).replace(tzinfo=UTC))
    assert mentioned_period(question, NOW) == expected


def test_counts_are_read_up_to_the_bound():
    today = datetime(2026, 11, 1, tzinfo=UTC)
    start, end = mentioned_period(f"what did I say {C.MAX_DAYS_AGO} days ago?", NOW)
    assert (today - start).days == C.MAX_DAYS_AGO + 2 and (today - end).days == C.MAX_DAYS_AGO - 1
    assert mentioned_period(f"what did I say {C.MAX_DAYS_AGO + 1} days ago?", NOW) is None


def test_an_absurd_count_leaves_the_rest_of_the_question_read():
    assert mentioned_period("yesterday, or 1000000 days ago?", NOW) == (
        datetime(2026, 10, 31, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC))


# --- recall and the MCP tool ---------------------------------------------------------------------


@pytest.fixture
def sarah(store):
    write_episode(store, "sarah", "The porch light flickered all night", session_id="s1")
    return store


def test_recall_survives_a_huge_count(sarah):
    result = recall(sarah, "sarah", "what did I say about the porch light 1000000 days ago?", mode="bm25")
    assert result.period is None and result.hits


def test_recall_refuses_a_query_longer_than_a_question(sarah):
    query = "may " * 2_400  # 9,600 characters: 1.25 s of parsing on the quadratic parser
    with pytest.raises(ValidationError) as info:
        recall(sarah, "sarah", query, mode="bm25")
    assert len(query) > C.MAX_QUERY_CHARS and f"the limit is {C.MAX_QUERY_CHARS}" in str(info.value)
    assert recall(sarah, "sarah", "x " * (C.MAX_QUERY_CHARS // 2), mode="bm25").query


@truncated
def test_an_episode_may_be_far_longer_than_a_query(sarah):
    text = "The porch light flickered again. " * (3 * C.MAX_QUERY_CHARS // 33)
    assert len(text) > C.MAX_QUERY_CHARS
    write_episode(sarah, "sarah", text, session_id="s2")


def test_the_recall_tool_answers_hostile_queries_with_results_not_exceptions(sarah):
    counted = call_tool(sarah, "sarah", "recall_memory", {"query": "the porch light 1000000 days ago"})
    assert not counted.is_error and "period" not in counted.payload and counted.payload["memories"]
    long = call_tool(sarah, "sarah", "recall_memory", {"query": "may " * 2_400})
    assert long.is_error and long.payload["error"] == "ValidationError"
    assert str(C.MAX_QUERY_CHARS) in long.payload["message"]
    assert TOOLS["recall_memory"].input_schema["properties"]["query"]["maxLength"] == C.MAX_QUERY_CHARS


@truncated
def test_a_long_message_to_the_agent_is_recalled_on_its_head(sarah):
    """A turn stores the whole message and recalls on its first MAX_QUERY_CHARS characters."""
    message = "the porch light " * (C.MAX_QUERY_CHARS // 8)
    offline = replace(sarah.settings, llm_base_url=None, llm_api_key=None, llm_model=None)
    result = Agent(sarah, "sarah", settings=offline).turn(message)
    assert len(result.pre_recall.query) <= C.MAX_QUERY_CHARS and message.startswith(result.pre_recall.query)
    assert result.pre_recall.hits


# --- consolidation: one user's data never stops another's -------------------------------------------


def test_an_episode_with_a_huge_count_does_not_stop_the_run(store):
    """The rule proposer makes a fact of it, whose duplicate check recalls on it (and parses its time)."""
    write_episode(store, "eve", "I moved into this flat 1000000 days ago.", session_id="e1")
    write_episode(store, "tom", "I have a Lumio Hub v3 in the hallway.", session_id="t1")
    reports = consolidate_all(store, progress=False)
    assert {user: report.status for user, report in reports.items()} == {"eve": "applied", "tom": "applied"}


@truncated
def test_a_fact_longer_than_a_query_is_still_checked_for_duplicates(store):
    write_episode(store, "tom", "I have " + "a very long hallway and " * (C.MAX_QUERY_CHARS // 20) + "a hub.",
                  session_id="t1")
    assert consolidate(store, "tom").status == "applied"


class Failing:
    """A proposer that fails on one user's batch, as a bug or bad data would."""

    name = "failing"

    def propose(self, batch):
        if batch.user_id == "eve":
            raise RuntimeError("eve's batch broke the proposer")
        return proposers.RuleProposer().propose(batch)


def test_a_failed_user_is_reported_and_the_others_are_consolidated(store):
    write_episode(store, "eve", "I keep my hub in the attic.", session_id="e1")
    write_episode(store, "tom", "I have a Lumio Hub v3 in the hallway.", session_id="t1")
    reports = consolidate_all(store, proposer=Failing(), progress=False)
    assert reports["tom"].status == "applied" and reports["tom"].accepted
    assert reports["eve"].status == "failed"
    assert reports["eve"].error == "RuntimeError: eve's batch broke the proposer"


def test_the_cli_prints_a_failed_user_and_exits_non_zero(store, monkeypatch):
    write_episode(store, "eve", "I keep my hub in the attic.", session_id="e1")
    write_episode(store, "tom", "I have a Lumio Hub v3 in the hallway.", session_id="t1")
    monkeypatch.setitem(proposers.PROPOSERS, "rule", Failing)
    result = CliRunner().invoke(app, ["consolidate", "--all", "--prefix", store.prefix])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert "eve: failed (RuntimeError: eve's batch broke the proposer)" in result.output
    assert "tom: applied" in result.output


def test_a_failure_is_reported_on_one_line_with_its_notes():
    refused = ConflictError("a step was refused")
    refused.add_note("consolidation of eve was rolled back: nothing of this run was kept")
    assert failure(refused) == ("ConflictError: a step was refused; consolidation of eve was rolled back: nothing of "
                                "this run was kept")
