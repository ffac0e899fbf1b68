"""How well a consolidation proposer does on the labelled set in data/consolidation/ (precision and recall).

The set is loaded into a store (seed facts, playbooks, episodes: the persona corpus
format), each user is consolidated as a dry run (proposer and guards, nothing written),
and what the guards accepted is matched one-to-one with the labels:

- a fact matches a labelled fact of the same user when they share a supporting episode
  and their cosine (`CONSOLIDATION_EMBEDDER`) is at least `CONSOLIDATION_MATCH_SIMILARITY`;
- an outcome update matches on (playbook, worked or not);
- a new playbook matches when it cites one of the labelled playbook's episodes.

Supersession (same retired facts and kind) and refined steps are scored on the matches. The guided proposer's
supersession questions are also scored each on its own, on the labelled facts (`evaluate_questions`).
The scores of each run (a proposer, and the model it asked), the command that produced them and the tolerance are
in data/consolidation/metrics.json (`record`); tests assert against that file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from atlas import constants as C
from atlas.consolidation.consolidate import Decision, Watermark, consolidate, read_batch, similarity_of
from atlas.consolidation.proposers import GuidedProposer, Proposer, Similarity
from atlas.core.store import Store
from atlas.research.datasets import REPO_ROOT, KeyMap, load_once, persona_document, read_jsonl

CONSOLIDATION_DIR = REPO_ROOT / "data" / "consolidation"
METRICS_FILE = "metrics.json"


def load_consolidation_set(store: Store, path: Path = CONSOLIDATION_DIR, *, progress: bool = False) -> KeyMap:
    """Seed facts, playbooks and episodes of the labelled set; idempotent (`datasets.load_once`)."""
    corpus = read_jsonl(Path(path) / "corpus.jsonl")
    return load_once(store, [persona_document(raw) for raw in corpus], f"the consolidation set ({path})",
                     progress=progress)


def read_labels(path: Path = CONSOLIDATION_DIR) -> list[dict]:
    return read_jsonl(Path(path) / "expected.jsonl")


def read_expected_metrics(path: Path = CONSOLIDATION_DIR) -> dict:
    return json.loads((Path(path) / METRICS_FILE).read_text())


def run_key(proposer: str, model: str | None) -> str:
    """A run's key in metrics.json: the proposer, and the model it asked if any ("guided on smollm2-135m")."""
    return proposer if model is None else f"{proposer} on {model}"


def record(result: Evaluation, *, today: str, path: Path = CONSOLIDATION_DIR) -> Path:
    """Write a run's scores (precision, recall and the counts they are made of) into metrics.json, under its
    `run_key`; the runs of other proposers and models stay."""
    data = read_expected_metrics(path)
    command = f"atlas consolidate --evaluate --proposer {result.proposer}"
    data["runs"][run_key(result.proposer, result.model)] = {
        "proposer": result.proposer, "model": result.model,
        "command": command if result.model is None else f"ATLAS_LLM_MODEL={result.model} {command}",
        "recorded": today, "scores": result.metrics(),
        **({"questions": result.question_metrics()} if result.questions else {})}
    target = Path(path) / METRICS_FILE
    target.write_text(json.dumps(data, indent=2) + "\n")
    return target


def compare(result: Evaluation, path: Path = CONSOLIDATION_DIR) -> list[str]:
    """What differs from the run's recorded precision and recall by more than the file's tolerance (a proposer
    and model with no record is one problem)."""
    data = read_expected_metrics(path)
    key = run_key(result.proposer, result.model)
    if (recorded := data["runs"].get(key)) is None:
        return [f"no recorded scores for {key!r} in {Path(path) / METRICS_FILE}"]
    measured = result.metrics() | result.question_metrics()
    return [f"{part} {name}: {measured[part][name]:.4f}, recorded {scores[name]:.4f} (tolerance {data['tolerance']})"
            for part, scores in (recorded["scores"] | recorded.get("questions", {})).items()
            for name in ("precision", "recall") if abs(measured[part][name] - scores[name]) > data["tolerance"]]


def mean_score(run: Mapping) -> float:
    """The mean of a recorded run's precisions and recalls over every kind: how proposers are ranked."""
    return sum(s[m] for s in run["scores"].values() for m in ("precision", "recall")) / (2 * len(run["scores"]))


def markdown_table(path: Path = CONSOLIDATION_DIR) -> str:
    """Every recorded run as a Markdown table, each cell "precision (matched/proposed), recall (matched/expected)"
    (docs/llm.md quotes it; a test keeps the two equal)."""
    runs = read_expected_metrics(path)["runs"]
    parts = list(next(iter(runs.values()))["scores"])
    rows = ["| proposer | model | " + " | ".join(parts) + " | mean |", "|---|---|" + "---|" * (len(parts) + 1)]
    for run in runs.values():
        cells = [f"P {s['precision']:.2f} ({s['matched']}/{s['proposed']}), R {s['recall']:.2f} "
                 f"({s['matched']}/{s['expected']})" for s in (run["scores"][part] for part in parts)]
        rows.append(f"| {run['proposer']} | {run['model'] or 'none'} | " + " | ".join(cells)
                    + f" | {mean_score(run):.2f} |")
    return "\n".join(rows)


