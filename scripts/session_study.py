"""The session pass as a study (docs/evaluation.md, "The session pass"): the default mode without and with it.

    .venv/bin/python scripts/session_study.py [--prefix-locomo eval-locomo] [--prefix-persona eval-persona]

Asks every question of LoCoMo dev and of the persona set once per arm (`atlas.research.session_study.ask_arms`)
on the prefixes `atlas eval` keeps (loading them if needed), writes the rows to outputs/eval/session_study.json and
prints the paired gains per category: all 7 conversations, and the 6 the arm was not chosen on.
"""

from __future__ import annotations

import argparse
import os

from atlas.config import REPO_ROOT
from atlas.research.datasets import PERSONA_NOW
from atlas.research.evaluate import LOCOMO_KS, PERSONA_KS, prepare_locomo, prepare_persona, write_report
from atlas.research.locomo import CATEGORY_NAMES, load_conversations
from atlas.research.session_study import ask_arms, latency, paired_table
from atlas.stack import open_store

#: The conversation the arm's settings were chosen on (atlas.research.session_study.ARMS).
CHOSEN_ON = "locomo-conv-26"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix-locomo", default="eval-locomo")
    parser.add_argument("--prefix-persona", default="eval-persona")
    args = parser.parse_args()
    locomo_store = open_store(args.prefix_locomo)
    asked, _ = prepare_locomo(locomo_store, load_conversations(), progress=False)
    persona_store = open_store(args.prefix_persona, now=lambda: PERSONA_NOW)
    persona, _ = prepare_persona(persona_store, progress=False)
    runs = {"persona": ask_arms(persona_store, persona, PERSONA_KS)}
    load = {"persona": os.getloadavg()}
    runs["locomo"] = ask_arms(locomo_store, asked, LOCOMO_KS, sessions=True)
    load["locomo"] = os.getloadavg()
    write_report({"runs": runs, "load_average": load}, REPO_ROOT / "outputs" / "eval", "session_study")
    (off, on), main = runs["locomo"].values(), list(CATEGORY_NAMES.values())[:4]
    held_out = [[row for row in rows if row["user_id"] != CHOSEN_ON] for rows in (off, on)]
    tables = [paired_table(off, on, groups=[*main, "adversarial"],
                           title="LoCoMo dev, R@10 (all = the main set and adversarial)"),
              paired_table(*held_out, groups=main, title=f"LoCoMo dev without {CHOSEN_ON}, R@10"),
              paired_table(off, on, groups=main, metric="r@5", title="LoCoMo dev, R@5"),
              paired_table(off, on, groups=main, metric="session_r@10", title="LoCoMo dev, session R@10"),
              paired_table(*runs["persona"].values(), metric="r@5", title="persona, R@5"),
              paired_table(*runs["persona"].values(), title="persona, R@10")]
    for shown in tables:
        print(shown.to_markdown(), end="\n\n")
    for data, arms in runs.items():
        print(data, {arm: latency(rows) for arm, rows in arms.items()}, "load average", load[data])


if __name__ == "__main__":
    main()
