"""Writing and hybrid recall against the real cluster (issue 3)."""

from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np
import pytest

from atlas import constants as C
from atlas.core.documents import build_document
from atlas.core.errors import NotFound, SchemaMismatch, ValidationError
from atlas.core.fusion import rrf_fuse
from atlas.core.memory import bulk_load, forget_memory, write_episode, write_memory
from atlas.core.passages import passage_sentences, passage_text
from atlas.core.recall import (
    Tuning,
    build_recall_requests,
    pre_recall,
    recall,
    recall_header,
    record_recall,
    term_weights,
    to_kibana,
)
from atlas.core.schemas import drop_indices, ensure_indices
from atlas.models.embed import load_embedder
from atlas.research.fusion_study import score_fuse
from atlas.research.session_pass import build_session_requests, interleave, session_pass
from atlas.stack import open_store
from tests.conftest import NOW, make_prefix, requests_sent


def test_same_turn_visibility(store):
    doc_id = write_episode(store, "sarah", "The nursery lamp turned on at 3am again", session_id="s1")
    hits = recall(store, "sarah", "nursery lamp at night", k=3, mode="bm25").hits
    assert hits and hits[0].id == doc_id


def test_exact_token_found_by_bm25_when_dense_misses(store):
    target = write_memory(store, "sarah", "The kitchen display showed E-0x41 after the storm", "semantic")
    for code in ("E-0x14", "E-0x40", "E-0x44", "E-0x11"):
        write_memory(store, "sarah", f"Hub error {code} is a known firmware error code", "semantic")
    query = "what does error E-0x41 mean"
    assert recall(store, "sarah", query, k=1, mode="bm25").ids() == [target]
    assert recall(store, "sarah", query, k=1, mode="dense").ids() != [target], \
        "the fixture no longer shows a dense miss; pick harder distractors"
    hybrid = recall(store, "sarah", query, k=3, mode="hybrid")
    assert target in hybrid.ids() and hybrid.hits[hybrid.ids().index(target)].ranks["bm25"] == 1


def test_paraphrase_found_by_dense_when_bm25_misses(store):
    target = write_memory(store, "sarah", "Biscuit chews through sensor cables", "semantic")
    write_memory(store, "sarah", "My puppy photo is the phone wallpaper", "semantic")
    query = "my dog keeps gnawing on the wires"
    assert target not in recall(store, "sarah", query, mode="bm25").ids()
    assert recall(store, "sarah", query, k=1, mode="dense").ids() == [target]


def test_rrf_matches_hand_computation():
    fused = rrf_fuse({"bm25": ["a", "b", "c"], "dense": ["c", "a"]}, rank_constant=30)
    by_key = {key: (score, ranks) for key, score, ranks in fused}
    assert by_key["a"][0] == pytest.approx(1 / 31 + 1 / 32)
    assert by_key["c"][0] == pytest.approx(1 / 33 + 1 / 31)
    assert by_key["b"][0] == pytest.approx(1 / 32)
    assert [key for key, _, _ in fused] == ["a", "c", "b"]
    assert by_key["c"][1] == {"bm25": 3, "dense": 1}


def test_score_fusion_by_hand():
    """z-scores of bm25 (3, 2, 1) are (1.22, 0, -1.22) and of dense (0.9, 0.5) (1, -1); b, missing from dense,
    gets dense's floor (-1)."""
    scores = {"bm25": {"a": 3.0, "b": 2.0, "c": 1.0}, "dense": {"c": 0.9, "a": 0.5}}
    z = dict(score_fuse(scores, {"bm25": 0.5, "dense": 0.5}, normalise="zscore"))
    assert z["a"] == pytest.approx(0.5 * 1.2247449 - 0.5) and z["b"] == pytest.approx(-0.5)
    assert z["c"] == pytest.approx(-0.5 * 1.2247449 + 0.5)
    convex = score_fuse(scores, {"bm25": 0.8, "dense": 0.2}, normalise="minmax")
    assert convex == [("a", pytest.approx(0.8)), ("b", pytest.approx(0.4)), ("c", pytest.approx(0.2))]
    assert [key for key, _ in score_fuse(scores, {"bm25": 0.1, "dense": 0.9}, normalise="minmax")] == ["c", "a", "b"]