def questions_table(path: Path = CONSOLIDATION_DIR) -> str:
    """The recorded `evaluate_questions` scores of every run that has them, as a Markdown table (docs/llm.md)."""
    runs = [run for run in read_expected_metrics(path)["runs"].values() if "questions" in run]
    parts = list(runs[0]["questions"])
    rows = ["| proposer | model | " + " | ".join(parts) + " |", "|---|---|" + "---|" * len(parts)]
    rows += [f"| {run['proposer']} | {run['model']} | " + " | ".join(
        f"P {s['precision']:.2f} ({s['matched']}/{s['proposed']}), R {s['recall']:.2f} ({s['matched']}/{s['expected']})"
        for s in (run["questions"][part] for part in parts)) + " |" for run in runs]
    return "\n".join(rows)


@dataclass
class Score:
    matched: int = 0
    proposed: int = 0
    expected: int = 0

    @property
    def precision(self) -> float:
        return self.matched / self.proposed if self.proposed else 0.0

    @property
    def recall(self) -> float:
        return self.matched / self.expected if self.expected else 0.0

    def as_dict(self) -> dict:
        return {"precision": round(self.precision, 4), "recall": round(self.recall, 4), "matched": self.matched,
                "proposed": self.proposed, "expected": self.expected}


@dataclass
class Evaluation:
    proposer: str
    #: The model the proposer asked (None for the rules).
    model: str | None
    facts: Score
    outcomes: Score
    playbooks: Score
    #: Labelled supersessions whose matched fact retired exactly the same facts, with the same kind.
    supersessions: Score
    #: Labelled failures with refined steps whose matched outcome has refined steps.
    refined: Score
    #: One row per accepted proposal and per missed label (for a table).
    rows: list[dict] = field(default_factory=list)
    #: The model's questions each on its own (`evaluate_questions`); empty for a proposer that asks none.
    questions: dict[str, Score] = field(default_factory=dict)

    def metrics(self) -> dict:
        return {name: getattr(self, name).as_dict() for name in ("facts", "outcomes", "playbooks", "supersessions",
                                                                   "refined")}

    def question_metrics(self) -> dict:
        return {name: score.as_dict() for name, score in self.questions.items()}

    def summary_rows(self) -> list[dict]:
        return [{"what": name, **{k: v for k, v in score.items()}} for name, score in self.metrics().items()]


def _keys(ids: Iterable[str], key_of: Mapping[str, str]) -> set[str]:
    return {key_of.get(i, i) for i in ids}


def match_facts(proposed: Sequence[dict], labels: Sequence[dict], similarity: Similarity,
                threshold: float) -> list[tuple[int, int]]:
    """Greedy one-to-one matching, most similar first, of (proposal, label) pairs of the same user sharing an
    episode."""
    pairs = []
    for i, p in enumerate(proposed):
        candidates = [j for j, e in enumerate(labels)
                      if e["user_id"] == p["user_id"] and set(e["supporting_episode_keys"]) & set(p["episodes"])]
        if candidates:
            scores = similarity(p["text"], [labels[j]["text"] for j in candidates])
            pairs += [(float(s), i, j) for s, j in zip(scores, candidates, strict=True) if s >= threshold]
    used_p, used_e, matches = set(), set(), []
    for _, i, j in sorted(pairs, reverse=True):
        if i not in used_p and j not in used_e:
            used_p.add(i)
            used_e.add(j)
            matches.append((i, j))
    return matches


