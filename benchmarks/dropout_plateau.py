#!/usr/bin/env python3
"""Why the budget recipe's model fine-tuned to the majority class (issue 40, items 1 and 2).

Step-matched arms (`benchmarks.ttq.step_matched.ARMS`) pre-train bert-mini on one corpus (tech-dictionaries by
default: text neither downstream task is drawn from) with `time_to_quality.py`'s tokenizer and prepared data, each
exporting every `--every` steps. `--stage train` trains the arms named (one process per call: run two calls side
by side at most); `--stage score` measures every export of every trained arm (MLM accuracy on fixed masks against
the unigram baseline, `benchmarks.common.features` diagnostics) and fine-tunes the exports of `--fine-tune-steps`
(`final` by default; `untrained` is bert-mini's random weights, step 0) on supersense over the lr x dropout grid,
then writes `benchmarks/results/dropout_plateau.json` and `dropout_plateau_summary.md` (`--report-name`).
`--max-steps N` stops each trained recipe arm after N steps (its schedule still planned for the arm's steps);
`--stage seeds` summarizes the scored arms over `--seeds` (mean ± sd); `--stage cost` times the arms' steps in one
process, alternating.

    .venv/bin/python benchmarks/dropout_plateau.py --stage train --arms recipe
    .venv/bin/python benchmarks/dropout_plateau.py --stage train --arms recipe-dropout
    .venv/bin/python benchmarks/dropout_plateau.py --stage score --arms recipe,recipe-dropout,untrained \
        --finetune-rows 2000,1000 --fine-tune-steps 100,1254,0    # the single-seed run (benchmarks/results/HISTORY.md)
    # the 3-seed, 300-step runs in docs/benchmarks.md, "Why the budget recipe fine-tuned to the majority class"
    .venv/bin/python benchmarks/dropout_plateau.py --stage train --arms recipe --seed 2 --max-steps 300 --every 50
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/dropout_plateau.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])


from benchmarks.ttq.plateau_study import main

if __name__ == "__main__":
    main()