def test_fusion_order_on_cluster_matches_rrf_of_paths(store):
    for text in ["hub reset steps", "reset the hub by holding the button", "router reboot", "hub firmware notes"]:
        write_memory(store, "sarah", text, "semantic")
    result = recall(store, "sarah", "how do I reset my hub", k=4, mode="hybrid")
    expected = sorted(result.hits, key=lambda h: -sum(1 / (30 + r) for r in h.ranks.values()))
    assert [h.id for h in result.hits] == [h.id for h in expected]
    for hit in result.hits:
        assert hit.score == pytest.approx(sum(1 / (30 + r) for r in hit.ranks.values()))
        assert hit.path_scores.keys() == hit.ranks.keys()


def hybrid_requests(store, query: str, types: tuple, **options) -> list[dict]:
    """Sarah's hybrid `_msearch` for `query` over `types`, as recall builds it (a zero query vector)."""
    header = recall_header(store, "sarah", types, archive=False)
    return build_recall_requests(store, "sarah", mode="hybrid", header=header, now=NOW, params=store.params,
                                 window=80, weights=term_weights(store, "sarah", query, header),
                                 query_vector=[0.0] * store.embedder.dims, **options)


def test_the_priors_sit_in_the_bm25_path_only(store):
    """BM25 scores carry recency, use and priors; kNN ranks by similarity alone, so an old episode
    that matches best stays first in the dense path (at 1500 days its multiplier is 0.70). Only a
    period the question names reaches both paths."""
    old = write_episode(store, "sarah", "I reset the Lumio hub by holding its button for ten seconds", session_id="s1",
                        ts=NOW - timedelta(days=1500))
    write_episode(store, "sarah", "The Lumio hub manual is in the kitchen drawer", session_id="s2")
    bm25, knn = hybrid_requests(store, "hub", ("episodic",))
    assert "function_score" in str(bm25["body"]) and "function_score" not in str(knn["body"])
    june = (NOW - timedelta(days=150), NOW - timedelta(days=120))
    _, knn = hybrid_requests(store, "hub", ("episodic",), period=june)
    assert [f["weight"] for f in knn["body"]["query"]["function_score"]["functions"]] == [
        store.params.period_boost, 1 / store.params.period_boost], "episodes said then up, facts begun after down"
    assert "gauss" not in str(knn["body"])
    query = "how do I reset the Lumio hub with its button"
    dense = recall(store, "sarah", query, k=1, mode="dense")
    assert dense.ids() == [old]
    cosine = store.embedder.embed_queries([query])[0] @ np.asarray(
        store.es.get(index=f"{store.prefix}-episodic", id=old, source_exclude_vectors=False)["_source"]["embedding"])
    # `bbq_hnsw` (`C.VECTOR_INDEX`) re-scores the top candidates with the float vectors it keeps on disk.
    assert dense.hits[0].path_scores == {"dense": pytest.approx((1 + cosine) / 2, abs=1e-4)}


def test_a_prefix_written_by_another_model_is_refused(es):
    first = open_store(make_prefix("other-model"), es=es, embedder=load_embedder("minilm"), second_stage=None,
                       tenancy=False)
    try:
        write_memory(first, "sarah", "The hub lives in the hallway cupboard", "semantic")
        # e5 has MiniLM's 384 dimensions: only the recorded model name tells the two spaces apart.
        with pytest.raises(SchemaMismatch, match="`embedding` holds vectors of all-MiniLM"):
            open_store(first.prefix, es=es, embedder=load_embedder("e5"), second_stage=None, tenancy=False)
        with pytest.raises(SchemaMismatch, match="768"):  # nomic, the default, is wider
            open_store(first.prefix, es=es, second_stage=None, tenancy=False)
    finally:
        first.drop()


#: Tests that close an index, which `test_an_index_that_cannot_be_closed_is_not_upgraded_silently` forbids
#: cluster-wide for a moment: one worker runs them.
CLOSES_INDICES = pytest.mark.xdist_group("closes-indices")


