"""Figures of the notebooks and reports: one small function per figure, each returning its `Figure`.

Every function takes `out_dir` (the outputs folder) and, when it is given, saves the figure
to `<out_dir>/figures/<name>.png` through `save`. Figures are closed after drawing, so a
notebook shows each once (as the cell's value) and long runs do not accumulate them.
Curves are computed by the package (`atlas.core.scoring`), never re-derived here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from atlas.core.clock import parse_date
from atlas.core.scoring import DEFAULT_PARAMS, ScoringParams, days, recency, use_boost

FIGURES = "figures"
DPI = 120
#: Labelled ticks of a logarithmic milliseconds axis.
LOG_TICKS = (1, 2, 5, 10, 20, 50, 100, 200, 300, 500, 1000, 2000, 5000, 10000, 20000, 50000)


def save(fig: Figure, name: str, out_dir: str | Path) -> Path:
    """Write `fig` to `<out_dir>/figures/<name>.png` (no timestamp metadata) and return the path."""
    path = Path(out_dir) / FIGURES / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return path


def _new(width: float = 7.0, height: float = 3.6) -> tuple[Figure, Axes]:
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_subplot()
    plt.close(fig)  # shown as the cell's value, not again by the inline backend
    return fig, ax


def _finish(fig: Figure, name: str, out_dir: str | Path | None) -> Figure:
    fig.tight_layout()
    if out_dir is not None:
        save(fig, name, out_dir)
    return fig


# --- decay and use ------------------------------------------------------------------------


def decay_curves(variants: Sequence[ScoringParams] = (DEFAULT_PARAMS,), *, max_age_days: float = 4000,
                 out_dir: str | Path | None = None, name: str = "decay_multiplier") -> Figure:
    """Recency multiplier (`atlas.core.scoring.recency`) against age, one curve per parameter set."""
    fig, ax = _new()
    ages = np.linspace(0, max_age_days, 400)
    for params in variants:
        label = f"offset {params.decay_offset}, scale {params.decay_scale}, {params.decay_at_scale:g} at scale"
        line, = ax.plot(ages, [recency(a, params=params) for a in ages], label=label)
        knee = days(params.decay_offset) + days(params.decay_scale)
        if knee <= max_age_days:
            ax.plot([knee], [params.decay_at_scale], "o", color=line.get_color())
    ax.set(xlabel="age (days since timestamp / last_used_at)", ylabel="recency multiplier", ylim=(0, 1.05),
           xlim=(0, max_age_days), title="Recency decay (gauss)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, name, out_dir)


def use_boost_curve(weights: Sequence[float] = (0.1, DEFAULT_PARAMS.use_count_weight, 0.4), *,
                    max_uses: int = 200, out_dir: str | Path | None = None, name: str = "use_boost") -> Figure:
    """Use-count multiplier (`atlas.core.scoring.use_boost`) of a semantic fact, one curve per weight."""
    fig, ax = _new()
    uses = np.arange(0, max_uses + 1)
    for weight in weights:
        params = DEFAULT_PARAMS.with_(use_count_weight=weight)
        ax.plot(uses, [use_boost(int(u), params=params) for u in uses], label=f"use_count_weight {weight:g}")
    ax.set(xlabel="use_count", ylabel="use multiplier", xlim=(0, max_uses), title="Use-count boost (log1p)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, name, out_dir)


# --- recall --------------------------------------------------------------------------------


def mode_ranks(ranks: Mapping[str, Mapping[str, int | None]], *, depth: int = 20, out_dir: str | Path | None = None,
               name: str = "mode_ranks", labels: Mapping[str, str] | None = None) -> Figure:
    """Rank of each question's target in each recall mode (lower is better; hatched = not in the top `depth`).

    `ranks` is `ModeComparison.ranks()` of `atlas.notebook.display`; `labels` shortens the questions.
    """
    questions = list(ranks)
    modes = list(dict.fromkeys(m for per_mode in ranks.values() for m in per_mode))
    fig, ax = _new(width=max(6.0, 2.2 * len(questions)), height=3.8)
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(questions))
    for i, mode in enumerate(modes):
        values = [ranks[q].get(mode) for q in questions]
        heights = [v if v is not None else depth + 1 for v in values]
        bars = ax.bar(x + (i - (len(modes) - 1) / 2) * width, heights, width, label=mode)
        for bar, value in zip(bars, values, strict=True):
            if value is None:
                bar.set_hatch("//")
                bar.set_alpha(0.4)
            ax.annotate(f"not in\ntop {depth}" if value is None else str(value),
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [(labels or {}).get(q, q if len(q) <= 28 else q[:27] + "…") for q in questions], fontsize=8)
    ax.set(ylabel="rank of the target (1 = first)", ylim=(0, depth + 5), title="Where each mode ranks the answer")
    locator = ax.yaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # the default AutoLocator of a linear axis
        locator.set_params(integer=True)
    ax.legend(fontsize=8, ncols=len(modes), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    return _finish(fig, name, out_dir)


def score_spread(scores: Mapping[str, Mapping[str, Sequence[float]]], *, out_dir: str | Path | None = None,
                 name: str = "score_spread") -> Figure:
    """Each path's raw `_score` of every candidate, one row per question, one panel per path, each axis from 0.

    `scores` is {path: {question: scores}} (`Hit.path_scores` of a hybrid recall): the kNN band is narrow
    where BM25's scores spread out, which is why only ranks are fused.
    """
    paths = list(scores)
    questions = list(dict.fromkeys(q for per_path in scores.values() for q in per_path))
    fig = plt.figure(figsize=(4.0 * len(paths), 0.7 * len(questions) + 1.6))
    plt.close(fig)
    for i, path in enumerate(paths, start=1):
        ax = fig.add_subplot(1, len(paths), i)
        for row, question in enumerate(questions):
            values = np.asarray(scores[path].get(question, []), dtype=float)
            ax.plot(values, np.full(len(values), row), "o", alpha=0.6, color=f"C{i - 1}",
                    label="one candidate" if row == 0 else None)
            if len(values):
                ax.annotate(f"range {values.min():.2f}-{values.max():.2f}", (0, row + 0.25), fontsize=7)
        ax.set_yticks(range(len(questions)), questions if i == 1 else [""] * len(questions), fontsize=8)
        top = max((max(v) for v in scores[path].values() if len(v)), default=1.0)
        ax.set(xlabel=f"{path} _score (raw, no unit)", xlim=(0, 1.1 * top), ylim=(-0.6, len(questions) - 0.2),
               ylabel="question" if i == 1 else "", title=f"{path}")
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Raw scores of each path's candidates (each axis from 0)")
    return _finish(fig, name, out_dir)


def scores_over_time(days_after: Sequence[float], scores: Mapping[str, Sequence[float | None]], *,
                     out_dir: str | Path | None = None, name: str = "decay_scores") -> Figure:
    """Each memory's final score (relevance times its multipliers) for recalls at `now` + days, one line each."""
    fig, ax = _new()
    years = np.asarray(days_after, dtype=float) / 365
    for i, (label, values) in enumerate(scores.items()):
        ax.plot(years, [np.nan if v is None else v for v in values], "o-" if len(years) < 30 else "-",
                markersize=3, label=label, color=f"C{i}")
    ax.set(xlabel="years after NOW (the recall's `now`)", ylabel="BM25 _score x multipliers",
           title="The same question asked later: scores as the memories age")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, name, out_dir)


