"""Time as Atlas stores it: aware UTC datetimes in, ISO 8601 `...Z` strings with milliseconds out.

Anything a test or notebook measures takes `now=` explicitly; only the default path
reads the wall clock, here.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta

from atlas import constants as C


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC (the corpus and LoCoMo timestamps are)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def es_date(moment: datetime) -> str:
    """2026-11-01T12:00:00.000Z"""
    return as_utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_date(text: str) -> datetime:
    """The inverse of `es_date`; also accepts plain ISO 8601 with or without a zone."""
    return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


# --- time expressions in a question ------------------------------------------------------------

#: A [start, end) span of time.
Period = tuple[datetime, datetime]

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
#: Northern-hemisphere seasons, three months each: their first month (1-12).
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_MONTH = r"(?P<month>" + "|".join(_MONTHS) + r"|sept?|jan|feb|mar|apr|jun|jul|aug|oct|nov|dec)\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)(?![.\d])"
_PATTERNS = [
    re.compile(rf"\b{_DAY}\s+{_MONTH},?\s+{_YEAR}", re.I),
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}", re.I),
    re.compile(rf"\b{_MONTH}\s+{_YEAR}", re.I),
    re.compile(rf"\b(?P<season>spring|summer|autumn|fall|winter)\s+(?:of\s+)?{_YEAR}", re.I),
    re.compile(rf"\b{_MONTH}\b", re.I),
    re.compile(r"\b(?P<season>spring|summer|autumn|fall|winter)\b", re.I),
    re.compile(rf"\b(?:in|of|since|during|from|back in)\s+{_YEAR}", re.I),
    re.compile(r"\b(?P<relative>yesterday|today|last week|a week ago|last month|(?:a couple of|a few|\d+) days ago)\b",
               re.I),
]
#: Calendar names that are also common words: counted only when capitalised or after a word such as "in"
#: ("May", "in march", "this fall"; not "may I", "did it fall off").
_AMBIGUOUS = {"may", "march", "mar", "jan", "dec", "oct", "nov", "aug", "fall"}
#: A cue and the spaces after it: a calendar name starting where one ends is meant as a date.
_CALENDAR_CUE = re.compile(r"\b(in|since|during|until|early|late|mid|last|this|the)\s+", re.I)
_COUNT_WORDS = {"a couple of": 2, "a few": 3}


def _cue_ends(text: str) -> set[int]:
    """Where the text's calendar cues end, found in one scan: searching the words before each match instead
    made the parser's work grow with the square of the text's length."""
    return {match.end() for match in _CALENDAR_CUE.finditer(text)}


def _meant_as_date(word: str, *, cued: bool) -> bool:
    return word.lower().rstrip(".") not in _AMBIGUOUS or not word.islower() or cued


def _month_start(year: int, month: int) -> datetime:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return datetime(year, month, 1, tzinfo=UTC)


def _months(start: datetime, count: int) -> Period:
    """`count` calendar months from `start` (a month's first day)."""
    return start, _month_start(start.year, start.month + count)


def _month_number(name: str) -> int:
    return next(i for i, full in enumerate(_MONTHS, start=1) if full.startswith(name.lower().rstrip(".")[:3]))


def _latest(first_month: int, months: int, now: datetime) -> Period:
    """The latest span of `months` months starting in `first_month` that has begun by `now`."""
    start = _month_start(now.year, first_month)
    return _months(start if start <= now else _month_start(now.year - 1, first_month), months)


def _days(count: str, *, limit: int = C.MAX_DAYS_AGO) -> int | None:
    """The N of "N days ago", or None past `limit` (judged by its digits first: there may be thousands)."""
    if count in _COUNT_WORDS:
        return _COUNT_WORDS[count]
    digits = count.lstrip("0") or "0"
    if len(digits) > len(str(limit)):
        return None
    days = int(digits)
    return days if days <= limit else None


def _relative(phrase: str, now: datetime) -> Period | None:
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    phrase = phrase.lower()
    if phrase == "today":
        return today, today + timedelta(days=1)
    if phrase == "yesterday":
        return today - timedelta(days=1), today
    if phrase in ("last week", "a week ago"):
        return today - timedelta(days=14), today - timedelta(days=3)
    if phrase == "last month":
        return _months(_month_start(today.year, today.month - 1), 1)
    n = _days(phrase.removesuffix(" days ago"))
    if n is None:  # an absurd count names no period (a million days overflows the date arithmetic)
        return None
    return today - timedelta(days=n + 2), today - timedelta(days=max(n - 1, 0))


def _period(match: re.Match, now: datetime, *, cued: bool) -> Period | None:
    """The period of one match; `cued` says whether a calendar cue ("in", "this", ...) comes right before it."""
    found = match.groupdict()
    if found.get("relative"):
        return _relative(found["relative"], now)
    year = int(found["year"]) if found.get("year") else None
    if found.get("season"):
        first = _SEASONS[found["season"].lower()]
        if year is None:
            return _latest(first, 3, now) if _meant_as_date(found["season"], cued=cued) else None
        return _months(_month_start(year, first), 3)
    if found.get("month"):
        if year is None and not _meant_as_date(found["month"], cued=cued):
            return None
        month = _month_number(found["month"])
        if year is None:
            return _latest(month, 1, now)
        if found.get("day"):
            number = int(found["day"])
            if not 1 <= number <= calendar.monthrange(year, month)[1]:
                return None
            day = datetime(year, month, number, tzinfo=UTC)
            return day, day + timedelta(days=1)
        return _months(_month_start(year, month), 1)
    if year is None:  # every pattern names a relative day, a season, a month or a year
        return None
    return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)


def mentioned_period(text: str, now: datetime) -> Period | None:
    """The span of time a question names ("in June 2024", "last week", "this spring"), or None.

    Calendar names without a year mean their latest occurrence by `now`; several
    expressions give the span that covers them all. Used to boost episodes said then.
    Linear in the length of the text: one scan per pattern, each match read once.
    """
    now = as_utc(now)
    cue_ends = _cue_ends(text)
    spans: list[Period] = []
    #: 1 at each character an earlier (higher-priority) match covers: a match starting there is not read.
    taken = bytearray(len(text))
    for pattern in _PATTERNS:
        for match in pattern.finditer(text):
            start, end = match.span()
            if taken[start]:
                continue
            taken[start:end] = b"\x01" * (end - start)  # an impossible date is not read again as its month
            if (span := _period(match, now, cued=start in cue_ends)) is not None:
                spans.append(span)
    if not spans:
        return None
    return min(s for s, _ in spans), max(e for _, e in spans)