@CLOSES_INDICES
def test_bm25_ignores_length_and_an_older_index_is_upgraded(store):
    """The `boolean` similarity: a long episode and a short one that hold the question's word score alike (its
    weight); an index created with Lucene's BM25 (b 0.75) is switched in place, its documents kept."""
    write_episode(store, "sarah", "The hub again", session_id="s1")
    write_episode(store, "sarah", "The hub blinked red all evening while Biscuit slept by the radiator, the hub",
                  session_id="s1")

    def bm25_scores() -> list[float]:
        return [h.path_scores["bm25"] for h in recall(store, "sarah", "hub", mode="bm25").hits]

    assert bm25_scores() == pytest.approx([bm25_scores()[0]] * 2)
    episodic = f"{store.prefix}-episodic"
    store.es.indices.close(index=episodic)
    bm25 = {"index": {"similarity": {"default": {"type": "BM25", "b": 0.75}}}}
    store.es.indices.put_settings(index=episodic, settings=bm25)
    store.es.indices.open(index=episodic, wait_for_active_shards="all")
    short, long = bm25_scores()
    assert short > long * 1.1
    report = ensure_indices(store.es, store.prefix, store.embedder.dims,
                            store.passage_embedders["rerank_embedding"].dims)
    assert report[episodic] == "upgraded" and set(report.values()) == {"ok", "upgraded"}
    after = bm25_scores()
    assert len(after) == 2 and after == pytest.approx([after[0]] * 2)


def test_a_prefix_of_schema_v3_vectors_is_refused_with_the_way_out(es):
    """v3 kept float vectors in `_source` under a plain `hnsw` graph; neither can change in place."""
    prefix = make_prefix("v3-vectors")
    ensure_indices(es, prefix, 768, 384, vector_index="hnsw", source_vectors=True)
    try:
        refusal = (r"embedding.index_options.type: expected 'bbq_hnsw', found 'hnsw'.*"
                   r"exclude_source_vectors: expected True, found False.*atlas users export")
        with pytest.raises(SchemaMismatch, match=refusal):
            ensure_indices(es, prefix, 768, 384)
        kept = ensure_indices(es, prefix, 768, 384, vector_index="hnsw", source_vectors=True)
        assert kept[f"{prefix}-semantic"] == "ok"
    finally:
        drop_indices(es, prefix)


@CLOSES_INDICES
def test_an_index_that_cannot_be_closed_is_not_upgraded_silently(store, operator_es):
    """A cluster may refuse to close an index (here `cluster.indices.close.enable: false`): say so, change nothing."""
    catalog = f"{store.prefix}-catalog"
    store.es.indices.close(index=catalog)
    store.es.indices.put_settings(index=catalog, settings={"index": {"similarity": {"default": {"type": "BM25"}}}})
    store.es.indices.open(index=catalog, wait_for_active_shards="all")
    operator_es.cluster.put_settings(persistent={"cluster.indices.close.enable": False})
    try:
        with pytest.raises(SchemaMismatch, match="change that failed .closing indices is disabled"):
            ensure_indices(store.es, store.prefix, store.embedder.dims,
                           store.passage_embedders["rerank_embedding"].dims)
    finally:
        operator_es.cluster.put_settings(persistent={"cluster.indices.close.enable": None})
    index_settings = store.es.indices.get_settings(index=catalog)[catalog]["settings"]["index"]
    assert index_settings["similarity"]["default"]["type"] == "BM25"
    assert store.es.cat.indices(index=catalog, h="status").strip() == "open"


def test_superseded_hidden_unless_asked(store):
    old = write_memory(store, "sarah", "Sarah lives in Bristol", "semantic", fact_type="location")
    new = write_memory(store, "sarah", "Sarah lives in Edinburgh", "semantic", supersedes_id=old)
    ids = recall(store, "sarah", "where does Sarah live").ids()
    assert new in ids and old not in ids
    flagged = {h.id: h for h in recall(store, "sarah", "where does Sarah live", include_superseded=True).hits}
    assert flagged[old].superseded_by == new and flagged[old].superseded_at


