"""The notebooks' figures (`atlas.notebook.plots`) carry what a reader needs: a title, labelled axes, a legend
or a colour bar naming what is drawn, tick labels that do not overlap, and the saved file is the figure shown.

Drawn from small hand-made inputs, without a cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import combinations

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from atlas.notebook import plots

NOW = datetime(2026, 11, 1, 12, tzinfo=UTC)


def _iso(days_before: int) -> str:
    return (NOW - timedelta(days=days_before)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


CHAIN = [{"id": "a", "created_at": _iso(700), "superseded_by": "b", "superseded_at": _iso(200)},
         {"id": "b", "created_at": _iso(200), "contradiction": "natural"},
         {"id": "c", "created_at": _iso(400), "superseded_by": "d", "superseded_at": _iso(30)},
         {"id": "d", "created_at": _iso(30), "contradiction": "harsh"}]
TENANTS = [f"tenant-{i:02d}" for i in range(12)]

FIGURES = {
    "score_spread": lambda out: plots.score_spread(
        {"bm25": {"q1": [0.2, 1.5, 3.1], "q2": [0.1, 0.4]}, "dense": {"q1": [0.71, 0.8], "q2": [0.72, 0.84]}},
        out_dir=out),
    "decay_scores": lambda out: plots.scores_over_time(
        [0, 365, 730], {"porch": [0.6, 0.5, 0.4], "hall": [0.35, 0.34, 0.33]}, out_dir=out),
    "supersession_timeline": lambda out: plots.supersession_timeline(
        CHAIN, now=NOW, labels={"a": "bristol", "b": "edinburgh", "c": "beagle", "d": "spaniel"}, out_dir=out),
    "leak_heatmap": lambda out: plots.tenant_heatmap(
        {"guarded": {t: {t: 9, "(catalog)": 1} for t in TENANTS},
         "unguarded": {t: {o: 1 for o in TENANTS} for t in TENANTS}}, tenants=TENANTS, shared="(catalog)",
        out_dir=out),
    "precision_recall": lambda out: plots.precision_recall(
        {"rules": {"facts": {"matched": 14, "proposed": 19, "expected": 22},
                   "outcomes": {"matched": 6, "proposed": 6, "expected": 8}},
         "guided (a model)": {"facts": {"matched": 1, "proposed": 26, "expected": 22},
                              "outcomes": {"matched": 4, "proposed": 6, "expected": 8}}},
        title="two proposers", out_dir=out),
    "grouped_bars": lambda out: plots.grouped_bars(
        {"semantic": {"bm25": 0.8, "hybrid": 0.9}, "overall": {"bm25": 0.7, "hybrid": 0.85}},
        errors={"semantic": {"bm25": (0.7, 0.9), "hybrid": (0.85, 0.95)}}, reference={"overall": 0.75},
        title="R@10", xlabel="memory type", ylabel="R@10", out_dir=out),
    "bench_ingest": lambda out: plots.bench_ingest(
        {"ingest": {"without_embedding": {"10000": 800.0, "1000000": 700.0}, "with_embedding": {
            "per_s": 19.0, "stages": {"nomic": {"texts_per_s": 60.0, "share": 0.3},
                                      "e5": {"texts_per_s": 30.0, "share": 0.6}}}},
         "embedding": {"nomic": {"passages_per_s": 87.0}, "e5": {"passages_per_s": 51.0}}}, out_dir=out),
}


def _overlapping(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of visible tick labels on the same axis whose boxes overlap."""
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure was closed: give it a canvas to measure on
    pairs = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            pairs += [(a, b) for (a, box_a), (b, box_b) in combinations(boxes, 2) if box_a.overlaps(box_b)]
    return pairs


