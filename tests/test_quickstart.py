"""`bertforge quickstart` runs every stage for real; its data subsets are representative."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from bertforge.data.bundled import supersense_path
from bertforge.quickstart import QuickstartPlan, run_quickstart, write_supersense_subsets


def test_supersense_subsets_are_spread_over_the_whole_split(tmp_path: Path) -> None:
    plan = QuickstartPlan(out_dir=tmp_path, train_rows=3000, validation_rows=500, test_rows=2000)
    paths = write_supersense_subsets(plan)
    with gzip.open(supersense_path("test"), "rt", encoding="utf-8") as handle:
        full = Counter(json.loads(line)["label"].split(".")[0] for line in handle)
    subset = Counter(json.loads(line)["label"].split(".")[0] for line in paths["test"].read_text().splitlines())
    assert sum(subset.values()) == 2000
    for pos, count in full.items():  # every part of speech in about its share of the split
        assert subset[pos] / 2000 == pytest.approx(count / sum(full.values()), abs=0.02)


@pytest.mark.slow
def test_quickstart_runs_every_stage_on_a_small_plan(tmp_path: Path) -> None:
    plan = QuickstartPlan(out_dir=tmp_path / "qs", pretrain_steps=8, train_rows=256, validation_rows=64,
                          test_rows=64, finetune_epochs=1, minilm_epochs=1)
    results = run_quickstart(plan)
    assert [r.name for r in results] == ["majority class", "tiny BERT, pre-trained", "tiny BERT, no pre-training",
                                         "all-MiniLM-L6-v2"]
    assert all(r.test_accuracy is not None and 0.0 <= r.test_accuracy <= 1.0 for r in results)
    for result in results[1:]:
        assert (result.run_dir / "final" / "config.json").is_file()
        assert (result.run_dir / "test_results.json").is_file()
        assert (result.run_dir / "plots" / "loss.png").is_file()
    assert (plan.out_dir / "pretrain" / "final" / "model.safetensors").is_file()
    assert (plan.out_dir / "pretrain" / "plots" / "mlm_accuracy.png").is_file()
