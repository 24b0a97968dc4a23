"""The one typed configuration tree, loaded from YAML files and dotted command-line overrides.

Every knob is a field of a dataclass below, with a default and a one-line doc (the comment after
it). OmegaConf does the merging (defaults < `extends` chain < the YAML file < `a.b=c` overrides)
and the type checking; each section's `__post_init__` checks ranges and choices, because
OmegaConf does not understand `Literal`. Errors name the key and, for an unknown key, the closest
valid one.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from bertforge.errors import ConfigError, first_line

# ---------------------------------------------------------------------------------------------
# validation helpers used by the sections' __post_init__


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"config key `{key}` is {value!r}; expected one of {', '.join(choices)}")


def check_range(key: str, value: float | int | None, *, low: float | None = None, high: float | None = None,
                low_inclusive: bool = True, high_inclusive: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key `{key}` is {value}; give a finite number")
    too_low = low is not None and (value < low if low_inclusive else value <= low)
    too_high = high is not None and (value > high if high_inclusive else value >= high)
    if too_low or too_high:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        brackets = ("[" if low_inclusive else "(", "]" if high_inclusive else ")")
        raise ConfigError(f"config key `{key}` is {value}; it must be in {brackets[0]}{lo}, {hi}{brackets[1]}")


# ---------------------------------------------------------------------------------------------
# sections

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "lamb", "adadelta", "sgd", "stable_adamw")
SCHEDULES = ("constant", "linear", "cosine", "inverse_sqrt", "wsd", "step", "one_cycle")
STRATEGIES = ("none", "ddp", "zero1", "fsdp")
NAN_POLICIES = ("skip", "stop", "rollback")
POSITIONS = ("learned", "rope", "alibi")
MLPS = ("gelu", "geglu")
NORMS = ("post", "pre")
ATTENTION_BACKENDS = ("auto", "varlen", "flash", "sdpa", "eager")
POOLINGS = ("pooler", "relu_pooler", "gelu_pooler", "cls", "mean", "last")
TASK_TYPES = ("classification", "regression", "token_classification", "embedding", "multiple_choice")
EMBEDDING_LOSSES = ("mnrl", "cosine")
MASK_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class RunSection:
    name: str = "run"  # run name; the run directory is `<output_dir>/<name>`
    output_dir: str = "runs"  # parent directory of run directories
    seed: int = 42  # seeds weights, data order, masking and dropout
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    resume: str = "auto"  # auto (newest readable checkpoint, if any) | never | force (auto, even if keys that break exact resume changed) | a checkpoint path

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ConfigError(f"config key `run.name` is {self.name!r}; give a non-empty name without '/'")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"config key `run.device` is {self.device!r}; expected auto, cpu, cuda or cuda:N")


@dataclass
class ModelSection:
    preset: str = "bert-tiny"  # a named architecture (bert-tiny ... bert-large, mosaic-bert-base, modernbert-base, crammed-bert, roberta-base, roberta-tiny, deberta-v3-small, deberta-v3-tiny, distilbert-base-multilingual-cased, distilbert-tiny)
    init_from: str | None = None  # a bertforge checkpoint / run dir or any Hugging Face BERT directory to start from
    tokenizer: str | None = None  # tokenizer directory (HF format); defaults to the one of the data or of init_from
    vocab_size: int | None = None  # overrides the preset; by default taken from the tokenizer, padded to x64
    hidden_size: int | None = None  # overrides the preset
    num_layers: int | None = None  # overrides the preset
    num_heads: int | None = None  # overrides the preset
    intermediate_size: int | None = None  # overrides the preset
    max_position_embeddings: int | None = None  # overrides the preset
    hidden_dropout: float | None = None  # overrides the preset
    attention_dropout: float | None = None  # overrides the preset
    norm_eps: float | None = None  # overrides the preset
    position: str | None = None  # learned | rope | alibi (overrides the preset)
    mlp: str | None = None  # gelu | geglu (overrides the preset)
    norm: str | None = None  # post | pre (overrides the preset)
    bias: bool | None = None  # biases in linear layers and norms (overrides the preset)
    local_attention_window: int | None = None  # sliding-window size of local layers; None = all global
    global_every_n: int | None = None  # every n-th layer attends globally when a local window is set
    tie_word_embeddings: bool | None = None  # tie the MLM decoder to the word embeddings
    attention_backend: str = "auto"  # auto (GPU: varlen_attn, or flash-attn for ALiBi/dropout; CPU: sdpa) | varlen | flash | sdpa | eager
    pooling: str | None = None  # sequence head / embedding input: pooler (BERT's tanh pooler on [CLS]; classifiers only) | relu_pooler (DistilBERT's dense+ReLU on [CLS]; classifiers only) | gelu_pooler (ELECTRA's dense+GELU on [CLS]; classifiers only) | cls | mean | last (token); None = the preset's (embeddings: the source's, else mean)
    classifier_dropout: float | None = None  # dropout before the classifier; None = hidden_dropout

    def __post_init__(self) -> None:
        check_choice("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        if self.pooling is not None:
            check_choice("model.pooling", self.pooling, POOLINGS)
        if self.position is not None:
            check_choice("model.position", self.position, POSITIONS)
        if self.mlp is not None:
            check_choice("model.mlp", self.mlp, MLPS)
        if self.norm is not None:
            check_choice("model.norm", self.norm, NORMS)
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "max_position_embeddings", "local_attention_window", "global_every_n"):
            check_range(f"model.{key}", getattr(self, key), low=1)
        for key in ("hidden_dropout", "attention_dropout", "classifier_dropout"):
            check_range(f"model.{key}", getattr(self, key), low=0.0, high=1.0, high_inclusive=False)


@dataclass
class SeqLenPhase:
    seq_len: int = 128  # tokens per sample in this phase ([CLS] and [SEP] included); longer samples are cut
    until: float = 0.9  # the phase ends at this fraction of the steps


@dataclass
class DataSection:
    path: str | None = None  # a prepared (sharded, pre-tokenized) dataset directory or URL, for pre-training
    seq_len: int = 128  # tokens per sample, [CLS] and [SEP] included
    mask_prob: float = 0.15  # fraction of tokens chosen for MLM (0.30 in Mosaic-style recipes); with a mask_schedule, the rate at the end
    mask_schedule: str = "constant"  # the mask rate over the steps: constant (mask_prob) | linear | cosine (from mask_prob_start to mask_prob)
    mask_prob_start: float | None = None  # linear / cosine mask_schedule: the rate at the first step, e.g. 0.30 falling to mask_prob 0.15
    seq_len_schedule: list[SeqLenPhase] = field(default_factory=list)  # shorter phases first, e.g. [{seq_len: 64, until: 0.9}]: samples cut to 64 tokens for 90% of the steps, then seq_len
    mask_replace_prob: float = 0.8  # of the chosen tokens, the fraction replaced by [MASK]
    random_replace_prob: float = 0.1  # of the chosen tokens, the fraction replaced by a random token
    whole_word_masking: bool = False  # mask all WordPiece pieces of a word together
    num_workers: int = 1  # data-loader worker processes per rank
    validation_samples: int | None = None  # cap on validation samples per evaluation; None = the whole split
    verify_checksums: bool = True  # sha256-check every local shard when opened (remote shards: always, when fetched)
    cache_dir: str | None = None  # local copy of a remote dataset, fetched shard by shard; None = $BERTFORGE_CACHE/datasets/KEY

    def __post_init__(self) -> None:
        check_range("data.seq_len", self.seq_len, low=8)
        check_range("data.mask_prob", self.mask_prob, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
        check_choice("data.mask_schedule", self.mask_schedule, MASK_SCHEDULES)
        check_range("data.mask_prob_start", self.mask_prob_start, low=0.0, high=1.0, low_inclusive=False,
                    high_inclusive=False)
        if self.mask_schedule == "constant" and self.mask_prob_start is not None:
            raise ConfigError("config key `data.mask_prob_start` is set but data.mask_schedule is constant; set "
                              "data.mask_schedule=linear or cosine, or remove data.mask_prob_start")
        if self.mask_schedule != "constant" and self.mask_prob_start is None:
            raise ConfigError(f"config key `data.mask_prob_start` is not set but data.mask_schedule is "
                              f"{self.mask_schedule}; give the rate at the first step, e.g. data.mask_prob_start=0.3")
        check_range("data.mask_replace_prob", self.mask_replace_prob, low=0.0, high=1.0)
        check_range("data.random_replace_prob", self.random_replace_prob, low=0.0, high=1.0)
        if self.mask_replace_prob + self.random_replace_prob > 1.0 + 1e-9:
            raise ConfigError("config keys `data.mask_replace_prob` + `data.random_replace_prob` exceed 1; "
                              "lower one of them (BERT uses 0.8 and 0.1)")
        check_range("data.num_workers", self.num_workers, low=0)
        self._check_seq_len_schedule()
        check_range("data.validation_samples", self.validation_samples, low=1)


    def _check_seq_len_schedule(self) -> None:
        previous_until = 0.0
        for index, phase in enumerate(self.seq_len_schedule):
            key = f"data.seq_len_schedule[{index}]"
            check_range(f"{key}.seq_len", phase.seq_len, low=8, high=self.seq_len - 1)
            check_range(f"{key}.until", phase.until, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
            if phase.until <= previous_until:
                raise ConfigError(f"config key `{key}.until` is {phase.until}, not after the previous phase's end "
                                  f"({previous_until}); list the phases in order, each `until` larger")
            previous_until = phase.until


@dataclass
class ClassificationSettings:
    """`finetune.classification.*`: what only sequence classification reads."""

    label_map: dict[str, str] = field(default_factory=dict)  # merge raw labels, e.g. {"1": negative, "5": positive}
    class_weights: list[float] = field(default_factory=list)  # per-class loss weights in label order; empty = none
    group_column: str | None = None  # a column naming each row's group (e.g. language): <split>_results.json and the report give accuracy and the majority class per group


@dataclass
class TaggingSettings:
    """`finetune.tagging.*`: what only token classification reads."""

    tokens_column: str = "tokens"  # jsonl/parquet/HF data: the column of word lists
    tags_column: str = "tags"  # jsonl/parquet/HF data: the column of tag lists (CoNLL files: last column)


@dataclass
class EmbeddingSettings:
    """`finetune.embedding.*`: what only sentence-embedding fine-tuning reads."""

    loss: str = "mnrl"  # mnrl (anchor text_column, positive text_pair_column, in-batch negatives) | cosine (MSE of cos(a, b) against label_column's score)
    negative_column: str | None = None  # mnrl: an optional hard-negative text column, one more candidate per anchor
    similarity_scale: float = 20.0  # mnrl: cosine similarities are multiplied by this before the cross-entropy
    normalize: bool = False  # unit-length output vectors (`embed`, and a Normalize module in the export)

    def __post_init__(self) -> None:
        check_choice("finetune.embedding.loss", self.loss, EMBEDDING_LOSSES)
        check_range("finetune.embedding.similarity_scale", self.similarity_scale, low=0.0, low_inclusive=False)


@dataclass
class MultipleChoiceSettings:
    """`finetune.multiple_choice.*`: what only multiple choice reads (the context is finetune.text_column, the
    right choice's index finetune.label_column)."""

    choice_columns: list[str] = field(default_factory=lambda: ["choices"])  # the candidate answers: one column holding a list of them (jsonl/parquet), or one column per choice, e.g. [ending0, ending1, ending2, ending3]

    def __post_init__(self) -> None:
        if not self.choice_columns or len(set(self.choice_columns)) != len(self.choice_columns):
            raise ConfigError(f"config key `finetune.multiple_choice.choice_columns` is {self.choice_columns}; give "
                              "one column holding a list of choices, or two or more distinct columns")


@dataclass
class FinetuneSection:
    task_type: str = "classification"  # classification | regression | token_classification (tagging, e.g. NER) | embedding (sentence embeddings) | multiple_choice (a context and N candidate answers)
    train_file: str | None = None  # csv / tsv / jsonl / parquet file, HF dataset dir, or hub name
    validation_file: str | None = None  # evaluated during training; picks the best checkpoint
    test_file: str | None = None  # evaluated once at the end with the best checkpoint
    text_column: str = "text"  # the (first) text column
    text_pair_column: str | None = None  # second text column for pair tasks (NLI, paraphrase) and embedding pairs
    label_column: str = "label"  # label column: a name or an integer id (classification), a number (regression, embedding with loss cosine) | multiple_choice: the right choice's index from 0
    labels: list[str] = field(default_factory=list)  # class (or tag) names in id order; empty = sorted labels of the train file
    max_length: int = 128  # tokens per example after truncation ([CLS]/[SEP] included)
    delimiter: str | None = None  # csv/tsv delimiter; None = from the file extension
    classification: ClassificationSettings = field(default_factory=ClassificationSettings)  # task_type classification only
    tagging: TaggingSettings = field(default_factory=TaggingSettings)  # task_type token_classification only
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)  # task_type embedding only
    multiple_choice: MultipleChoiceSettings = field(default_factory=MultipleChoiceSettings)  # task_type multiple_choice only

    def __post_init__(self) -> None:
        check_choice("finetune.task_type", self.task_type, TASK_TYPES)
        check_range("finetune.max_length", self.max_length, low=8)
        reads, settings = TASK_TYPE_READS[self.task_type]
        for name, task_type in ((section, task_type) for task_type, (_, section) in TASK_TYPE_READS.items()
                                if section is not None and section != settings):
            changed = _changed_keys(getattr(self, name))
            if changed:  # a key that does nothing must not look as if it did: it was meant for another task type
                raise ConfigError(f"config key `finetune.{name}.{changed[0]}` is set but only applies to "
                                  f"finetune.task_type={task_type} (this run's is {self.task_type}); remove it or set "
                                  f"finetune.task_type={task_type}")
        for key in OPTIONAL_SHARED_KEYS:
            if key not in reads and getattr(self, key) != _FINETUNE_DEFAULTS[key]:
                readers_of = [t for t, (keys, _) in TASK_TYPE_READS.items() if key in keys]
                raise ConfigError(f"config key `finetune.{key}` is set to {getattr(self, key)!r} but finetune.task_type="
                                  f"{self.task_type} does not read it (it applies to {', '.join(readers_of)}); remove it")