def test_forget_deletes_only_callers_document(store):
    mine = write_memory(store, "sarah", "Sarah's wifi password hint is the dog's name", "semantic")
    theirs = write_memory(store, "tom", "Tom's wifi password hint is his street", "semantic")
    with pytest.raises(NotFound):
        forget_memory(store, "sarah", theirs)
    assert store.es.exists(index=f"{store.prefix}-semantic", id=theirs)
    forget_memory(store, "sarah", mine)
    assert not store.es.exists(index=f"{store.prefix}-semantic", id=mine)


def test_catalog_shared_other_users_hidden(store):
    bulk_load(store, [build_document(None, "Lumio Hub v2 smart home hub, Zigbee and Thread", "catalog", NOW,
                                     title="Lumio Hub v2", category="hub")], progress=False)
    write_memory(store, "tom", "Tom has a Lumio Hub v2 in the garage", "semantic")
    with pytest.raises(NotFound, match="unknown user sarah"):
        recall(store, "sarah", "Lumio Hub v2")
    write_episode(store, "sarah", "hello there", session_id="s1")  # her first write gives her a read key
    hits = recall(store, "sarah", "Lumio Hub v2").hits
    assert hits[0].memory_type == "catalog" and {h.user_id for h in hits} == {None, "sarah"}


def test_use_count_race(store):
    fact = write_memory(store, "sarah", "Sarah prefers warm white light in the evening", "semantic")
    barrier = threading.Barrier(10, timeout=30)  # a thread that never arrives breaks it: the test fails, not hangs
    errors = []

    def one():
        try:
            barrier.wait()
            record_recall(store, recall(store, "sarah", "warm white light evening", k=1, mode="bm25"))
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a recall hung"
    assert not errors
    assert store.es.get(index=f"{store.prefix}-semantic", id=fact)["_source"]["use_count"] == 10


def test_recall_refreshes_last_used_at(store):
    fact = write_memory(store, "sarah", "Sarah's hub is in the hallway cupboard", "semantic")
    later = NOW + timedelta(days=30)
    store.now = lambda: later
    record_recall(store, recall(store, "sarah", "hallway cupboard hub", k=1))
    source = store.es.get(index=f"{store.prefix}-semantic", id=fact)["_source"]
    assert source["last_used_at"].startswith("2026-12-01") and source["use_count"] == 1


def test_all_modes_and_second_stage(store):
    """Each mode searches its own paths and no other; only hybrid+rerank runs the second stage, which scores
    every hit; a query only one document matches puts it first in every mode."""
    target = write_memory(store, "sarah", "The nursery speaker is silent from 7pm to 7am", "semantic")
    for text in ("The garage door opens when the car arrives", "The porch light follows sunset",
                 "Biscuit's water bowl refills at noon"):
        write_memory(store, "sarah", text, "semantic")
    paths = {"bm25": {"bm25"}, "dense": {"dense"}, "hybrid": {"bm25", "dense"}, "hybrid+rerank": {"bm25", "dense"}}
    for mode, expected in paths.items():
        result = recall(store, "sarah", "when is the nursery speaker silent", k=4, mode=mode)
        assert result.ids()[0] == target, mode
        assert set().union(*(hit.ranks for hit in result.hits)) == expected, mode
        assert all(hit.path_scores.keys() == hit.ranks.keys() for hit in result.hits), mode
        reranked = mode == "hybrid+rerank"
        assert result.second_stage == (store.second_stage.name if reranked else None) and result.note is None, mode
        assert all((hit.second_stage_score is not None) == reranked for hit in result.hits), mode


def test_second_stage_failure_falls_back(store):
    write_memory(store, "sarah", "The porch light follows sunset", "semantic")

    class Broken:
        name, embedder = "broken", None

        def scores(self, *args):
            from atlas.core.errors import EmbeddingError
            raise EmbeddingError("endpoint down")

    store.second_stage = Broken()
    result = recall(store, "sarah", "porch light")
    assert result.hits and result.second_stage is None and "RRF order" in result.note


def test_request_bodies_are_printable(store):
    write_memory(store, "sarah", "The hub sits in the hallway")
    requests = hybrid_requests(store, "hub", ("semantic",))
    assert [r["path"] for r in requests] == ["bm25", "dense"]
    text = to_kibana(requests)
    assert text.startswith("GET _msearch") and '"user_id": "sarah"' in text
    assert '{"match": {"text": {"query": "hub", "boost": ' in text, "the word with its weight"