def supersession_timeline(chain: Sequence[Mapping], *, now: datetime, labels: Mapping[str, str] | None = None,
                          out_dir: str | Path | None = None, name: str = "supersession_timeline") -> Figure:
    """Each fact of `chain` (`atlas.core.supersession.history` documents) as a bar from its creation to its
    supersession (or `now`), with an arrow to what retired it; harsh contradictions in red."""
    names = {doc["id"]: (labels or {}).get(doc["id"], doc["id"]) for doc in chain}
    row = {doc["id"]: i for i, doc in enumerate(chain)}
    fig, ax = _new(height=0.45 * len(chain) + 1.5)
    for doc in chain:
        start = parse_date(doc["created_at"])
        end = parse_date(doc["superseded_at"]) if doc.get("superseded_at") else now
        current = not doc.get("superseded_by")
        ax.barh(row[doc["id"]], (end - start).days, left=mdates.date2num(start), height=0.5,
                color="C0" if current else "lightgrey", edgecolor="C0")
        target = doc.get("superseded_by")
        if target in row:
            kind = next(d.get("contradiction") for d in chain if d["id"] == target)
            ax.annotate("", xy=(mdates.date2num(end), row[target]), xytext=(mdates.date2num(end), row[doc["id"]]),
                        arrowprops={"arrowstyle": "->", "color": "C3" if kind == "harsh" else "C2"})
    ax.axvline(mdates.date2num(now), color="black", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(chain)), [names[doc["id"]] for doc in chain], fontsize=8)
    ax.invert_yaxis()
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m"))
    ax.set(xlabel="date (year-month)", ylabel="fact", title="Supersession: when each fact was true in memory")
    handles = [Patch(color="C0", label="current"), Patch(facecolor="lightgrey", edgecolor="C0", label="superseded"),
               Line2D([], [], color="C2", marker=">", label="retired by (natural)"),
               Line2D([], [], color="C3", marker=">", label="retired by (harsh)"),
               Line2D([], [], color="black", linestyle=":", label="NOW")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _finish(fig, name, out_dir)


def tenant_heatmap(counts: Mapping[str, Mapping[str, Mapping[str, int]]], *, tenants: Sequence[str],
                   shared: str, out_dir: str | Path | None = None, name: str = "leak_heatmap") -> Figure:
    """Hits by tenant asking (rows) and owner of the hit (columns: the tenants, then `shared`), one panel per
    configuration (`counts` is {configuration: {tenant: {owner: hits}}}); off the diagonal is a leak."""
    owners = [*tenants, shared]
    configurations = list(counts)
    fig = plt.figure(figsize=(5.2 * len(configurations) + 1.0, 0.32 * len(tenants) + 2.4))
    plt.close(fig)
    matrices = [np.array([[counts[c].get(t, {}).get(o, 0) for o in owners] for t in tenants])
                for c in configurations]
    top = max(1, *(int(m.max()) for m in matrices))
    for i, (configuration, matrix) in enumerate(zip(configurations, matrices, strict=True), start=1):
        ax = fig.add_subplot(1, len(configurations), i)
        ax.imshow(np.ma.masked_equal(matrix, 0), cmap="viridis", vmin=0, vmax=top, aspect="auto")
        for (r, c), value in np.ndenumerate(matrix):
            if value and r != c and c < len(tenants):
                ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1))
        leaked = int(sum(matrix[r, c] for r in range(len(tenants)) for c in range(len(tenants)) if r != c))
        ax.set_xticks(range(len(owners)), owners, rotation=90, fontsize=7)
        ax.set_yticks(range(len(tenants)), tenants if i == 1 else [""] * len(tenants), fontsize=7)
        ax.set(xlabel="owner of the hit", title=f"{configuration}: {leaked} leaked hits")
        if i == 1:
            ax.set_ylabel("tenant asking")
    bar = fig.colorbar(ScalarMappable(Normalize(0, top), "viridis"), ax=fig.axes, fraction=0.03)
    bar.set_label("hits (blank: none; red box: another tenant's)")
    fig.suptitle("Whose memories each tenant's recalls returned")
    if out_dir is not None:
        save(fig, name, out_dir)
    return fig