# what each task type reads besides the keys every one does: optional shared keys, and its sub-section of
# finetune (a key set for a task type that does not read it is an error, not silence)
OPTIONAL_SHARED_KEYS = ("text_column", "text_pair_column", "label_column", "labels", "delimiter")
TASK_TYPE_READS: dict[str, tuple[frozenset[str], str | None]] = {
    "classification": (frozenset(OPTIONAL_SHARED_KEYS), "classification"),
    "regression": (frozenset({"text_column", "text_pair_column", "label_column", "delimiter"}), None),
    "token_classification": (frozenset({"labels"}), "tagging"),
    "embedding": (frozenset({"text_column", "text_pair_column", "label_column", "delimiter"}), "embedding"),
    "multiple_choice": (frozenset({"text_column", "label_column", "delimiter"}), "multiple_choice"),
}
_FINETUNE_DEFAULTS: dict[str, object] = {"text_column": "text", "text_pair_column": None, "label_column": "label",
                                         "labels": [], "delimiter": None}


def _changed_keys(section: Any) -> list[str]:
    """The keys of a settings section that differ from its defaults."""
    default = type(section)()
    return [f.name for f in fields(section) if getattr(section, f.name) != getattr(default, f.name)]


@dataclass
class GlueSection:
    tasks: list[str] = field(default_factory=list)  # `bertforge glue`: tasks to run (cola, sst2, ...); empty = all 8
    overrides: dict[str, list[str]] = field(default_factory=dict)  # per-task overrides of the GLUE table, e.g. {rte: [optim.lr=2e-5]}; `all` = every task
    seeds: int | None = None  # seeds per small task (CoLA, MRPC, STS-B, RTE; median reported); None = the table's 4-5
    from_mnli: bool = False  # start RTE, MRPC and STS-B from the fine-tuned MNLI model (Mosaic's recipe)

    def __post_init__(self) -> None:
        check_range("glue.seeds", self.seeds, low=1)
        for task, overrides in self.overrides.items():
            for override in overrides:
                if "=" not in override:
                    raise ConfigError(f"config key `glue.overrides.{task}` holds {override!r}; each entry "
                                      "is a dotted key=value override, e.g. optim.lr=2e-5")