@pytest.mark.parametrize("bad", [
    dict(query=""), dict(query="   "), dict(k=0), dict(k=10_000), dict(types=["dreams"]), dict(mode="magic"),
    dict(user_id="Not A User"), dict(query=123),
])
def test_bad_recall_input(store, bad):
    args = {"user_id": "sarah", "query": "hub", **bad}
    with pytest.raises(ValidationError):
        recall(store, args.pop("user_id"), args.pop("query"), **args)


@pytest.mark.parametrize("bad", [
    dict(text=""), dict(memory_type="dreams"), dict(memory_type="catalog"), dict(contradiction="rude"),
    dict(supersedes_id="../../etc"), dict(confidence=2.0), dict(memory_type="procedural"),
    dict(context="Which hub?"), dict(memory_type="episodic", context=""),
    dict(memory_type="episodic", context=[]), dict(memory_type="episodic", context=["Which hub?", " "]),
])
def test_bad_write_input_writes_nothing(store, bad):
    args = {"text": "a fact", "memory_type": "semantic", **bad}
    with pytest.raises(ValidationError):
        write_memory(store, "sarah", args.pop("text"), args.pop("memory_type"), **args)
    store.es.indices.refresh(index=store.indices)
    assert store.es.count(index=store.indices)["count"] == 0


def test_a_100kb_message_as_query_is_recalled_on(store):
    """The pre-recall runs on the user's message, however long: on its head (`clip_query`, MAX_QUERY_CHARS),
    of which BM25 uses the first words. `recall` itself refuses a query that long."""
    target = write_episode(store, "sarah", "The hub reset itself overnight", session_id="s1")
    # The prefix makes the message new to the on-disk embedding cache, which would otherwise skip the model.
    message = f"hub reset {store.prefix} " + " ".join(f"filler{i}" for i in range(12_000))
    with pytest.raises(ValidationError, match=f"the limit is {C.MAX_QUERY_CHARS}"):
        recall(store, "sarah", message, k=3)
    with pytest.warns(UserWarning):  # truncated for embedding, with a warning
        result = pre_recall(store, "sarah", message, k=3)
    assert message.startswith(result.query) and len(result.query) <= C.MAX_QUERY_CHARS
    assert target in result.ids()
    assert result.hits[result.ids().index(target)].ranks.get("bm25") == 1, "found by the dense path alone"


def test_english_analysis_drops_question_words_and_stems(store):
    tokens = store.es.indices.analyze(index=f"{store.prefix}-episodic", analyzer="atlas_english",
                                      text="Where has Gina's team camped?")["tokens"]
    assert [t["token"] for t in tokens] == ["gina", "team", "camp"]
    target = write_episode(store, "sarah", "We went camping in the Cairngorms with the kids", session_id="s1")
    write_episode(store, "sarah", "Where did you put the hub manual?", session_id="s1")
    assert recall(store, "sarah", "Where has Sarah camped?", k=1, mode="bm25").ids() == [target]


def test_episode_context_is_searched_and_embedded(store):
    question = "Assistant: Which cable did Biscuit chew through this time?"
    target = write_episode(store, "sarah", "The blue one by the back door", session_id="s1", context=question)
    write_episode(store, "sarah", "The blue kettle is new", session_id="s1")
    source = store.es.get(index=f"{store.prefix}-episodic", id=target, source_exclude_vectors=False)["_source"]
    assert source["text"] == "The blue one by the back door" and source["context"] == question
    assert np.allclose(source["embedding"], store.embedder.embed_passages([passage_text(source)])[0], atol=1e-5)
    assert passage_text(source) == f"{question}\nThe blue one by the back door"
    hits = recall(store, "sarah", "which cable did the dog chew", k=2, mode="bm25")
    assert hits.ids()[0] == target and hits.hits[0].text == "The blue one by the back door"


