"""Recency decay, use-count boost and source priors as native `function_score` functions.

This cluster has no script engine, so every multiplier is a filtered `gauss`,
`field_value_factor` or `weight` function, and sums (1 + w * log10(1 + uses)) are
nested function_scores with `score_mode: sum`. `multiplier()` is the same formula in
Python: the tests prove that Elasticsearch applies exactly it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from atlas import constants as C
from atlas.core.clock import Period, es_date
from atlas.core.errors import ValidationError


@dataclass(frozen=True)
class ScoringParams:
    """Every knob of the multipliers; override per call (`replace(params, use_count_weight=0.4)`)."""

    decay_offset: str = C.DECAY_OFFSET
    decay_scale: str = C.DECAY_SCALE
    decay_at_scale: float = C.DECAY_AT_SCALE
    use_count_weight: float = C.USE_COUNT_WEIGHT
    catalog_source_prior: float = C.CATALOG_SOURCE_PRIOR
    procedural_success_weight: float = C.PROCEDURAL_SUCCESS_WEIGHT
    period_boost: float = C.PERIOD_BOOST

    def with_(self, **changes: Any) -> ScoringParams:
        """A copy with some knobs changed (field names as above; an unknown one raises `TypeError`)."""
        return replace(self, **changes)


DEFAULT_PARAMS = ScoringParams()

#: Field each memory type decays on; types not listed do not decay.
DECAY_FIELD = {"episodic": "timestamp", "semantic": "last_used_at"}


def days(duration: str) -> float:
    """'180d' -> 180.0 (the only unit Atlas's constants use)."""
    if not isinstance(duration, str) or not re.fullmatch(r"\d+(\.\d+)?d", duration):
        raise ValidationError(f"durations are given in days, like '180d': {duration!r}")
    return float(duration[:-1])


# --- the formula, in Python ------------------------------------------------------------


def recency(age_days: float, *, params: ScoringParams = DEFAULT_PARAMS) -> float:
    """Gaussian decay: 1.0 up to the offset, `decay_at_scale` at offset + scale."""
    excess = max(0.0, abs(age_days) - days(params.decay_offset))
    sigma2 = -days(params.decay_scale) ** 2 / (2 * math.log(params.decay_at_scale))
    return math.exp(-(excess**2) / (2 * sigma2))


def use_boost(use_count: int, *, params: ScoringParams = DEFAULT_PARAMS) -> float:
    """1 + log10(1 + use_count) * weight: 10 uses x1.21, 100 uses x1.40 at weight 0.2."""
    return 1 + math.log10(1 + use_count) * params.use_count_weight


def success_multiplier(success_rate: float, *, params: ScoringParams = DEFAULT_PARAMS) -> float:
    """(1 - w) + w * smoothed success rate; w = 0 switches it off."""
    w = params.procedural_success_weight
    return (1 - w) + w * success_rate


def smoothed_success_rate(successes: int, failures: int, *, a: float = C.PROCEDURAL_SUCCESS_SMOOTHING) -> float:
    """Laplace-smoothed success rate; an unused playbook starts at 0.5."""
    return (successes + a) / (successes + failures + 2 * a)


def multiplier(memory_type: str, *, age_days: float = 0.0, use_count: int = 0, success_rate: float = 0.5,
               in_period: bool = False, began_after_period: bool = False,
               params: ScoringParams = DEFAULT_PARAMS) -> float:
    """The factor a document's relevance score is multiplied by (`in_period`: an episode said in the period the
    query names; `began_after_period`: a fact that began to hold only after it; `period_functions`)."""
    if memory_type == "episodic":
        return recency(age_days, params=params) * (params.period_boost if in_period else 1.0)
    if memory_type == "semantic":
        held_back = 1 / params.period_boost if began_after_period else 1.0
        return recency(age_days, params=params) * use_boost(use_count, params=params) * held_back
    if memory_type == "catalog":
        return params.catalog_source_prior
    if memory_type == "procedural":
        return success_multiplier(success_rate, params=params)
    return 1.0


# --- the same, as Elasticsearch functions --------------------------------------------------


def _of_type(memory_type: str) -> dict:
    return {"term": {"memory_type": memory_type}}


def build_valid_clause(period: Period) -> dict:
    """The facts that held at some moment of `period`: valid from before its end (`valid_from`, else when written)
    and not until its start (`valid_to`; a fact superseded without one got its successor's start)."""
    start, end = es_date(period[0]), es_date(period[1])
    return {"bool": {"filter": [_of_type("semantic"), _began("lt", end)],
                     "must_not": [{"range": {"valid_to": {"lte": start}}}]}}


def _began(relation: str, moment: str) -> dict:
    """The facts that began to hold `relation` ("lt", "gte") `moment`: by `valid_from`, else by when written."""
    return {"bool": {"minimum_should_match": 1, "should": [
        {"range": {"valid_from": {relation: moment}}},
        {"bool": {"must_not": [{"exists": {"field": "valid_from"}}],
                  "filter": [{"range": {"created_at": {relation: moment}}}]}}]}}


def period_functions(period: Period | None, *, params: ScoringParams = DEFAULT_PARAMS) -> list[dict]:
    """The functions of a `period` the question names (none without one): the episodes said within it multiplied by
    `period_boost`, the facts that began to hold only after it divided by it.

    Lifting the facts that held then instead lost temporal questions whose answers are episodes (docs/evaluation.md,
    "Valid time"); holding back the facts that did not hold then still puts a fact of the period before today's."""
    if period is None or params.period_boost == 1:
        return []
    start, end = es_date(period[0]), es_date(period[1])
    began_after = {"bool": {"filter": [_of_type("semantic"), _began("gte", end)]}}
    return [{"filter": {"range": {"timestamp": {"gte": start, "lt": end}}}, "weight": params.period_boost},
            {"filter": began_after, "weight": 1 / params.period_boost}]


def build_scored_query(query: dict, now: datetime, *, params: ScoringParams = DEFAULT_PARAMS,
                       period: Period | None = None) -> dict:
    """Wrap a retrieval query in the multipliers (recall wraps its BM25 path; see `atlas.core.recall.build_knn_body`).

    `period` (from `atlas.core.clock.mentioned_period`) lifts the episodes said within it and holds back the facts
    that began to hold after it (`period_functions`).
    """
    origin = es_date(now)
    gauss = {"origin": origin, "offset": params.decay_offset, "scale": params.decay_scale,
             "decay": params.decay_at_scale}
    # 1 + w * log10(1 + use_count) on semantic facts, 1 elsewhere (no function matches).
    use = {"function_score": {"query": query, "score_mode": "sum", "boost_mode": "multiply", "functions": [
        {"filter": _of_type("semantic"), "weight": 1},
        {"filter": _of_type("semantic"),
         "field_value_factor": {"field": "use_count", "modifier": "log1p", "missing": 0},
         "weight": params.use_count_weight},
    ]}}
    functions: list[dict] = [
        {"filter": _of_type(memory_type), "gauss": {field: gauss}} for memory_type, field in DECAY_FIELD.items()
    ]
    functions.append({"filter": _of_type("catalog"), "weight": params.catalog_source_prior})
    functions += period_functions(period, params=params)
    inner = use
    if params.procedural_success_weight:
        w = params.procedural_success_weight
        inner = {"function_score": {"query": use, "score_mode": "sum", "boost_mode": "multiply", "functions": [
            {"filter": _of_type("procedural"), "weight": 1 - w},
            {"filter": _of_type("procedural"),
             "field_value_factor": {"field": "success_rate", "missing": 0.5}, "weight": w},
        ]}}
    return {"function_score": {"query": inner, "functions": functions, "score_mode": "multiply",
                               "boost_mode": "multiply"}}
