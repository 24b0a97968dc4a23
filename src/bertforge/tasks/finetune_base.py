"""The steps every fine-tuning kind shares, in one small base: its siblings (`classify.py`, `tagging.py`,
`embedding.py`) add only their data, head, loss and metrics.

Shared: the tokenizer and model reference resolution (`model.init_from`, `model.tokenizer`), the data
files' resolution, the seeded validation sample, the `train.best_metric` check, checkpoints as model
directories, and the end of a run: each final split evaluated with the best weights, its report
written into the run directory, then `final/` exported in the format the kind's record names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from bertforge.config import FinetuneSection
from bertforge.console import log
from bertforge.data.validation_subset import ValidationSubset, sample_rows, subset_of_split
from bertforge.errors import ConfigError
from bertforge.locate import resolve_data_file, resolve_model, resolve_model_path, tokenizer_dir_for
from bertforge.tasks.evaluation import EvaluationReport, metrics_line, write_evaluation
from bertforge.tasks.metrics import best_mode
from bertforge.train.task import Task


class FinetuneTask(Task):
    """A fine-tuning kind's `Task`, less what makes it that kind: `build_datasets`, `build_model`,
    `forward_step`, `metric_names`, `evaluate`, `final_splits`, `evaluate_split` (and `show_report`)."""

    examples = "examples"  # what one row of the kind is called in the log: examples, sentences, pairs

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._tokenizer_dir: Path | None = None
        self._tokenizer_tokens: int | None = None
        self.validation_subset: ValidationSubset | None = None
        self.validation_rows: Any = None  # the split (or subset) the evaluations during training score

    # --- data -----------------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.output_dir) / self.config.run.name

    def tokenizer_dir(self) -> Path:
        """`model.tokenizer`, else the tokenizer that comes with `model.init_from`; found once (every
        checkpoint's model directory copies it, and resolving `init_from` may read run configs)."""
        if self._tokenizer_dir is None:
            self._tokenizer_dir = self._find_tokenizer_dir()
        return self._tokenizer_dir

    def tokenizer_tokens(self) -> int:
        """How many token ids `tokenizer_dir()`'s tokenizer gives: the size of a new model's embedding table and
        the least an imported model's must have; the tokenizer is read once for both."""
        if self._tokenizer_tokens is None:
            from bertforge.data.tokenizer import load_tokenizer

            self._tokenizer_tokens = load_tokenizer(self.tokenizer_dir()).vocab_size
        return self._tokenizer_tokens

    def _find_tokenizer_dir(self) -> Path:
        section = self.config.model
        if section.tokenizer:
            return resolve_model_path(section.tokenizer)
        if section.init_from:
            found = tokenizer_dir_for(resolve_model(section.init_from))
            if found is not None:
                return found
            raise ConfigError(f"model.init_from {section.init_from} comes without a tokenizer; set model.tokenizer "
                              "to the tokenizer directory it was trained with")
        raise ConfigError("a model trained from scratch needs model.tokenizer (a tokenizer directory, e.g. from "
                          "`bertforge tokenizer train`), or set model.init_from to a pre-trained model")

    def _with_resolved_files(self) -> FinetuneSection:
        """`finetune.*` with its data files resolved (bundled sample names, `~`, fsspec URLs)."""
        section = self.config.finetune
        return dataclasses.replace(section, train_file=resolve_data_file(section.train_file),
                                   validation_file=resolve_data_file(section.validation_file),
                                   test_file=resolve_data_file(section.test_file))

    def draw_validation(self, split: Any, strata: Sequence[Hashable] | None, stratified_by: str) -> Any:
        """The rows of the validation split that evaluations score: `data.validation_samples` of them as a
        seeded sample, stratified by `strata` (one key per row) when given; all of them without a cap."""
        limit, seed = self.config.data.validation_samples, self.config.run.seed
        rows = sample_rows(len(split), limit, seed, strata)
        self.validation_subset = ValidationSubset(rows, len(split), seed,
                                                  stratified_by if strata is not None else None)
        if not self.validation_subset.is_whole_split:
            log.info(f"validation: {len(rows):,} of {len(split):,} rows (data.validation_samples), a seeded "
                     f"{'sample stratified by ' + stratified_by if strata is not None else 'sample'}")
        return subset_of_split(split, self.validation_subset)

    def _check_best_metric(self) -> None:
        """Before the first step: a misspelt or wrong-way `train.best_metric` is a config error, not a
        run that keeps the wrong checkpoint. Needs the data read (`metric_names` may depend on it)."""
        metric = self.config.train.best_metric
        if metric is None:
            return
        available = self.metric_names()
        if metric not in available:
            raise ConfigError(f"train.best_metric is {metric!r}, which {self.config.finetune.task_type} evaluation "
                              "does not report; "
                              f"choose one of {', '.join(sorted(available))}")
        if self.config.train.best_mode != best_mode(metric):  # it would keep the worst checkpoint
            raise ConfigError(f"train.best_mode is {self.config.train.best_mode} but a better {metric} is "
                              f"{'larger' if best_mode(metric) == 'max' else 'smaller'}; set "
                              f"train.best_mode={best_mode(metric)}")

    def metric_names(self) -> set[str]:
        raise NotImplementedError

    # --- model ----------------------------------------------------------------------------------

    def _check_model_fits_input(self, model: nn.Module) -> None:
        """The model has a position for `finetune.max_length` tokens and an embedding for every token id the
        tokenizer gives (an id past the table is an opaque IndexError in the middle of the first step)."""
        positions = model.config.max_sequence_length
        if model.config.position == "learned" and self.config.finetune.max_length > positions:
            raise ConfigError(f"finetune.max_length is {self.config.finetune.max_length} but the model has learned "
                              f"positions for {positions} tokens; set finetune.max_length <= {positions}")
        tokens = self.tokenizer_tokens()
        if model.config.vocab_size < tokens:
            section = self.config.model
            tokenizer = f"model.tokenizer ({section.tokenizer})" if section.tokenizer else "its tokenizer"
            if section.init_from:
                raise ConfigError(f"model.init_from ({section.init_from}) has {model.config.vocab_size} token embeddings "
                                  f"but {tokenizer} has {tokens} tokens; use the tokenizer the model was trained with "
                                  "(leave model.tokenizer unset to take the one saved with it)")
            raise ConfigError(f"model.vocab_size is {model.config.vocab_size} but {tokenizer} has {tokens} tokens; "
                              f"set model.vocab_size to at least {tokens} or leave it unset")

    def save_model(self, model: nn.Module, directory: Path) -> None:
        """The model directory of a checkpoint: bertforge's format, with the tokenizer."""
        from bertforge.models import save_bertforge_model

        save_bertforge_model(model, directory, self.tokenizer_dir())

    def flops_per_token(self, model: nn.Module) -> float | None:
        """6 x the parameters a token passes through (the word-embedding lookup is not a matmul)."""
        encoder = getattr(model, "encoder", None)
        if encoder is None:
            return None
        embedded = encoder.embeddings.word_embeddings.weight.numel()
        return 6.0 * (sum(p.numel() for p in model.parameters()) - embedded)

    # --- the end --------------------------------------------------------------------------------

    def final_splits(self) -> Mapping[str, Any]:
        """The splits scored with the final weights: the test split, else the whole validation split."""
        raise NotImplementedError

    def evaluate_split(self, model: nn.Module, name: str, split: Any) -> EvaluationReport:
        """The report of `model` on one final split."""
        raise NotImplementedError

    def show_report(self, report: EvaluationReport) -> None:
        """Print what the kind shows on the console besides the metrics line (its per-class tables)."""

    def report_of(self, report: EvaluationReport, split: Any) -> EvaluationReport:
        """A final evaluation's report, with the checkpoint it scored, saying so when it scored the rows that
        chose the checkpoint."""
        report = dataclasses.replace(report, checkpoint=self.final_checkpoint)
        if split is self.validation_rows and self.validation_subset is not None:
            return dataclasses.replace(report, subset=self.validation_subset.describe())
        return report

    def save_final(self, model: nn.Module, directory: Path) -> None:
        """Evaluate the final splits with the (best) model, write their reports beside `final/`, then export
        `final/` as the kind's record says (a stock transformers class, a sentence-transformers directory)."""
        from bertforge.tasks.kinds import kind_named

        model.eval()
        for name, split in self.final_splits().items():
            report = self.report_of(self.evaluate_split(model, name, split), split)
            written = write_evaluation(report, directory.parent, picture=self.config.log.plots)
            log.info(f"{name} ({int(report.metrics['examples']):,} {self.examples}): {metrics_line(report.metrics)}")
            log.info(f"{name} report: {', '.join(str(p) for p in written)}")
            self.show_report(report)
        kind_named(self.config.finetune.task_type).export(model, self.tokenizer_dir(), directory,
                                                          self.config.finetune.max_length)
