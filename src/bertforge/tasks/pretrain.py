"""The pre-training task: MLM (+ NSP when the prepared data has sentence pairs).

White-box API example #1. The loss is normalised over the masked tokens of the whole global batch
(`loss_units`), not per micro-batch: with accumulation or several ranks a per-micro-batch mean
would over-weight micro-batches that happen to have few masked tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from bertforge.batch import model_inputs
from bertforge.console import log
from bertforge.data.curriculum import DataCurriculum
from bertforge.data.masking import MaskingSettings
from bertforge.data.pretraining_loader import PretrainingLoader, build_eval_loader
from bertforge.data.sampler import BatchGeometry
from bertforge.data.shards import PretokenizedDataset
from bertforge.data.tokenizer import load_tokenizer
from bertforge.device import batch_on_device, model_device
from bertforge.errors import ConfigError, DataError
from bertforge.locate import resolve_model
from bertforge.models import BertforgeForPreTraining, encoder_config_from_section, load_for_task
from bertforge.tasks.mlm_plateau import PlateauWatch, UnigramGuess, unigram_accuracy, unigram_guess
from bertforge.train.task import Batch, Task, TaskData

if TYPE_CHECKING:
    from bertforge.train.checkpoint import TrainingState

MLM_TARGETS = ("masked_positions", "masked_labels", "next_sentence_label")  # what the heads score


class PretrainTask(Task):
    unigram_guess: UnigramGuess | None = None  # the training data's most frequent token, counted once (build_datasets)

    def build_datasets(self) -> TaskData:
        data = self.config.data
        if data.path is None:
            raise ConfigError("`data.path` is not set: prepare a dataset with `bertforge prepare pretrain --input ... "
                              "--tokenizer ... --out DIR` and pass data.path=DIR")
        train = PretokenizedDataset(data.path, "train", verify_checksums=data.verify_checksums,
                                    cache_dir=data.cache_dir)
        if train.seq_len > data.seq_len:
            raise ConfigError(f"`data.seq_len` is {data.seq_len} but {data.path} was prepared with --seq-len "
                              f"{train.seq_len}; set data.seq_len={train.seq_len} or prepare the data again")
        self.nsp = train.has_pairs
        if self.nsp and data.seq_len_schedule:
            raise ConfigError(f"`data.seq_len_schedule` cuts samples, and {data.path} holds NSP pairs, whose second segment "
                              "a cut would lose; prepare the data without --nsp, or remove data.seq_len_schedule")
        self.tokenizer_dir = train.tokenizer_path
        tokenizer = load_tokenizer(self.tokenizer_dir)
        self._check_tokenizer(tokenizer.fingerprint, train.manifest["tokenizer"]["fingerprint"])
        self.vocab_size = tokenizer.vocab_size
        self.pad_id = tokenizer.pad_id
        self.unigram_guess = unigram_guess(train, tokenizer)
        self.plateau_watch = PlateauWatch()
        masking = MaskingSettings(mask_prob=data.mask_prob, mask_replace_prob=data.mask_replace_prob,
                                  random_replace_prob=data.random_replace_prob,
                                  whole_word=data.whole_word_masking, seed=self.config.run.seed)
        seed, workers = self.config.run.seed, data.num_workers

        def train_loader(geometry: BatchGeometry) -> PretrainingLoader:
            return PretrainingLoader(train, geometry, seed=seed, num_workers=workers, masking=masking,
                                     curriculum=DataCurriculum.from_config(data))

        validation_batches = None
        if "validation" in train.manifest["splits"] and train.manifest["splits"]["validation"]["samples"] > 0:
            validation = PretokenizedDataset(data.path, "validation", verify_checksums=data.verify_checksums,
                                             cache_dir=data.cache_dir)
            loader = build_eval_loader(validation, micro_batch_size=self.config.train.micro_batch_size,
                                       masking=masking)
            validation_batches = _first_samples(loader, data.validation_samples)
        else:
            log.warning(f"{data.path} has no validation split: no MLM accuracy will be reported "
                        "(prepare it with --split 980,20)")
        tokens_per_sample = train.manifest["splits"]["train"]["tokens"] / max(len(train), 1)
        return TaskData(train=train_loader, validation_batches=validation_batches, tokens_per_sample=tokens_per_sample)

    def _check_tokenizer(self, found: str, recorded: str) -> None:
        """The token ids in the shards mean what the dataset's tokenizer says only if it is the one they
        were made with; a `model.tokenizer` other than the data's would be silently ignored."""
        data_path = self.config.data.path
        if found != recorded:
            raise DataError(f"{self.tokenizer_dir} is not the tokenizer {data_path} was prepared with (its fingerprint "
                            f"{found[:12]} differs from the manifest's {recorded[:12]}); restore it or run "
                            "`bertforge prepare pretrain` again")
        requested = self.config.model.tokenizer
        if requested is not None and load_tokenizer(requested).fingerprint != recorded:
            raise ConfigError(f"`model.tokenizer` ({requested}) is not the tokenizer {data_path} was prepared with; "
                              "pre-training reads the dataset's token ids, so remove model.tokenizer or prepare the "
                              "data with that tokenizer")

    def build_model(self) -> nn.Module:
        from bertforge.models.loading import runtime_overrides

        section = self.config.model
        if section.init_from:
            model = load_for_task(resolve_model(section.init_from).path, "pretraining", nsp=self.nsp,
                                  config_overrides=runtime_overrides(section))
        else:
            encoder = encoder_config_from_section(section, self.vocab_size)
            if encoder.position_offset and encoder.position_offset != self.pad_id + 1:
                # an export says pad_token_id = position_offset - 1, and HF numbers positions after that id
                raise ConfigError(f"model.preset {section.preset} numbers positions after the pad id "
                                  f"{encoder.position_offset - 1}, as RoBERTa does, but the pad token of "
                                  f"{self.config.data.path}'s tokenizer is id {self.pad_id}; train the tokenizer with "
                                  "`bertforge tokenizer train --model bpe` (or unigram), whose <pad> is id 1")
            model = BertforgeForPreTraining(encoder, nsp=self.nsp)
        if model.config.vocab_size < self.vocab_size:  # an id past the embedding table is an opaque index error
            source = f"model.init_from ({section.init_from})" if section.init_from else "`model.vocab_size`"
            raise ConfigError(f"{source} gives {model.config.vocab_size} embeddings but the tokenizer of "
                              f"{self.config.data.path} has {self.vocab_size} tokens; "
                              + ("pre-train from a model with that tokenizer" if section.init_from else
                                 f"set model.vocab_size to at least {self.vocab_size} or leave it unset"))
        return model

    def loss_units(self, batch: Batch) -> dict[str, float]:
        units = {"masked_tokens": float(batch["masked_positions"].numel())}
        if self.nsp:
            units["sequences"] = float(batch["num_samples"])
        return units

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        output = model(**model_inputs(batch, MLM_TARGETS))
        totals = batch["global_loss_units"]
        loss = output.mlm_loss_sum / totals["masked_tokens"]
        metrics = {"mlm_accuracy": float(output.mlm_correct) / max(output.num_masked, 1)}
        if self.nsp:
            loss = loss + output.nsp_loss_sum / totals["sequences"]
            metrics["nsp_accuracy"] = float(output.nsp_correct) / max(int(batch["num_samples"]), 1)
        return loss, metrics

    def metric_names(self) -> set[str]:
        return {"mlm_loss", "mlm_accuracy", "mlm_unigram_accuracy", "mlm_perplexity"} | (
            {"nsp_loss", "nsp_accuracy"} if self.nsp else set())

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        batches = batches if isinstance(batches, list) else list(batches)
        device = model_device(model)
        mlm_loss = mlm_correct = masked = nsp_loss = nsp_correct = sequences = 0.0
        for batch in batches:  # fixed masks, built once on the CPU: each batch goes to the model's device
            output = model(**model_inputs(batch_on_device(batch, device), MLM_TARGETS))
            mlm_loss += float(output.mlm_loss_sum)
            mlm_correct += float(output.mlm_correct)
            masked += output.num_masked
            if self.nsp:
                nsp_loss += float(output.nsp_loss_sum)
                nsp_correct += float(output.nsp_correct)
                sequences += int(batch["num_samples"])
        results = {"mlm_loss": mlm_loss / max(masked, 1), "mlm_accuracy": mlm_correct / max(masked, 1),
                   "mlm_unigram_accuracy": unigram_accuracy(batches, self._guess())}
        results["mlm_perplexity"] = float(torch.tensor(results["mlm_loss"]).exp())
        if self.nsp:
            results["nsp_loss"] = nsp_loss / max(sequences, 1)
            results["nsp_accuracy"] = nsp_correct / max(sequences, 1)
        return results

    def _guess(self) -> UnigramGuess:
        assert self.unigram_guess is not None, "build_datasets counts it before any evaluation"
        return self.unigram_guess

    def report_evaluation(self, results: dict[str, float], state: TrainingState, fraction_done: float) -> None:
        warning = self.plateau_watch.check(results, step=state.step, tokens=state.consumed_tokens,
                                           fraction_done=fraction_done, guess=self.unigram_guess)
        if warning is not None:
            log.warning(warning)

    def flops_per_token(self, model: nn.Module) -> float:
        return pretraining_flops_per_token(model, self.config.data.seq_len, self.config.data.mask_prob)

    def save_model(self, model: nn.Module, directory: Path) -> None:
        """The model directory of a checkpoint: bertforge's format, with the data's tokenizer."""
        from bertforge.models import save_bertforge_model

        save_bertforge_model(model, directory, self.tokenizer_dir)

    def save_final(self, model: nn.Module, directory: Path) -> None:
        from bertforge.models import export_hf

        export_hf(model, self.tokenizer_dir, directory)


def pretraining_flops_per_token(model: nn.Module, seq_len: int, mask_prob: float) -> float:
    """6 × (encoder matrix parameters) per token, plus attention scores and the masked-only MLM head."""
    config = model.config
    hidden, layers = config.hidden_size, config.num_layers
    encoder = sum(p.numel() for n, p in model.named_parameters() if p.ndim == 2 and "embeddings" not in n
                  and "mlm_head" not in n)
    attention = 2 * 2 * layers * seq_len * hidden  # QK^T and AV per token (average full-length context)
    mlm_head = mask_prob * (2 * hidden * config.vocab_size + 2 * hidden * hidden)
    return 3 * (2 * encoder + attention + mlm_head)


def _first_samples(loader: Iterable[Batch], limit: int | None) -> list[Batch]:
    """Validation batches, built once (fixed masks), up to `limit` samples."""
    batches, seen = [], 0
    for batch in loader:
        batches.append(batch)
        seen += int(batch["num_samples"])
        if limit is not None and seen >= limit:
            break
    return batches
