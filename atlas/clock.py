"""Time as Atlas stores it: aware UTC datetimes in, ISO 8601 `...Z` strings with milliseconds out.

Anything a test or notebook measures takes `now=` explicitly; only the default path
reads the wall clock, here.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC (the corpus and LoCoMo timestamps are)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def es_date(moment: datetime) -> str:
    """2026-11-01T12:00:00.000Z"""
    return as_utc(moment).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_date(text: str) -> datetime:
    """The inverse of `es_date`; also accepts plain ISO 8601 with or without a zone."""
    return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