def evaluate(store: Store, proposer: Proposer, path: Path = CONSOLIDATION_DIR, *,
             match_similarity: float = C.CONSOLIDATION_MATCH_SIMILARITY, progress: bool = False) -> Evaluation:
    """Dry-run consolidation of every user of the set and the scores of what the guards accepted."""
    ids = load_consolidation_set(store, path, progress=progress)
    key_of = {doc_id: key for key, doc_id in ids.items()}
    labels = read_labels(path)
    accepted: list[tuple[str, Decision]] = []
    for user_id in tqdm(sorted({label["user_id"] for label in labels}), desc="users", disable=not progress):
        report = consolidate(store, user_id, proposer=proposer, dry_run=True)
        accepted += [(user_id, d) for d in report.accepted]
    by_kind = {kind: [(u, d) for u, d in accepted if d.kind == kind] for kind in ("fact", "outcome", "playbook")}
    want = {kind: [label for label in labels if label["kind"] == kind] for kind in ("fact", "outcome", "playbook")}
    rows: list[dict] = []

    facts = [{"user_id": u, "text": d.proposal["text"], "episodes": _keys(d.proposal["supporting_episode_ids"], key_of),
              "supersedes": _keys(d.proposal["supersedes_id"], key_of), "contradiction": d.proposal["contradiction"]}
             for u, d in by_kind["fact"]]
    fact_matches = dict(match_facts(facts, want["fact"], similarity_of(store), match_similarity))
    supersessions = Score(expected=sum(1 for e in want["fact"] if e.get("supersedes_keys")))
    supersessions.proposed = sum(1 for f in facts if f["supersedes"])
    for i, fact in enumerate(facts):
        label = want["fact"][fact_matches[i]] if i in fact_matches else None
        if label and label.get("supersedes_keys") and fact["supersedes"] == set(label["supersedes_keys"]) \
                and fact["contradiction"] == label.get("contradiction"):
            supersessions.matched += 1
        rows.append({"user": fact["user_id"], "kind": "fact", "proposed": fact["text"],
                     "label": label["text"] if label else "", "verdict": "match" if label else "false positive"})
    matched_labels = set(fact_matches.values())
    rows += [{"user": e["user_id"], "kind": "fact", "proposed": "", "label": e["text"], "verdict": "missed"}
             for j, e in enumerate(want["fact"]) if j not in matched_labels]

    outcomes = Score(proposed=len(by_kind["outcome"]), expected=len(want["outcome"]))
    refined = Score(expected=sum(1 for e in want["outcome"] if e["refined"]))
    refined.proposed = sum(1 for _, d in by_kind["outcome"] if d.proposal["refined_steps"])
    open_labels = list(want["outcome"])
    for user_id, d in by_kind["outcome"]:
        key = key_of.get(d.proposal["playbook_id"], d.proposal["playbook_id"])
        label = next((e for e in open_labels if e["user_id"] == user_id and e["playbook_key"] == key
                      and e["success"] == d.proposal["success"]), None)
        if label is not None:
            open_labels.remove(label)
            outcomes.matched += 1
            refined.matched += int(label["refined"] and bool(d.proposal["refined_steps"]))
        rows.append({"user": user_id, "kind": "outcome",
                     "proposed": f"{key}: {'worked' if d.proposal['success'] else 'did not work'}"
                                 + (" (refined)" if d.proposal["refined_steps"] else ""),
                     "label": "same" if label else "", "verdict": "match" if label else "false positive"})
    rows += [{"user": e["user_id"], "kind": "outcome", "proposed": "",
              "label": f"{e['playbook_key']}: {'worked' if e['success'] else 'did not work'}", "verdict": "missed"}
             for e in open_labels]

    playbooks = Score(proposed=len(by_kind["playbook"]), expected=len(want["playbook"]))
    open_playbooks = list(want["playbook"])
    for user_id, d in by_kind["playbook"]:
        episodes = _keys(d.proposal["supporting_episode_ids"], key_of)
        label = next((e for e in open_playbooks if e["user_id"] == user_id
                      and set(e["supporting_episode_keys"]) & episodes), None)
        if label is not None:
            open_playbooks.remove(label)
            playbooks.matched += 1
        rows.append({"user": user_id, "kind": "playbook", "proposed": d.proposal["name"],
                     "label": label["name"] if label else "", "verdict": "match" if label else "false positive"})
    rows += [{"user": e["user_id"], "kind": "playbook", "proposed": "", "label": e["name"], "verdict": "missed"}
             for e in open_playbooks]

    return Evaluation(proposer.name, getattr(proposer, "model", None),
                      Score(len(fact_matches), len(facts), len(want["fact"])), outcomes, playbooks, supersessions,
                      refined, rows,
                      evaluate_questions(store, proposer, path) if isinstance(proposer, GuidedProposer) else {})


def evaluate_questions(store: Store, proposer: GuidedProposer, path: Path = CONSOLIDATION_DIR) -> dict[str, Score]:
    """The guided proposer's supersession questions, each on its own: asked about the labelled facts, not the
    model's own extractions, so that a fact it failed to extract does not count against them.

    - `pick_untrue`: for every labelled fact, which of the current facts shown to the model it makes untrue,
      against the labelled ones (a match per retired fact; a fact that retires nothing should get an empty answer);
    - `classify_contradiction`: natural or harsh, for every labelled supersession.

    Extraction and the outcome question are the `facts` and `outcomes` of `evaluate`. Needs the set loaded.
    """
    ids = load_consolidation_set(store, path)
    key_of = {doc_id: key for key, doc_id in ids.items()}
    labels = [label for label in read_labels(path) if label["kind"] == "fact"]
    picked, classified = Score(), Score()
    for user_id in sorted({label["user_id"] for label in labels}):
        batch = read_batch(store, user_id, Watermark())
        episodes = {key_of.get(e.id, e.id): e for e in batch.episodes}
        for label in (label for label in labels if label["user_id"] == user_id):
            retired = set(label.get("supersedes_keys", []))
            said = _keys([fact.id for fact in proposer.untrue(batch, label["text"])], key_of)
            picked.matched, picked.proposed = picked.matched + len(said & retired), picked.proposed + len(said)
            picked.expected += len(retired)
            if retired:
                kind = proposer.contradiction(episodes[label["supporting_episode_keys"][0]], label["text"])
                classified.expected += 1
                classified.proposed += kind is not None
                classified.matched += kind == label["contradiction"]
    return {"pick_untrue": picked, "classify_contradiction": classified}