def test_earlier_context_is_searched_not_embedded(store):
    """Of a context of several messages, BM25 searches all; only the last, the one replied to, is embedded."""
    exchange = ["Biscuit chewed a cable again", "Assistant: Which one this time?"]
    target = write_episode(store, "sarah", "The blue one by the back door", session_id="s1", context=exchange)
    source = store.es.get(index=f"{store.prefix}-episodic", id=target, source_exclude_vectors=False)["_source"]
    assert source["context"] == exchange
    assert passage_text(source) == "Assistant: Which one this time?\nThe blue one by the back door"
    assert np.allclose(source["embedding"], store.embedder.embed_passages([passage_text(source)])[0], atol=1e-5)
    assert recall(store, "sarah", "biscuit chewed", k=1, mode="bm25").ids() == [target]


def test_a_speakers_sentences_are_split_and_headed():
    turn = {"text": "Maria: I fixed the garden fence. Then I baked bread for the neighbours! Ok.", "speaker": "Maria"}
    assert passage_sentences(turn) == ["Maria: I fixed the garden fence.",
                                       "Maria: Then I baked bread for the neighbours!"]
    assert passage_sentences({**turn, "text": "I fixed the garden fence. Then I baked bread."}) == \
        ["Maria: I fixed the garden fence.", "Maria: Then I baked bread."], "a text without the header gets it"
    assert passage_sentences({"text": turn["text"]}) == [], "no speaker, no sentence vectors"
    assert passage_sentences({**turn, "text": "Maria: I fixed the garden fence. Ok."}) == [], "one sentence is the turn"


def test_the_dense_path_scores_a_turn_by_its_best_vector(store):
    """A speaker's turn is scored by the best of its own vector and its sentences' (`dis_max` over a nested kNN)."""
    text = ("Maria: I spent the whole morning fixing the garden fence with Tom. Then I baked sourdough bread for "
            "the neighbours. In the evening we watched a long film about volcanoes in Iceland.")
    target = write_episode(store, "sarah", text, session_id="s1", speaker="Maria")
    # no speaker: no sentences
    write_episode(store, "sarah", "I baked bread for the neighbours. It took all day.", session_id="s1")
    plain = store.es.get(index=f"{store.prefix}-episodic", id=target)["_source"]
    assert not {"embedding", "rerank_embedding"} & set(plain) and plain["sentences"] == [{}] * 3, \
        "vectors are indexed, not kept in _source"
    stored = store.es.get(index=f"{store.prefix}-episodic", id=target, source_exclude_vectors=False)["_source"]
    assert stored["speaker"] == "Maria"
    nested = {"nested": {"path": "sentences", "query": {"exists": {"field": "sentences.embedding"}}}}
    assert [h["_id"] for h in store.es.search(index=store.indices, query=nested)["hits"]["hits"]] == [target]
    query = "What did Maria bake?"
    hit = next(h for h in recall(store, "sarah", query, mode="dense").hits if h.id == target)
    q = store.embedder.embed_queries([query])[0]
    sentences = store.embedder.embed_passages(passage_sentences(stored))
    assert np.allclose([s["embedding"] for s in stored["sentences"]], sentences, atol=1e-5), "read back as written"
    vectors = [stored["embedding"], *sentences]
    assert len(vectors) == 4
    scores = [(1 + float(np.dot(q, v) / np.linalg.norm(v))) / 2 for v in vectors]
    assert hit.path_scores["dense"] == pytest.approx(max(scores), abs=1e-3)
    assert max(scores[1:]) > scores[0], "the fixture no longer has a sentence closer to the question than its turn"


def test_empty_context_writes_nothing(store):
    with pytest.raises(ValidationError, match="context"):
        write_episode(store, "sarah", "The blue one", session_id="s1", context="  ")
    store.es.indices.refresh(index=f"{store.prefix}-episodic")
    assert store.es.count(index=f"{store.prefix}-episodic")["count"] == 0