def precision_recall(runs: Mapping[str, Mapping[str, Mapping[str, int]]], *, title: str,
                     out_dir: str | Path | None = None, name: str = "precision_recall") -> Figure:
    """Precision (matched / proposed) and recall (matched / expected) per kind, one panel each, one bar per
    proposer, each bar labelled with its counts.

    `runs` is {proposer label: {kind: {"matched", "proposed", "expected"}}}, e.g. `Evaluation.metrics()` of
    `atlas.research.consolidation_eval` for each proposer; the kinds are the first run's.
    """
    kinds = list(next(iter(runs.values())))
    fig = plt.figure(figsize=(min(12.0, max(8.0, 0.8 * len(kinds) * len(runs) + 2)), 4.0))
    plt.close(fig)  # shown as the cell's value, not again by the inline backend
    axes = fig.subplots(1, 2, sharey=True)
    width = 0.8 / len(runs)
    x = np.arange(len(kinds))
    for ax, (what, denominator) in zip(axes, (("precision", "proposed"), ("recall", "expected")), strict=True):
        for i, (label, scores) in enumerate(runs.items()):
            fractions = [(scores[k]["matched"], scores[k][denominator]) for k in kinds]
            bars = ax.bar(x + (i - (len(runs) - 1) / 2) * width, [m / d if d else 0 for m, d in fractions], width,
                          label=label)
            for bar, (m, d) in zip(bars, fractions, strict=True):
                ax.annotate(f"{m}/{d}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=7)
        ax.set_xticks(x, kinds, fontsize=8, rotation=20)
        ax.set(title=f"{what} (matched / {denominator})", xlabel="what the proposer extracts", ylim=(0, 1.45),
               yticks=np.linspace(0, 1, 6))
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("share (0-1)")
    fig.suptitle(title, fontsize=10)
    axes[1].legend(fontsize=8, loc="upper right", frameon=False)
    return _finish(fig, name, out_dir)


# --- benchmarks (atlas.research.bench) ------------------------------------------------------------------


def bench_latency(results: Mapping, *, out_dir: str | Path | None = None, name: str = "bench_recall_latency") -> Figure:
    """Recall p50 (solid, circles) and p95 (dashed, squares) per mode against corpus size, both axes logarithmic,
    beside the peers' published numbers (grey, in the legend)."""
    fig, ax = _new(width=8.0, height=4.2)
    scales = sorted(results["recall"], key=int)
    sizes = [int(s) for s in scales]
    for mode in results["recall"][scales[0]]:
        line, = ax.plot(sizes, [results["recall"][s][mode]["p50_ms"] for s in scales], "o-", label=f"{mode} p50")
        ax.plot(sizes, [results["recall"][s][mode]["p95_ms"] for s in scales], "s--", color=line.get_color(),
                alpha=0.6, label=f"{mode} p95")
    for peer, key, style in (("zep", "p50_ms", ":"), ("zep", "p95_ms", "-."), ("mem0", "p95_ms", (0, (5, 5)))):
        value = results["peers"][peer][key]
        ax.axhline(value, color="grey", linestyle=style, linewidth=1,
                   label=f"{peer} {key.removesuffix('_ms')} {value:.0f} ms (published)")
    ax.set(xscale="log", yscale="log", xticks=sizes, xticklabels=[f"{s:,}" for s in sizes],
           xlabel="memories in the index (log scale)", ylabel="recall latency (ms, log scale)",
           title=f"Recall latency against corpus size ({len(sizes)} corpora)")
    ax.minorticks_off()
    low, high = ax.get_ylim()
    top = min(t for t in LOG_TICKS if t >= high)  # the axis ends on a labelled tick above every point
    ax.set_ylim(low, top)
    ax.set_yticks([t for t in LOG_TICKS if low <= t <= top])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return _finish(fig, name, out_dir)


def bench_time_split(results: Mapping, *, out_dir: str | Path | None = None, name: str = "bench_time_split") -> Figure:
    """Mean recall time per scale and mode, stacked: query embedding, Elasticsearch, fusion, second stage, other."""
    rows = [(f"{int(s):,} {mode}", r["parts_ms"]) for s in sorted(results["recall"], key=int)
            for mode, r in results["recall"][s].items()]
    fig, ax = _new(width=max(7.0, 0.55 * len(rows)), height=4.0)
    bottom = np.zeros(len(rows))
    for part in ("embed", "es", "fusion", "second", "other"):
        values = np.array([parts.get(part, 0.0) for _, parts in rows])
        ax.bar(range(len(rows)), values, bottom=bottom, label=part)
        bottom += values
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], rotation=60, ha="right", fontsize=7)
    ax.set(xlabel="memories in the index, recall mode", ylabel="mean ms per recall",
           title="Where recall time goes")
    ax.legend(fontsize=7)
    return _finish(fig, name, out_dir)