def _legend_over_labels(fig: Figure) -> list[str]:
    """The axis labels and titles a legend of the figure covers (issue 35: 11's legend sat on its x label)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    covered = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for text in (ax.xaxis.label, ax.yaxis.label, ax.title):
            if text.get_text() and box.overlaps(text.get_window_extent(renderer)):
                covered.append(text.get_text())
    return covered


@pytest.mark.parametrize("name", FIGURES)
def test_figure_is_labelled_and_saved(name, tmp_path):
    fig = FIGURES[name](tmp_path)
    titled = fig.get_suptitle() or any(ax.get_title() for ax in fig.axes)
    assert titled, f"{name}: no title"
    plotted = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for ax in plotted:
        assert ax.get_xlabel(), f"{name}: an x axis without a label"
    assert any(ax.get_ylabel() for ax in fig.axes), f"{name}: no y label"
    named = [ax for ax in plotted if ax.get_legend() is not None] or len(fig.axes) > len(plotted)  # legend or bar
    assert named, f"{name}: nothing names what is drawn (no legend, no colour bar)"
    assert not _overlapping(fig), f"{name}: overlapping tick labels {_overlapping(fig)}"
    assert not _legend_over_labels(fig), f"{name}: a legend over {_legend_over_labels(fig)}"
    assert not [ax for ax in fig.axes if ax.get_yscale() == "log" and ax.containers], f"{name}: bars on a log axis"
    assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 0


def test_grouped_bars_name_their_intervals_and_reference(tmp_path):
    """Issue 21: the error bars say what they are in the legend, beside the modes and the reference tick."""
    labels = FIGURES["grouped_bars"](tmp_path).axes[0].get_legend_handles_labels()[1]
    assert sorted(labels) == ["95% bootstrap interval", "bm25", "hybrid", "reference"]


def test_the_memory_loop_names_every_step_and_index_without_overlaps(tmp_path):
    """Lesson 00's picture: every step of the loop and every memory type is written, no two texts overlap, and
    each write in `LOOP_STEPS` is an arrow (with one dashed arrow per index for recall)."""
    holds = {"episodic": "turns", "semantic": "facts", "procedural": "playbooks", "catalog": "shared"}
    fig = plots.memory_loop(holds, out_dir=tmp_path)
    renderer = FigureCanvasAgg(fig).get_renderer()
    texts = [t for t in fig.axes[0].texts if t.get_text()]
    written = " ".join(t.get_text() for t in texts)
    assert all(step in written for step, _ in plots.LOOP_STEPS) and all(t in written for t in holds)
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    assert not [(a, b) for (a, box_a), (b, box_b) in combinations(boxes, 2) if box_a.overlaps(box_b)]
    arrows = [t for t in fig.axes[0].texts if not t.get_text() and getattr(t, "arrow_patch", None) is not None]
    writes = sum(len(w) for _, w in plots.LOOP_STEPS)
    assert len(arrows) == (len(plots.LOOP_STEPS) - 1) + 1 + writes + len(holds)
    assert (tmp_path / "figures" / "memory_loop.png").stat().st_size > 0


def test_the_shard_map_names_every_user_and_node_and_outlines_the_hot_shard(tmp_path):
    """Lesson 15's picture: in each panel every node and every user is written, no two texts overlap (within a panel,
    nor with the titles and the legend), the hot shard alone is outlined in red, and the figure is saved."""
    routed = {"node-1": {0: {"marco": 20}}, "node-2": {1: {"sarah": 20, "tom": 20, "priya": 20}}, "node-3": {}}
    spread = {"node-1": {0: {"marco": 11, "sarah": 9, "priya": 12}}, "node-2": {1: {"sarah": 11, "tom": 8}},
              "node-3": {2: {"tom": 12, "priya": 8, "marco": 9}}}
    layouts = {"routed by user": routed, "routing_partition_size 2": spread}
    fig = plots.shard_map(layouts, hot={"routed by user": 1}, what="episodes", out_dir=tmp_path)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert len(fig.axes) == len(layouts)
    for ax, layout in zip(fig.axes, layouts.values(), strict=True):
        written = [t.get_text() for t in ax.texts]
        users = {u for shards in layout.values() for held in shards.values() for u in held}
        assert all(node in written for node in layout), written
        assert all(any(t.startswith(f"{u}: ") for t in written) for u in users), written
        texts = [t for t in ax.texts if t.get_text()] + [ax.title]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        assert not [(a, b) for (a, box_a), (b, box_b) in combinations(boxes, 2) if box_a.overlaps(box_b)]
        [suptitle] = [t.get_window_extent(renderer) for t in fig.texts if t.get_text() == fig.get_suptitle()]
        legend = fig.legends[0].get_window_extent(renderer)
        assert not [t for t, box in boxes if box.overlaps(legend) or box.overlaps(suptitle)]
    outlined = [p for ax in fig.axes for p in ax.patches if p.get_edgecolor() == to_rgba("tab:red")]
    assert len(outlined) == 1
    assert fig.get_suptitle() and (tmp_path / "figures" / "shard_map.png").stat().st_size > 0