def test_a_named_month_lifts_the_episodes_said_then(store):
    july = write_episode(store, "sarah", "We went camping by the loch with the kids", session_id="s1",
                         ts=NOW - timedelta(days=120))
    june = write_episode(store, "sarah", "We went camping in the hills with the kids", session_id="s2",
                         ts=NOW - timedelta(days=150))
    plain = recall(store, "sarah", "where did we go camping?", k=2)
    assert plain.period is None and plain.ids()[0] == july, "the fixture no longer prefers July without a month"
    named = recall(store, "sarah", "where did we go camping in June?", k=2)
    assert named.period is not None and named.period[0].month == 6
    assert named.ids() == [june, july]
    assert '"range": {"timestamp"' in to_kibana(named.requests)


def test_interleave_by_hand():
    """The first `keep` of the ranking, then each group's first, then each one's second, then the rest."""
    ranked = ["a", "b", "c", "d", "e"]
    assert interleave(ranked, [["a", "x"], ["d", "y", "z"]], keep=1) == ["a", "d", "x", "y", "z", "b", "c", "e"]
    assert interleave(ranked, [], keep=2) == ranked
    assert interleave(ranked, [["e"]], keep=5) == ranked


def test_the_session_pass_brings_a_found_sessions_next_turn_up(store):
    """Searched on its own, the session of the first hit gives its second-best turn, which the whole memory ranks
    below turns of other sessions; with `keep` 1 it takes place 2. The pass is off by default."""
    top = write_episode(store, "sarah", "We went hiking in the Brecon mountains with the dog", session_id="trip")
    later = write_episode(store, "sarah", "Biscuit slept in the tent all night", session_id="trip")
    write_episode(store, "sarah", "The hub firmware update finished overnight", session_id="trip")
    for i, text in enumerate(["I like hiking boots with a stiff sole", "Snowdon is the highest of the mountains here",
                              "The dog walker comes on Tuesdays", "Hiking poles are on sale at the outdoor shop"]):
        write_episode(store, "sarah", text, session_id=f"other-{i}")
    query = "where did we go hiking with the dog"
    off = recall(store, "sarah", query, k=3)
    assert off.ids()[0] == top and later not in off.ids(), "the fixture no longer hides the session's second turn"
    assert [h.id for h in session_pass(store, off, k=3, sessions=0)] == off.ids()
    on = [h.id for h in session_pass(store, off, k=3, sessions=1, turns=2, keep=1)][:3]
    assert on[:2] == [top, later] and on[2] == off.ids()[1]
    bm25, knn = build_session_requests(store, off, ["trip"], turns=2)
    assert [bm25["path"], knn["path"]] == ["bm25@trip", "dense@trip"] and bm25["body"]["size"] == 2
    for request in (bm25, knn):
        assert str(request["body"]).count("{'term': {'session_id': 'trip'}}") == (1 if request is bm25 else 2)


def test_timings_split_each_paths_search_and_the_supersession_check(store):
    """Where a recall's time goes, as the benchmark reports it: each path's server time (`took`) inside the
    `_msearch`, the supersession check inside fusion, the second stage after them."""
    assert store.second_stage is not None and store.second_stage.embedder is not None, "needs the e5 second stage"
    write_episode(store, "tim", "The garage door sensor went offline after the storm")
    timings = recall(store, "tim", "garage sensor offline", mode="hybrid+rerank").timings
    assert 0 <= timings["took_bm25"] <= timings["es"] and 0 <= timings["took_dense"] <= timings["es"]
    assert 0 < timings["settle"] <= timings["fusion"] and 0 < timings["second"]
    bm25 = recall(store, "tim", "garage sensor offline", mode="bm25").timings
    assert "took_bm25" in bm25 and "took_dense" not in bm25


def test_the_default_recall_is_one_msearch_and_reads_nothing_else(store, monkeypatch):
    """Issue 33: the default mode's recall makes one `_msearch` (the second stage's vectors and hubness come in it)
    and no `mget`, besides the size-0 search of the user's term statistics (issue 36, `term_weights`), sent while
    the query is embedded; a plain recall writes nothing (`record_recall` is the caller's step)."""
    facts = [write_memory(store, "tim", text) for text in ("The garage sensor is a Zigbee contact sensor",
                                                           "Tim's garage door opener is on the 2.4 GHz band")]
    write_episode(store, "tim", "The garage door sensor went offline after the storm")
    recall(store, "tim", "garage", k=1)  # the first read fetches the user's key; the second reuses it
    sent = requests_sent(monkeypatch)
    result = recall(store, "tim", "garage sensor offline", k=5)
    assert result.second_stage is not None, result.note
    assert sorted(path.rsplit("/", 1)[-1] for _, path in sent) == ["_msearch", "_search"], sent
    assert {hit.id for hit in result.hits} >= set(facts)
    assert all("rerank_embedding" not in hit.source for hit in result.hits), "vectors stay out of the hits"
    monkeypatch.undo()
    uses = store.es.mget(index=f"{store.prefix}-semantic", ids=facts)["docs"]
    assert [doc["_source"]["use_count"] for doc in uses] == [0, 0], "a plain recall only reads"