def bench_writes_throughput(results: Mapping, *, out_dir: str | Path | None = None,
                            name: str = "bench_writes_throughput") -> Figure:
    """Left: one episode write per refresh policy (p50 bar, p95 tick) against the reference design's 100 ms, and the
    turn (a `true` write and its `pre_recall`) where the run measured it. Right: recalls per second against
    concurrent clients."""
    fig = plt.figure(figsize=(9.0, 3.6))
    plt.close(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    bars = dict(results["write"]) | ({"turn": turn} if (turn := results["write"]["true"].get("turn")) else {})
    left.bar(list(bars), [b["p50_ms"] for b in bars.values()], label="p50")
    left.plot(list(bars), [b["p95_ms"] for b in bars.values()], "k_", markersize=20, label="p95")
    left.axhline(results["peers"]["reference_design"]["max_ms"], color="grey", linestyle="--", linewidth=1,
                 label="reference design < 100 ms")
    left.set(xlabel="refresh policy (turn: write and recall)", ylabel="ms", title="Write one episode")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=3, frameon=False)
    clients = results["throughput"]["clients"]
    right.plot([int(n) for n in clients], [c["recalls_per_s"] for c in clients.values()], "o-",
               label=f"{results['throughput']['mode']}, {int(results['throughput']['scale']):,} memories")
    right.set(xlabel="concurrent clients (log scale)", ylabel="recalls per second", xscale="log",
              xticks=[int(n) for n in clients], xticklabels=list(clients), title="Throughput")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    right.grid(alpha=0.3)
    return _finish(fig, name, out_dir)