@dataclass
class OptimSection:
    name: str = "adamw"  # adamw | lamb | adadelta | sgd | stable_adamw (AdamW with per-tensor update clipping, ModernBERT's)
    lr: float = 5e-4  # peak learning rate (pre-training; `bertforge finetune` starts from 5e-5: finetune_defaults)
    weight_decay: float = 0.01  # decoupled; never applied to biases, norms or embeddings' norms
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam/LAMB betas (fine-tuning: 0.9/0.999)
    eps: float = 1e-6  # Adam/LAMB epsilon (fine-tuning: 1e-8)
    momentum: float = 0.0  # SGD momentum
    clip_grad_norm: float | None = 1.0  # gradient clipping by global norm; None = off

    def __post_init__(self) -> None:
        check_choice("optim.name", self.name, OPTIMIZERS)
        check_range("optim.lr", self.lr, low=0.0, low_inclusive=False)
        check_range("optim.weight_decay", self.weight_decay, low=0.0)
        if len(self.betas) != 2:
            raise ConfigError(f"config key `optim.betas` has {len(self.betas)} values; give two, e.g. [0.9, 0.98]")
        for beta in self.betas:
            check_range("optim.betas", beta, low=0.0, high=1.0, high_inclusive=False)
        check_range("optim.eps", self.eps, low=0.0, low_inclusive=False)
        check_range("optim.clip_grad_norm", self.clip_grad_norm, low=0.0, low_inclusive=False)


