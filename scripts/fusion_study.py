"""Fusion as a study (docs/evaluation.md): RRF, weighted z-score and convex combination, on LoCoMo dev and persona.

    .venv/bin/python scripts/fusion_study.py [--prefix-locomo eval-locomo] [--prefix-persona eval-persona]

Recalls every question once per set on the prefixes `atlas eval` keeps (loading them if needed), then replays
each fusion offline (`atlas.research.fusion_study`); prints one table for `hybrid` and one for the default mode.
"""

from __future__ import annotations

import argparse

from atlas.research.datasets import PERSONA_NOW
from atlas.research.evaluate import prepare_locomo, prepare_persona
from atlas.research.fusion_study import capture, study, study_table
from atlas.research.locomo import load_conversations
from atlas.stack import open_store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-locomo", default="eval-locomo")
    parser.add_argument("--prefix-persona", default="eval-persona")
    args = parser.parse_args()
    locomo_store = open_store(args.prefix_locomo)
    asked, _ = prepare_locomo(locomo_store, load_conversations(), progress=False)
    persona_store = open_store(args.prefix_persona, now=lambda: PERSONA_NOW)
    persona, _ = prepare_persona(persona_store, progress=False)
    locomo_candidates, persona_candidates = capture(locomo_store, asked), capture(persona_store, persona)
    for second_stage, mode in ((False, "hybrid"), (True, "hybrid+rerank")):
        rows = study(locomo_candidates, persona_candidates, second_stage=second_stage)
        print(study_table(rows, title=f"{mode}: LoCoMo dev main set out of fold, persona at the weight chosen on "
                                      "LoCoMo").to_markdown(), end="\n\n")


if __name__ == "__main__":
    main()