def ingest_ceiling(results: Mapping) -> float:
    """Memories per second the embedding models alone allow: a memory costs one text of each, so 1 / the sum of
    1 / each model's rate measured alone (`results["embedding"]`)."""
    return 1 / sum(1 / e["passages_per_s"] for e in results["embedding"].values())


def bench_ingest(results: Mapping, *, out_dir: str | Path | None = None, name: str = "bench_ingest") -> Figure:
    """Left: memories per second (points on a log scale) of `_bulk` with precomputed vectors per corpus, of `bulk_load`
    with both models, and the ceiling the models alone allow (`ingest_ceiling`).
    Right: each model's texts per second inside that load against alone, batched."""
    ingest, alone = results["ingest"], {n: e["passages_per_s"] for n, e in results["embedding"].items()}
    loaded = ingest["with_embedding"]
    bars = {**{f"_bulk\n{int(s):,}": rate for s, rate in ingest["without_embedding"].items()},
            "bulk_load,\nboth models": loaded["per_s"], "ceiling of\nthe models": ingest_ceiling(results)}
    fig = plt.figure(figsize=(10.0, 3.8))
    plt.close(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colors = ["tab:blue"] * len(ingest["without_embedding"]) + ["tab:orange", "tab:grey"]
    for i, (rate, color) in enumerate(zip(bars.values(), colors, strict=True)):  # points: a bar's length means
        left.plot(i, rate, "o", color=color, markersize=8)                      # nothing on a log axis
        left.annotate(f"{rate:,.0f}", (i, rate), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7)
    left.set_xticks(range(len(bars)), list(bars))
    left.set(yscale="log", ylim=(1, max(bars.values()) * 3), xlim=(-0.6, len(bars) - 0.4),
             ylabel="memories per second (log scale)", xlabel="what is loaded (_bulk: vectors precomputed, per corpus)",
             title="Memories per second")
    left.grid(axis="y", alpha=0.3)
    left.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    left.tick_params(axis="x", labelsize=7)
    models = list(loaded["stages"])
    x = np.arange(len(models))
    pairs = {"inside bulk_load": [loaded["stages"][m]["texts_per_s"] for m in models],
             "alone, batched, no cache": [alone[m] for m in models]}
    for offset, (label, values) in zip((-0.2, 0.2), pairs.items(), strict=True):
        drawn = right.bar(x + offset, values, width=0.4, label=label)
        right.bar_label(drawn, fmt="%.0f", fontsize=7)
    right.set_xticks(x, [f"{m}\n({loaded['stages'][m]['share']:.0%} of the load)" for m in models], fontsize=7)
    right.set(xlabel="embedding model", ylabel="texts per second", title="Each model inside the load and alone")
    right.legend(fontsize=7)
    return _finish(fig, name, out_dir)


# --- evaluation --------------------------------------------------------------------------------


def interval_bars(values: Mapping[str, Mapping[str, tuple[float, Sequence[float]]]], *, title: str,
                  ylabel: str = "score (0-1)",
                  out_dir: str | Path | None = None, name: str = "interval_bars") -> Figure:
    """One group per metric ({metric: {mode: (value, (low, high))}}): a bar per mode with its 95% interval drawn and
    written above it, so that close modes can be told apart (or not). The y axis starts below the lowest interval."""
    metrics = list(values)
    modes = list(dict.fromkeys(m for per_metric in values.values() for m in per_metric))
    fig, ax = _new(width=max(7.0, 2.4 * len(metrics) + 1.5), height=4.2)
    width = 0.8 / max(1, len(modes))
    x = np.arange(len(metrics))
    intervals = [v[1] for per_metric in values.values() for v in per_metric.values()]
    floor = max(0.0, np.floor(min(low for low, _ in intervals) * 10 - 1) / 10)
    for i, mode in enumerate(modes):
        offsets = x + (i - (len(modes) - 1) / 2) * width
        shown = [values[m].get(mode) for m in metrics]
        heights = [v[0] if v else np.nan for v in shown]
        yerr = np.array([[v[0] - v[1][0] if v else 0 for v in shown], [v[1][1] - v[0] if v else 0 for v in shown]])
        ax.bar(offsets, np.array(heights) - floor, width, bottom=floor, label=mode, yerr=yerr, capsize=3)
        for offset, v in zip(offsets, shown, strict=True):
            if v:
                ax.annotate(f"{v[0]:.2f}\n[{v[1][0]:.2f},\n{v[1][1]:.2f}]", (offset, v[1][1]), ha="center",
                            va="bottom", fontsize=6.5, xytext=(0, 2), textcoords="offset points")
    ax.errorbar([], [], yerr=[], fmt="none", ecolor="black", capsize=3, label="bootstrap 95% interval")
    ax.set_xticks(x, metrics, fontsize=9)
    top = min(1.0, max(high for _, high in intervals)) + 0.12
    ax.set(ylabel=f"{ylabel}; axis from {floor:.1f}" if floor else ylabel, ylim=(floor, top), title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncols=min(len(modes) + 1, 5), loc="upper center", bbox_to_anchor=(0.5, -0.1),
              frameon=False)
    return _finish(fig, name, out_dir)


def grouped_bars(values: Mapping[str, Mapping[str, float]], *, reference: Mapping[str, float] | None = None,
                 reference_label: str = "reference", errors: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
                 errors_label: str = "95% bootstrap interval", title: str = "", xlabel: str = "", ylabel: str = "",
                 out_dir: str | Path | None = None, name: str = "grouped_bars") -> Figure:
    """One group of bars per key of `values` ({group: {series: value}}), a black tick per group for `reference`.

    `errors` ({group: {series: (low, high)}}) draws each bar's interval, named `errors_label` in the legend.
    Used for recall per memory type or category and mode (`atlas.research.evaluate.metric_by_group`).
    """
    groups = list(values)
    series = list(dict.fromkeys(s for per_group in values.values() for s in per_group))
    fig, ax = _new(width=max(6.0, 1.3 * len(groups) + 2), height=3.8)
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, label in enumerate(series):
        heights = [values[g].get(label, np.nan) for g in groups]
        offsets = x + (i - (len(series) - 1) / 2) * width
        yerr = None
        if errors is not None:
            bounds = [errors.get(g, {}).get(label) for g in groups]
            yerr = np.array([[h - b[0] if b else 0 for h, b in zip(heights, bounds, strict=True)],
                             [b[1] - h if b else 0 for h, b in zip(heights, bounds, strict=True)]])
        ax.bar(offsets, heights, width, label=label, yerr=yerr, capsize=2 if yerr is not None else 0)
    if errors is not None:
        ax.errorbar([], [], yerr=[], fmt="none", ecolor="black", capsize=2, label=errors_label)
    if reference:
        marked = [(i, reference[g]) for i, g in enumerate(groups) if g in reference]
        ax.hlines([v for _, v in marked], [i - 0.45 for i, _ in marked], [i + 0.45 for i, _ in marked],
                  colors="black", linewidth=2, label=reference_label)
    ax.set_xticks(x, groups, fontsize=9)
    ax.set(xlabel=xlabel, ylabel=ylabel, ylim=(0, 1.05), title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # clear of the x label
    return _finish(fig, name, out_dir)


# --- the on-ramp -------------------------------------------------------------------------------

#: The agent's loop, one box per step, in the order a turn runs them, and the memory types each step writes.
LOOP_STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("1  the user's message arrives", ()),
    ("2  stored verbatim as an episode,\n    before the model answers", ("episodic",)),
    ("3  recall on the message: BM25 + kNN\n    over all four indices, RRF, second stage", ()),
    ("4  the memories go into the prompt;\n    the model answers", ()),
    ("5  the model's tools write a fact,\n    or supersede one it contradicts", ("semantic",)),
    ("6  later, offline: consolidation turns\n    episodes into facts and playbooks", ("semantic", "procedural")),
)


def memory_loop(indices: Mapping[str, str], *, out_dir: str | Path | None = None,
                name: str = "memory_loop") -> Figure:
    """The agent's loop (`LOOP_STEPS`) beside the indices it reads and writes ({memory type: what it holds},
    in drawing order): each write is an arrow to its index, and recall reads them all."""
    fig = plt.figure(figsize=(10.0, 5.8))
    ax = fig.add_axes((0, 0, 1, 0.9))
    plt.close(fig)
    ax.set(xlim=(0, 10), ylim=(0, 6.9))
    ax.axis("off")

    def box(x: float, y: float, width: float, text: str, colour: str) -> None:
        ax.add_patch(FancyBboxPatch((x, y - 0.36), width, 0.72, boxstyle="round,pad=0.04", facecolor=colour,
                                    edgecolor="0.2"))
        ax.text(x + 0.12, y, text, va="center", fontsize=9)

    step_y = [6.0 - i * 1.05 for i in range(len(LOOP_STEPS))]
    ax.text(0.4, 6.65, "the agent, each turn", fontsize=10, weight="bold")
    for i, (text, _) in enumerate(LOOP_STEPS):
        box(0.4, step_y[i], 4.0, text, "#eef3fb")
        if i:
            ax.annotate("", (1.3, step_y[i] + 0.4), (1.3, step_y[i - 1] - 0.4),
                        arrowprops={"arrowstyle": "->", "color": "0.3"})
    ax.annotate("", (0.35, step_y[0]), (0.35, step_y[-1]),
                arrowprops={"arrowstyle": "->", "color": "0.5", "connectionstyle": "bar,fraction=-0.06"})
    ax.text(0.02, (step_y[0] + step_y[-1]) / 2, "next turn", rotation=90, va="center", fontsize=8, color="0.3")
    index_y = {t: 5.8 - i * 1.45 for i, t in enumerate(indices)}
    ax.text(6.4, 6.65, "Elasticsearch, one index per memory type", fontsize=10, weight="bold")
    for memory_type, holds in indices.items():
        box(6.4, index_y[memory_type], 3.5, f"{memory_type}\n{holds}", "#fdf3e1")
    for i, (_, writes) in enumerate(LOOP_STEPS):
        for memory_type in writes:
            ax.annotate("", (6.35, index_y[memory_type]), (4.45, step_y[i]),
                        arrowprops={"arrowstyle": "->", "color": "tab:orange"})
    for memory_type in indices:
        ax.annotate("", (4.45, step_y[2]), (6.35, index_y[memory_type]),
                    arrowprops={"arrowstyle": "->", "color": "tab:blue", "linestyle": "--"})
    ax.legend(handles=[Line2D([], [], color="tab:orange", label="writes"),
                       Line2D([], [], color="tab:blue", linestyle="--", label="recall reads")],
              loc="lower right", fontsize=8, frameon=False)
    fig.suptitle("One turn of an agent with Atlas's memory, and the indices it reads and writes")
    if out_dir is not None:
        save(fig, name, out_dir)
    return fig


# --- the cluster -------------------------------------------------------------------------------

#: {node: {shard number: {user: documents}}}: the primary shards of one index on each node, and whose documents each
#: primary holds (a node that holds no primary of the index maps to {}).
ShardLayout = Mapping[str, Mapping[int, Mapping[str, int]]]


def shard_map(layouts: Mapping[str, ShardLayout], *, hot: Mapping[str, int] | None = None, what: str = "documents",
              out_dir: str | Path | None = None, name: str = "shard_map") -> Figure:
    """The primary shards of one index as boxes under the node that holds each, every box listing the users whose
    documents it holds (and how many), one panel per layout (`layouts` is {panel title: `ShardLayout`}, e.g. the
    same users routed to one shard each, then spread by `routing_partition_size`). `hot` ({panel title: shard})
    outlines a shard in red; each user keeps one colour in every panel."""
    line, column, gap = 0.2, 1.75, 0.35  # inches: one text line, one node's column, between panels
    users = list(dict.fromkeys(u for layout in layouts.values() for shards in layout.values()
                               for held in shards.values() for u in held))
    palette = ("C0", "C1", "C2", "C4", "C5", "C6", "C8", "C9")  # no red: red marks the hot shard
    colour = {user: palette[i % len(palette)] for i, user in enumerate(users)}

    def height(held: Mapping[str, int]) -> float:  # in lines: the shard's own line, one per user, a margin
        return 1 + max(1, len(held)) + 0.6

    rows = 2.0 + max((sum(height(held) + 0.5 for held in shards.values()) or 1.5)
                     for layout in layouts.values() for shards in layout.values())
    widths = [column * max(1, len(layout)) for layout in layouts.values()]
    top, bottom = 0.8, 0.5  # inches above the panels (titles) and below them (the legend)
    fig_w, fig_h = 0.4 + sum(widths) + gap * (len(widths) - 1), rows * line + top + bottom
    fig = plt.figure(figsize=(fig_w, fig_h))
    plt.close(fig)  # shown as the cell's value, not again by the inline backend
    left = 0.2
    for (title, layout), width in zip(layouts.items(), widths, strict=True):
        ax = fig.add_axes((left / fig_w, bottom / fig_h, width / fig_w, rows * line / fig_h))
        left += width + gap
        ax.set(xlim=(0, max(1, len(layout))), ylim=(0, rows))
        ax.axis("off")
        ax.set_title(title, fontsize=9)
        for x, (node, shards) in enumerate(layout.items()):
            ax.text(x + 0.5, rows - 0.7, node, ha="center", va="center", fontsize=9, weight="bold")
            y = rows - 1.6
            if not shards:
                ax.text(x + 0.5, y - 0.5, "no primary here", ha="center", va="center", fontsize=8, color="0.4")
            for shard, held in sorted(shards.items()):
                is_hot = (hot or {}).get(title) == shard
                box = height(held)
                ax.add_patch(FancyBboxPatch((x + 0.06, y - box), 0.88, box, boxstyle="round,pad=0.02",
                                            facecolor="#fde2e1" if is_hot else "#eef3fb",
                                            edgecolor="tab:red" if is_hot else "0.3", linewidth=2 if is_hot else 1))
                ax.text(x + 0.12, y - 0.8, f"shard {shard}: {sum(held.values())} {what}", va="center", fontsize=8,
                        weight="bold")
                for i, (user, count) in enumerate(sorted(held.items(), key=lambda item: (-item[1], item[0]))):
                    ax.text(x + 0.18, y - 1.8 - i, f"{user}: {count}", va="center", fontsize=8, color=colour[user])
                if not held:
                    ax.text(x + 0.18, y - 1.8, f"no {what}", va="center", fontsize=8, color="0.4")
                y -= box + 0.5
    handles = [Patch(facecolor="#eef3fb", edgecolor="0.3", label=f"primary shard: its users' {what}")]
    if hot:
        handles.append(Patch(facecolor="#fde2e1", edgecolor="tab:red", label="hot shard"))
    fig.legend(handles=handles, loc="lower center", ncols=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"Where each user's {what} live: primary shards by node")
    if out_dir is not None:
        save(fig, name, out_dir)
    return fig