@dataclass
class ScheduleSection:
    name: str = "linear"  # constant | linear | cosine | inverse_sqrt | wsd (warmup-stable-decay) | step | one_cycle (Cramming's triangle)
    warmup: float = 0.06  # warmup length: a fraction of the run if < 1, else a number of steps (one_cycle rises until peak_at instead)
    min_lr_ratio: float = 0.0  # the final learning rate as a fraction of the peak
    decay_fraction: float = 0.2  # wsd: the fraction of the run spent decaying at the end
    step_size: int = 1000  # step: multiply the lr by `gamma` every `step_size` steps
    gamma: float = 0.1  # step: the factor
    peak_at: float = 0.5  # one_cycle: the fraction of the run where the lr peaks, rising linearly from 0 and falling linearly to min_lr_ratio

    def __post_init__(self) -> None:
        check_choice("schedule.name", self.name, SCHEDULES)
        check_range("schedule.warmup", self.warmup, low=0.0)
        check_range("schedule.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_range("schedule.decay_fraction", self.decay_fraction, low=0.0, high=1.0)
        check_range("schedule.step_size", self.step_size, low=1)
        check_range("schedule.gamma", self.gamma, low=0.0, low_inclusive=False)
        check_range("schedule.peak_at", self.peak_at, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)


@dataclass
class TrainSection:
    micro_batch_size: int = 32  # samples per device per forward/backward
    global_batch_size: int = 32  # samples per optimizer step over all devices; accumulation is derived
    batch_ramp_start: int | None = None  # global batch of the first step, growing linearly to global_batch_size (in multiples of micro_batch_size × world size); None = no ramp
    batch_ramp_fraction: float = 0.6  # with batch_ramp_start: the fraction of the steps over which the batch grows (Cramming: 0.6)
    max_steps: int | None = None  # stop after this many optimizer steps
    max_epochs: float | None = None  # stop after this many passes over the training data
    max_tokens: int | None = None  # stop after this many real (non-padding) training tokens
    max_time_minutes: float | None = None  # stop after this wall-clock budget; the schedule follows elapsed time
    precision: str = "auto"  # auto (bf16 on a GPU that supports it, else fp32) | fp32 | bf16 | fp16
    tf32: bool = True  # allow TF32 matmuls on NVIDIA GPUs
    eval_every: int | None = None  # evaluate every N steps; None = once per epoch and at the end
    log_every: int = 10  # write metrics every N steps
    checkpoint_every: int | None = None  # save a checkpoint every N steps; None = only at the end
    keep_last: int = 2  # checkpoints kept, newest first (the best one is kept in addition)
    keep_optimizer_state: bool = True  # false: a run that finishes drops its checkpoints' optimizer, scaler, RNG and EMA state, keeping their model/ directories (what inference needs); it can no longer be resumed
    best_metric: str | None = None  # validation metric that marks the best checkpoint, e.g. mlm_accuracy
    best_mode: str = "max"  # max | min: whether a larger best_metric is better
    early_stopping_patience: int | None = None  # evaluations without best_metric improving before stopping; None = never
    nan_policy: str = "skip"  # on a non-finite loss: skip the step | stop | rollback to the last checkpoint
    max_skipped_steps: int = 10  # under nan_policy skip/rollback: a run that skips more steps than this has diverged and stops (exit 2, no final/); one that skipped over half its steps fails at the end
    ema: float | None = None  # decay of an exponential moving average of the weights (e.g. 0.999), kept in checkpoints; final/ is the average; None = off
    average_last_k: int | None = None  # final/ = the mean weights of the last K checkpoints (needs checkpoint_every and keep_last >= K); None = off
    disable_dropout: bool = False  # train with every dropout off (Cramming's pre-training); the model's config and export keep their rates for fine-tuning
    disable_dropout_until: float = 1.0  # with disable_dropout: the fraction of the run (of its steps, or of max_time_minutes under a time-only budget) from which dropout is back on; 1.0 = off for the whole run

    def __post_init__(self) -> None:
        check_range("train.micro_batch_size", self.micro_batch_size, low=1)
        check_range("train.global_batch_size", self.global_batch_size, low=1)
        check_range("train.batch_ramp_start", self.batch_ramp_start, low=1, high=self.global_batch_size - 1)
        check_range("train.batch_ramp_fraction", self.batch_ramp_fraction, low=0.0, high=1.0, low_inclusive=False)
        check_range("train.max_steps", self.max_steps, low=1)
        check_range("train.max_epochs", self.max_epochs, low=0.0, low_inclusive=False)
        check_range("train.max_tokens", self.max_tokens, low=1)
        check_range("train.max_time_minutes", self.max_time_minutes, low=0.0, low_inclusive=False)
        check_choice("train.precision", self.precision, ("auto", *PRECISIONS))
        check_range("train.eval_every", self.eval_every, low=1)
        check_range("train.log_every", self.log_every, low=1)
        check_range("train.checkpoint_every", self.checkpoint_every, low=1)
        check_range("train.keep_last", self.keep_last, low=1)
        check_choice("train.best_mode", self.best_mode, ("max", "min"))
        check_choice("train.nan_policy", self.nan_policy, NAN_POLICIES)
        check_range("train.max_skipped_steps", self.max_skipped_steps, low=0)
        check_range("train.early_stopping_patience", self.early_stopping_patience, low=1)
        check_range("train.disable_dropout_until", self.disable_dropout_until, low=0.0, high=1.0, low_inclusive=False)
        if self.disable_dropout_until < 1.0 and not self.disable_dropout:
            raise ConfigError("config key `train.disable_dropout_until` says when dropout comes back on, but "
                              "`train.disable_dropout` is false; set train.disable_dropout=true or remove the key")
        self._check_final_weights()

    def _check_final_weights(self) -> None:
        """`ema`, `average_last_k` and `best_metric` each decide which weights `final/` holds: one at a time."""
        check_range("train.ema", self.ema, low=0.0, high=1.0, low_inclusive=False, high_inclusive=False)
        check_range("train.average_last_k", self.average_last_k, low=2)
        choosers = [key for key, value in (("train.ema", self.ema), ("train.average_last_k", self.average_last_k),
                                           ("train.best_metric", self.best_metric)) if value is not None]
        if len(choosers) > 1:
            raise ConfigError(f"config keys `{choosers[0]}` and `{choosers[1]}` both choose the weights of final/; "
                              f"set only one of them, e.g. {choosers[1]}=null")
        if self.average_last_k is None:
            return
        if self.checkpoint_every is None:
            raise ConfigError("config key `train.average_last_k` averages checkpoints, but `train.checkpoint_every` is "
                              "not set (one checkpoint at the end); set train.checkpoint_every")
        if self.keep_last < self.average_last_k:
            raise ConfigError(f"config key `train.average_last_k` is {self.average_last_k} but `train.keep_last` is "
                              f"{self.keep_last}: the older checkpoints would be deleted; set train.keep_last="
                              f"{self.average_last_k}")


@dataclass
class DistSection:
    strategy: str = "ddp"  # none | ddp | zero1 (sharded optimizer state) | fsdp (FSDP2, ZeRO-3); used when WORLD_SIZE > 1
    activation_checkpointing: bool = False  # recompute each layer's activations in backward to save memory
    compile: bool = False  # torch.compile the model (30-70 s to compile; pays off on GPUs)
    compile_backend: str = "inductor"  # torch.compile's backend: inductor generates kernels; aot_eager only traces (debugging)

    def __post_init__(self) -> None:
        check_choice("dist.strategy", self.strategy, STRATEGIES)


@dataclass
class LogSection:
    tensorboard: bool = True  # write TensorBoard event files when tensorboard is installed
    wandb_project: str | None = None  # log to Weights & Biases (needs `wandb` installed and logged in)
    mlflow_experiment: str | None = None  # log to MLflow (needs `mlflow` installed)
    progress: bool = True  # show a progress bar on the console
    # at the end of a run, write plots/*.png of its metrics.jsonl (what `bertforge plot` writes) and the final
    # reports' <split>_confusion_matrix.png (a 45-class one takes seconds to draw; the matrix is in the .json/.md)
    plots: bool = True


@dataclass
class Config:
    """The whole configuration of a bertforge run."""

    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)
    glue: GlueSection = field(default_factory=GlueSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    train: TrainSection = field(default_factory=TrainSection)
    dist: DistSection = field(default_factory=DistSection)
    log: LogSection = field(default_factory=LogSection)

    def step_keyed_switches(self) -> list[str]:
        """The recipe switches on in this config that follow the step count, as the lr schedule does under a step
        budget: a run with any of them needs a step budget (`train.max_steps`, `max_epochs` or `max_tokens`)."""
        switches = [("data.mask_schedule", self.data.mask_schedule != "constant"),
                    ("data.seq_len_schedule", bool(self.data.seq_len_schedule)),
                    ("train.batch_ramp_start", self.train.batch_ramp_start is not None)]
        return [key for key, on in switches if on]


def finetune_defaults() -> Config:
    """The defaults fine-tuning starts from (`bertforge finetune`, the quickstart's fine-tuning).

    `OptimSection`'s own defaults are a pre-training recipe (lr 5e-4, betas 0.9/0.98, eps 1e-6:
    RoBERTa's, for large batches). Fine-tuning starts from HF `Trainer`'s and BERT's instead:
    lr 5e-5 (the top of BERT's fine-tuning range), betas 0.9/0.999, eps 1e-8. Measured
    (docs/benchmarks.md, "Fine-tuning quality parity"): with only betas and eps changed, the same
    10 seeds of MiniLM on supersense scored 0.21 ± 0.30 points lower with 0.9/0.98 and 1e-6
    (paired: 7 of 10 seeds lower; p = 0.05): a small effect, not in favour of the pre-training
    values. A config that sets these keys keeps its values.
    """
    return Config(optim=OptimSection(lr=5e-5, betas=[0.9, 0.999], eps=1e-8))


# ---------------------------------------------------------------------------------------------
# loading

EXTENDS_KEY = "extends"
# keys that moved to another section: an old config is told the new name, not a near-miss guess
MOVED_KEYS = {
    "finetune.glue_tasks": "glue.tasks",
    "finetune.glue_overrides": "glue.overrides",
    "finetune.glue_seeds": "glue.seeds",
    "finetune.glue_from_mnli": "glue.from_mnli",
    "finetune.label_map": "finetune.classification.label_map",
    "finetune.class_weights": "finetune.classification.class_weights",
    "finetune.tokens_column": "finetune.tagging.tokens_column",
    "finetune.tags_column": "finetune.tagging.tags_column",
    "finetune.embedding_loss": "finetune.embedding.loss",
    "finetune.negative_column": "finetune.embedding.negative_column",
    "finetune.similarity_scale": "finetune.embedding.similarity_scale",
    "finetune.normalize_embeddings": "finetune.embedding.normalize",
}
# keys that were removed, and why: an old config is told to delete them
REMOVED_KEYS = {
    "data.packing": "the loader only orders samples and the model's attention packs the rows, always",
}


def all_keys(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config tree, for 'did you mean' suggestions."""
    keys: list[str] = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            keys.extend(all_keys(type(default), prefix=f"{key}."))
    return keys


def _closest_key(key: str) -> str | None:
    candidates = all_keys()
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.5)
    if match:
        return match[0]
    # fall back to the last component, e.g. `lrr` -> `optim.lr`
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in candidates}
    match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
    return by_leaf[match[0]] if match else None


def _moved_to(key: str) -> str | None:
    """The new name of a moved key, or of an entry under one (`finetune.glue_overrides.rte`)."""
    for old, new in MOVED_KEYS.items():
        if key == old or key.startswith(f"{old}."):
            return new + key[len(old):]
    return None


def _flat_keys(layer: Any, prefix: str = "") -> list[str]:
    if isinstance(layer, DictConfig):
        layer = OmegaConf.to_container(layer)
    if not isinstance(layer, dict):
        return [prefix.rstrip(".")]
    keys: list[str] = []
    for name, value in layer.items():
        keys.extend(_flat_keys(value, f"{prefix}{name}.") if isinstance(value, dict) else [f"{prefix}{name}"])
    return keys


def _friendly(error: OmegaConfBaseException, source: str, layer: Any = None) -> ConfigError:
    key = getattr(error, "full_key", None) or ""
    if isinstance(error, ConfigKeyError) or "not in" in str(error):
        # report the full dotted key the user wrote (`optimm.lr`, not just `optimm`)
        written = [k for k in _flat_keys(layer) if k == key or k.startswith(f"{key}.")] if layer is not None else []
        key = written[0] if written else key
        moved = _moved_to(key)
        if moved:
            return ConfigError(f"config key `{key}` in {source} has moved to `{moved}`; use that key instead")
        if key in REMOVED_KEYS:
            return ConfigError(f"config key `{key}` in {source} was removed ({REMOVED_KEYS[key]}); delete it")
        if ":" in key:  # `{seq_len:64}` is one key to YAML's flow syntax; `{seq_len: 64}` is a key and a value
            return ConfigError(f"`{key}` in {source} is read as one key; write a space after each colon, "
                               "e.g. [{seq_len: 128, until: 0.9}]")
        suggestion = _closest_key(key)
        hint = f" — did you mean `{suggestion}`?" if suggestion else " — run with --print-config to see all keys"
        return ConfigError(f"unknown key `{key}` in {source}{hint}")
    if isinstance(error, ValidationError):
        message = first_line(error)
        return ConfigError(f"config key `{key}` in {source}: {message}")
    return ConfigError(f"invalid config in {source}: {first_line(error)}")


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, loaded safely (no tag builds a Python object); errors name file:line."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; check the path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        if isinstance(error, yaml.constructor.ConstructorError):  # a !!python/... tag: safe loading builds no objects
            raise ConfigError(f"{where}: a YAML tag bertforge does not read ({error.problem}); a config holds plain "
                              "values only: remove the tag") from None
        raise ConfigError(f"{where}: not valid YAML ({getattr(error, 'problem', error)}); fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (run:, model:, ...), "
                          f"not a {type(data).__name__}")
    return data


def _layers_of(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[dict[str, Any], str]]:
    """The YAML layers of a file, its `extends` chain first (paths relative to the file)."""
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"config `extends` forms a cycle: {chain}; remove one of the links")
    data = read_yaml(path)
    parents = data.pop(EXTENDS_KEY, None) or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(parent, str) and parent for parent in parents):
        raise ConfigError(f"{path}: `{EXTENDS_KEY}` is {parents!r}; give a file path or a list of file paths "
                          "(relative to this file), e.g. extends: [base.yaml]")
    layers: list[tuple[dict[str, Any], str]] = []
    for parent in parents:
        layers.extend(_layers_of((path.parent / parent), (*seen, path)))
    layers.append((data, str(path)))
    return layers


def _merge(base: DictConfig, layer: Any, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, layer)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        raise _friendly(error, source, layer) from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                base: Config | None = None) -> Config:
    """Defaults (or `base`) < the `extends` chain of `path` < `path` < dotted `overrides`."""
    merged: DictConfig = OmegaConf.structured(base if base is not None else Config)
    if path is not None:
        for layer, source in _layers_of(Path(path)):
            merged = _merge(merged, layer, source)
    for override in overrides:
        if "=" not in override:
            raise ConfigError(f"override {override!r} is not of the form key=value, e.g. optim.lr=2e-5")
        key = override.split("=", 1)[0]
        if key == EXTENDS_KEY:
            raise ConfigError("`extends` can only be used inside a YAML file")
        try:
            layer = OmegaConf.from_dotlist([override])
        except OmegaConfBaseException as error:
            raise ConfigError(f"override {override!r} could not be parsed: {first_line(error)}") from None
        merged = _merge(merged, layer, f"override {override!r}")
    return _to_config(merged, str(path) if path else "overrides")


def _to_config(merged: DictConfig, source: str) -> Config:
    try:
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise _friendly(error, source) from None
    assert isinstance(config, Config)
    return config


def upgrade_saved_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A config tree as an earlier bertforge saved it, with moved keys under their new names and removed
    keys dropped: what a run directory's `config.yaml` means to this version."""
    upgraded = copy.deepcopy(tree)
    for old, new in MOVED_KEYS.items():
        value = _pop_dotted(upgraded, old)
        if value is not _ABSENT:
            *sections, name = new.split(".")
            tree = upgraded
            for section in sections:
                tree = tree.setdefault(section, {})
            tree[name] = value
    for key in REMOVED_KEYS:
        _pop_dotted(upgraded, key)
    return upgraded


_ABSENT = object()


def _pop_dotted(tree: dict[str, Any], key: str) -> Any:
    *sections, name = key.split(".")
    for section in sections:
        tree = tree.get(section) if isinstance(tree, dict) else None  # type: ignore[assignment]
    return tree.pop(name, _ABSENT) if isinstance(tree, dict) else _ABSENT


def load_run_config(path: str | Path) -> Config:
    """A run directory's saved `config.yaml`, also one written by an earlier bertforge (`upgrade_saved_tree`)."""
    merged = _merge(OmegaConf.structured(Config), upgrade_saved_tree(read_yaml(Path(path))), str(path))
    return _to_config(merged, str(path))


def config_to_yaml(config: Config) -> str:
    """The resolved config as YAML; `load_config` of this text gives back an equal config."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def save_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(config_to_yaml(config), encoding="utf-8")
