"""Time expressions in a question become the period whose episodes recall boosts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from atlas.core.clock import mentioned_period

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize("question, start, end", [
    ("Why did the lockout in June 2024 happen?", "2024-06-01", "2024-07-01"),
    ("What did I do when I held the reset button back in March?", "2026-03-01", "2026-04-01"),
    ("what dates was I away in November?", "2026-11-01", "2026-12-01"),
    ("what broke in December?", "2025-12-01", "2026-01-01"),  # the latest December by now
    ("In autumn 2024, what did I find?", "2024-09-01", "2024-12-01"),
    ("which version got installed over the summer?", "2026-06-01", "2026-09-01"),
    ("What did Gina find on 1 February, 2023?", "2023-02-01", "2023-02-02"),
    ("What did she paint on October 13, 2023?", "2023-10-13", "2023-10-14"),
    ("how did I fix it back in 2024?", "2024-01-01", "2025-01-01"),
    ("What did I say yesterday?", "2026-10-31", "2026-11-01"),
    ("what did I ask a couple of days ago?", "2026-10-28", "2026-10-31"),
    ("what did I do about a week ago?", "2026-10-18", "2026-10-29"),
    ("what changed last month?", "2026-10-01", "2026-11-01"),
    ("between June 2025 and August 2025?", "2025-06-01", "2025-09-01"),  # the span of both
])
def test_periods(question: str, start: str, end: str) -> None:
    assert mentioned_period(question, NOW) == (day(start), day(end))


@pytest.mark.parametrize("question", [
    "may I ask about the hub?",          # a verb, not the month
    "march the dog round the block",
    "did the sensor fall off the wall?",
    "what does firmware 2024.1 fix?",    # a version, not a year
    "Where did Caroline move from 4 years ago?",
    "What did Gina find on 31 February, 2023?",
    "what is my hub called?",
])
def test_no_period(question: str) -> None:
    assert mentioned_period(question, NOW) is None


def test_fall_after_a_calendar_word_is_the_season() -> None:
    assert mentioned_period("what broke this fall?", NOW) == (day("2026-09-01"), day("2026-12-01"))


def test_a_capitalised_may_is_a_month() -> None:
    assert mentioned_period("What happened in May?", NOW) == (day("2026-05-01"), day("2026-06-01"))
    assert mentioned_period("What happened in may?", NOW) == (day("2026-05-01"), day("2026-06-01"))