def test_a_later_write_sends_its_neighbours_search_and_the_document_only(store, monkeypatch):
    """A user's write after their first makes two requests: the `_msearch` of the new memory's neighbours (its
    hubness, their vectors as doc values) and the index request: the read key made at their first write, read once
    since, is not looked up again within `C.TOKEN_CACHE_SECONDS` (`KeyReader.provision`)."""
    write_episode(store, "tim", "The garage door sensor went offline after the storm")
    recall(store, "tim", "garage", k=1)  # the first read fetches the user's key
    sent = requests_sent(monkeypatch)
    second = write_episode(store, "tim", "The garage door sensor is back online")
    monkeypatch.undo()
    assert sorted(path.rsplit("/", 1)[-1] for _, path in sent) == ["_doc", "_msearch"], sent
    stored = store.es.get(index=f"{store.prefix}-episodic", id=second)["_source"]
    assert stored["hubness"] is not None and 0 < stored["hubness"] <= 1, "the first episode is its neighbour"


def test_a_rescored_bm25_path_gives_its_window_the_full_score(store):
    """With `Tuning(rescore=N)` the BM25 path takes its top N by the words' weights alone, ties to the newest, and
    gives those the multiplied score: a window that holds every match scores as the default path does; a smaller one
    leaves out the older of two equally matching episodes, which the multipliers would have put first."""
    ages = (1500, 900, 400, 30, 2)
    for days in ages:
        write_episode(store, "sarah", f"The porch light flickered {days} days ago", session_id=f"s{days}",
                      ts=NOW - timedelta(days=days))
    write_memory(store, "sarah", "The porch light is on a timer", "semantic")
    write_episode(store, "sarah", "The porch light blinked once", session_id="sx", ts=NOW - timedelta(days=3000))
    query = "porch light flickered"
    full = recall(store, "sarah", query, k=10, mode="bm25")
    whole = recall(store, "sarah", query, k=10, mode="bm25", tuning=Tuning(rescore=10))
    assert [(h.id, h.path_scores) for h in whole.hits] == [(h.id, h.path_scores) for h in full.hits]
    assert "rescore" in whole.requests[0]["body"] and "rescore" not in full.requests[0]["body"]
    narrow = recall(store, "sarah", query, k=2, mode="bm25", tuning=Tuning(rescore=2, window=2))
    flickered = [h for h in full.hits if "flickered" in h.text]
    newest = sorted(flickered, key=lambda h: h.source["timestamp"], reverse=True)[:2]
    assert {h.id for h in narrow.hits} == {h.id for h in newest}
    assert [h.path_scores for h in narrow.hits] == [h.path_scores for h in full.hits if h.id in narrow.ids()]


def test_stop_words_can_be_left_out_of_the_exact_subfield(store):
    """By default a query's stop words are searched in neither `text` nor `text.exact`;
    `Tuning(exact_stop_words=True)` searches them in `text.exact`."""
    header = recall_header(store, "sarah", ("episodic",), archive=False)
    write_episode(store, "sarah", "The hub is on the shelf", session_id="s1")
    query = "is the hub on the shelf"
    kept = term_weights(store, "sarah", query, header, tuning=Tuning(exact_stop_words=True))
    left = term_weights(store, "sarah", query, header)
    assert kept["text.exact"].keys() == {"is", "the", "hub", "on", "shelf"}
    assert left["text.exact"].keys() == {"hub", "shelf"} and left["text"] == kept["text"]
