"""The agent evaluation (`atlas eval agent`): its checks by hand, and the CI subset against the recorded numbers,
with the local model for real (docs/llm.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from atlas.cli import app
from atlas.models.llm import LLMError
from atlas.research import results
from atlas.research.agent_eval import check_reply, check_state, evaluate_agent, read_scenarios
from atlas.stack import open_store
from tests.conftest import make_prefix


def fact(text: str, **fields) -> dict:
    return {"_id": text, "memory_type": "semantic", "text": text, **fields}


def test_state_checks_by_hand():
    stored = [fact("Sarah lives in Edinburgh", supersedes=["x"], contradiction="harsh"),
              fact("Sarah lived in Bristol", superseded_by="y"),
              {"_id": "p", "memory_type": "procedural", "text": "Hub offline", "success_count": 1},
              {"_id": "e", "memory_type": "episodic", "text": "forget my gym schedule"}]
    assert check_state({"current": ["Edinburgh"], "retired": ["Bristol"]}, stored) is True
    assert check_state({"current": ["Bristol"]}, stored) is False, "a superseded fact is not current"
    assert check_state({"contradiction": "harsh"}, stored) is True
    assert check_state({"contradiction": "natural"}, stored) is False
    assert check_state({"outcome": "success"}, stored) is True and check_state({"outcome": "failure"}, stored) is False
    assert check_state({"forgotten": ["gym"]}, stored) is True, "the request's own episode may stay"
    assert check_state({"forgotten": ["Bristol"]}, stored) is False, "a superseded fact still holds the word"
    assert check_state({"reply_any": ["x"]}, stored) is None


def test_reply_checks_read_whole_words():
    assert check_reply({"reply_any": ["no", "never"]}, "No, that was your sister.") is True
    assert check_reply({"reply_any": ["no"]}, "I know you live in Bath.") is False, "'know' is not 'no'"
    assert check_reply({"reply_any": ["Edinburgh"], "reply_none": ["Bristol"]}, "Edinburgh, not Bristol") is False
    assert check_reply({"reply_any": ["Mill Lane"]}, "It was on mill lane.") is True
    assert check_reply({"reply_all": ["Hub", "R1"]}, "You have the R1.") is False, "a same-turn list needs both"
    assert check_reply({"reply_all": ["Hub", "R1"]}, "Your Lumio Hub v2 and the R1.") is True
    assert check_reply({"current": ["x"]}, "anything") is None


def test_scenarios_cover_every_kind_and_the_ci_subset_takes_one_of_each():
    data = read_scenarios()
    kinds = [s["kind"] for s in data["scenarios"]]
    assert len(kinds) >= 30 and len({s["id"] for s in data["scenarios"]}) == len(kinds)
    assert set(kinds) == {"recall", "same_turn", "move", "correction", "forget", "outcome", "later"}
    ci = read_scenarios(ci=True)["scenarios"]
    assert [s["kind"] for s in ci] == list(dict.fromkeys(kinds))
    assert ci == [next(s for s in data["scenarios"] if s["kind"] == kind) for kind in dict.fromkeys(kinds)]


@pytest.fixture(scope="module")
def agent_report(es, local_llm, tmp_path_factory) -> Iterator[dict]:
    store = open_store(make_prefix("eval-agent"), es=es)
    store.settings = replace(store.settings, home=tmp_path_factory.mktemp("home"))
    try:
        yield evaluate_agent(store, ci=True, progress=False)
    finally:
        store.drop()


def test_agent_subset_matches_expected(agent_report):
    """The CI subset with the default local model, within one scenario of what was recorded; no leak."""
    assert agent_report["leaks"] == 0
    assert agent_report["setup"]["model"] == results.load_expected()["runs"]["agent-ci"]["setup"]["model"]
    assert results.compare(results.RUNS["agent-ci"], agent_report) == []


def test_an_evaluation_refuses_a_model_the_endpoint_does_not_serve(store, local_llm):
    """llama.cpp's server answers any model name with its one model: a run under another name would credit the
    wrong model, so it is refused before any scenario runs."""
    store.settings = replace(store.settings, llm_model="qwen2.5-coder-0.5b")
    with pytest.raises(LLMError, match="serves smollm2-135m, not qwen2.5-coder-0.5b: `atlas llm up --model"):
        evaluate_agent(store, ci=True, progress=False)


def test_eval_agent_takes_only_a_model_with_a_recorded_run():
    result = CliRunner().invoke(app, ["eval", "agent", "--model", "gpt-4o"])
    assert result.exit_code == 1 and "no recorded agent run of 'gpt-4o'" in result.output
    assert "qwen2.5-coder-0.5b" in result.output
