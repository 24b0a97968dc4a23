"""Every `bertforge` command the docs and the `--help` examples show runs, as written, on tiny real inputs.

Each documented command (tests/helpers/documented_commands.py finds them: README.md, docs/*.md, every
`--help` epilog) has a `Run` below saying what its placeholders stand for (`runs/quickstart-pretrain`,
`my.yaml`, `s3://bucket/...` on the suite's S3 server: tests/helpers/docs_workspace.py makes them) and
what shrinks it (overrides appended as KEY=VALUE, or an option given again with a smaller value: the
last one wins), or is listed in NOT_RUN with the reason. It runs through `bertforge.cli.main` in this
process, in a directory of its own where `configs/` and `examples/` are the repository's, and must
exit 0 and write its `--out`. A command documented with a launcher (`torchrun ...`) runs here as its
one process; tests/test_distributed.py and tests/test_multinode.py launch such commands for real.

A new documented command fails `test_every_documented_command_is_run_here_or_listed` until it is given
a `Run` or a reason; a command dropped from the docs fails it until its entry goes too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.docs_workspace import SUPERSENSE_LABELS, TINY_SHAPE, Workspace
from helpers.documented_commands import REPO, documented_commands, help_examples, shell_words
from helpers.s3_server import BUCKET

from bertforge.cli import main


@dataclass(frozen=True)
class Run:
    """How a documented command runs here."""

    inputs: Mapping[str, str] = field(default_factory=dict)  # a path the command reads -> the workspace item
    shrink: str = ""  # appended to the command line
    replace: tuple[tuple[str, str], ...] = ()  # a rewrite of what a shell would expand, or of a size kept in a name
    copy_inputs: bool = False  # the command writes into what it reads: it gets copies
    exit_code: int = 0


# what the docs' absolute paths and other buckets stand for, in every command
PLACEHOLDERS = (("s3://bucket/", "{bucket}/"), ("s3://corpus/", "{bucket}/corpus/"),
                ("s3://scratch/", "{bucket}/scratch/"), ("=/data/", "=data/"),
                ("/shared/", "shared/"), ("/tmp/glue-demo", "glue-demo"))

QUIET = "data.num_workers=0 log.plots=false log.tensorboard=false"
PRETRAIN = f"train.max_steps=2 train.micro_batch_size=8 train.global_batch_size=8 data.validation_samples=8 {QUIET}"
TINY = " ".join(TINY_SHAPE)  # a preset's kind of layers (ALiBi, GLU, ...) at 32 wide
# the MiniLM recipes' batches of 32 (x 4 choices for multiple choice) were most of each command's CPU here
FINETUNE = f"train.max_steps=2 finetune.max_length=32 train.micro_batch_size=8 train.global_batch_size=8 {QUIET}"
SUPERSENSE = (f"{FINETUNE} finetune.train_file=supersense/train.jsonl finetune.validation_file=supersense/validation.jsonl "
              f"finetune.test_file=supersense/test.jsonl {SUPERSENSE_LABELS}")
GLUE_JOBS = "glue.seeds=1 glue.overrides.all=[train.max_steps=2,finetune.max_length=32,data.num_workers=0,log.plots=false]"
TINY_GLUE = f"model.init_from=runs/quickstart-pretrain {GLUE_JOBS}"  # each job loading MiniLM cost ~14 s of CPU here
# the bundled corpus (11 MB) replaced by its 300-document slice: tokenizing all of it takes most of a minute here
SMALL_CORPUS = (("bundled:corpus", "corpus.txt"),)
CORPUS_SLICE = {"corpus.txt": "corpus-slice"}
BUNDLED_TEST = (("bundled:supersense/test", "supersense/test.jsonl"),)  # 16 rows instead of 11,729

PRETRAINED = {"runs/quickstart-pretrain": "pretrained"}
CLASSIFIER = {"runs/supersense-minilm": "classifier"}
SUPERSENSE_FILES = {"supersense": "supersense"}
REVIEWS = {"my.yaml": "reviews/my.yaml", "reviews.csv": "reviews/reviews.csv",
           "reviews-dev.csv": "reviews/reviews-dev.csv", "reviews-test.csv": "reviews/reviews-test.csv"}
TAGGING = {"~/.cache/bertforge/tasks/supersense-tagging": "tagging"}
EMBEDDING_PAIRS = {"~/.cache/bertforge/tasks/wordnet-embedding": "embedding-pairs"}
CHOICES = {"~/.cache/bertforge/tasks/wordnet-choice": "choices"}
EMBEDDER = {"runs/wordnet-embedding-minilm": "embedder"}
MULTILINGUAL_TASK = {"~/.cache/bertforge/tasks/manpages-multilingual": "multilingual-task"}
MULTILINGUAL_TRAIN = "~/.cache/bertforge/tasks/manpages-multilingual/train.jsonl --text-field text"

RUNS: dict[str, Run] = {
    "data samples": Run(),
    # tokenizer and data
    "tokenizer train --input bundled:corpus --vocab-size 8192 --out runs/tokenizer": Run(CORPUS_SLICE, replace=SMALL_CORPUS),
    "tokenizer train --input bundled:corpus --vocab-size 8192 --out tok": Run(CORPUS_SLICE, replace=SMALL_CORPUS),
    "tokenizer train --model bpe --input bundled:corpus --vocab-size 8192 --out runs/bpe":
        Run(CORPUS_SLICE, replace=SMALL_CORPUS),
    "prepare pretrain --input bundled:corpus --tokenizer runs/tokenizer --out runs/data-128 --seq-len 128":
        Run({**CORPUS_SLICE, "runs/tokenizer": "tokenizer"}, "--workers 0", SMALL_CORPUS),
    "prepare pretrain --input bundled:corpus --tokenizer runs/tokenizer --out runs/data --seq-len 128":
        Run({**CORPUS_SLICE, "runs/tokenizer": "tokenizer"}, "--workers 0", SMALL_CORPUS),
    "prepare pretrain --input bundled:corpus --tokenizer tok --out data":
        Run({**CORPUS_SLICE, "tok": "tokenizer"}, "--workers 0", SMALL_CORPUS),
    "prepare pretrain --input 'corpus/*.jsonl.gz' --tokenizer runs/tokenizer --out s3://bucket/data --nsp":
        Run({"corpus": "corpus", "runs/tokenizer": "tokenizer"}, "--workers 0"),
    "prepare pretrain --input 'corpus/*.jsonl.gz' --tokenizer runs/tokenizer --out s3://bucket/data-128":
        Run({"corpus": "corpus", "runs/tokenizer": "tokenizer"}, "--workers 0"),
    "prepare pretrain --input 'corpus/*.zst' --tokenizer tok --out parts/0 --num-parts 4 --part 0":
        Run({"corpus": "corpus", "tok": "tokenizer"}, "--workers 0 --chunk-mb 0.05"),
    "prepare merge parts/0 parts/1 parts/2 parts/3 --out data": Run({"parts": "parts-of-4"}),
    "prepare pretrain --input 's3://corpus/c4/*.json.zst' --tokenizer /shared/tokenizer  --seq-len 128 --num-parts 16 "
    "--part \"$SLURM_ARRAY_TASK_ID\" --out \"s3://scratch/c4-128-parts/$SLURM_ARRAY_TASK_ID\"":
        Run({"s3://corpus/c4": "c4-corpus", "/shared/tokenizer": "tokenizer"}, "--workers 0"),
    # two parts of the tiny corpus stand for the docs' sixteen
    "prepare merge $(printf 's3://scratch/c4-128-parts/%d ' $(seq 0 15)) --out s3://bucket/c4-128":
        Run({"s3://scratch/c4-128-parts": "parts-of-2"},
            replace=(("$(printf 's3://scratch/c4-128-parts/%d ' $(seq 0 15))",
                      "s3://scratch/c4-128-parts/0 s3://scratch/c4-128-parts/1"),)),
    # pre-training
    "pretrain configs/pretrain/quickstart.yaml": Run({"runs/data-128": "prepared"}, PRETRAIN),
    "pretrain configs/pretrain/quickstart.yaml train.max_steps=100 optim.lr=1e-3": Run({"runs/data-128": "prepared"}, PRETRAIN),
    "pretrain configs/pretrain/quickstart.yaml --print-config optim.lr=1e-3": Run(),
    "pretrain configs/pretrain/quickstart.yaml data.path=data/corpus-128 train.max_steps=300":
        Run({"data/corpus-128": "prepared"}, PRETRAIN),
    "pretrain configs/pretrain/quickstart.yaml model.init_from=all-MiniLM-L6-v2 data.path=data/my-corpus":
        Run({"data/my-corpus": "prepared-minilm"}, f"{PRETRAIN} train.micro_batch_size=4 train.global_batch_size=4"),
    "pretrain configs/pretrain/quickstart.yaml model.init_from=runs/quickstart-pretrain run.name=more":
        Run({**PRETRAINED, "runs/data-128": "prepared"}, PRETRAIN),
    "pretrain configs/pretrain/budget-cpu.yaml data.path=runs/data-128 train.max_time_minutes=40":
        Run({"runs/data-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/bert-base.yaml data.path=s3://bucket/data-128":
        Run({"s3://bucket/data-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/crammed-bert.yaml data.path=DATA": Run({"DATA": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/mosaic-bert-base.yaml  data.path=/data/c4-128 dist.strategy=ddp":
        Run({"data/c4-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/mosaic-bert-base.yaml  data.path=s3://bucket/c4-128 dist.strategy=ddp":
        Run({"s3://bucket/c4-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/bert-base.yaml  data.path=/shared/data/wiki-books-128 run.output_dir=/shared/runs":
        Run({"/shared/data/wiki-books-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "pretrain configs/pretrain/bert-base.yaml  data.path=/shared/data/wiki-books-128 run.output_dir=/shared/runs "
    "run.name=bert-base": Run({"/shared/data/wiki-books-128": "prepared"}, f"{PRETRAIN} {TINY}"),
    "prepare pretrain --input bundled:corpus --tokenizer runs/bpe --out data/bpe":
        Run({**CORPUS_SLICE, "runs/bpe": "bpe-tokenizer"}, "--workers 0", SMALL_CORPUS),
    "pretrain configs/pretrain/quickstart.yaml model.preset=roberta-tiny data.path=data/bpe run.name=roberta":
        Run({"data/bpe": "prepared-bpe"}, PRETRAIN),
    "fill-mask runs/roberta \"And God said, Let there be <mask>.\"": Run({"runs/roberta": "roberta"}),
    "plot runs/quickstart-pretrain --overwrite": Run(PRETRAINED, copy_inputs=True),
    "plot runs/quickstart-pretrain": Run(PRETRAINED, copy_inputs=True),
    # the multilingual DistilBERT workflow on 48 rows of the man-page task (all of it: tests/test_multilingual_distilbert.py)
    f"tokenizer train --cased --input {MULTILINGUAL_TRAIN} --vocab-size 8192 --out runs/multilingual-tokenizer":
        Run(MULTILINGUAL_TASK, "--vocab-size 1000"),
    f"prepare pretrain --input {MULTILINGUAL_TRAIN} --tokenizer runs/multilingual-tokenizer --out runs/multilingual-data "
    "--seq-len 128": Run({**MULTILINGUAL_TASK, "runs/multilingual-tokenizer": "multilingual-tokenizer"},
                         "--workers 0 --seq-len 64"),
    "pretrain configs/pretrain/multilingual-distilbert.yaml":
        Run({"runs/multilingual-data": "multilingual-data"}, f"{PRETRAIN} {TINY} data.validation_samples=4"),
    "finetune configs/finetune/multilingual-distilbert.yaml model.init_from=runs/multilingual-distilbert-pretrain "
    "run.name=multilingual-distilbert-small optim.lr=1e-3":
        Run({**MULTILINGUAL_TASK, "runs/multilingual-distilbert-pretrain": "multilingual-pretrained"},
            f"{FINETUNE} train.max_epochs=null"),
    "finetune configs/finetune/multilingual-distilbert.yaml model.init_from=null model.preset=distilbert-tiny "
    "model.tokenizer=runs/multilingual-tokenizer run.name=multilingual-distilbert-scratch optim.lr=1e-3":
        Run({**MULTILINGUAL_TASK, "runs/multilingual-tokenizer": "multilingual-tokenizer"},
            f"{FINETUNE} {TINY} train.max_epochs=null"),
    # a user's own task
    "train --task examples/tasks/bag_of_words.py:BagOfWordsSupersense examples/tasks/bag_of_words.yaml":
        Run(shrink=f"train.max_steps=2 {QUIET}"),
    "train --task examples/tasks/bag_of_words.py:BagOfWordsSupersense  examples/tasks/bag_of_words.yaml "
    "train.max_epochs=1": Run(shrink=f"train.max_steps=2 {QUIET}"),
    "train --task my_task.py:MyTask my.yaml": Run({"my_task.py": "user-task/my_task.py", "my.yaml": "user-task/my.yaml"},
                                                  f"train.max_steps=2 {QUIET}"),
    # fine-tuning
    "finetune configs/finetune/supersense-minilm.yaml train.max_steps=200 train.eval_every=100":
        Run(SUPERSENSE_FILES, SUPERSENSE),
    "finetune configs/finetune/supersense-minilm.yaml": Run(SUPERSENSE_FILES, SUPERSENSE),
    "finetune configs/finetune/supersense-tiny.yaml": Run({**SUPERSENSE_FILES, **PRETRAINED}, SUPERSENSE),
    "finetune configs/finetune/supersense-tiny.yaml model.init_from=runs/quickstart-pretrain":
        Run({**SUPERSENSE_FILES, **PRETRAINED}, SUPERSENSE),
    "finetune configs/finetune/supersense-tiny.yaml run.name=supersense-tiny-scratch  model.init_from=null "
    "model.tokenizer=runs/tokenizer": Run({**SUPERSENSE_FILES, "runs/tokenizer": "tokenizer"}, SUPERSENSE),
    "finetune configs/finetune/supersense-tagging-minilm.yaml": Run(TAGGING, FINETUNE),
    "finetune configs/finetune/wordnet-embedding-minilm.yaml": Run(EMBEDDING_PAIRS, FINETUNE),
    "finetune configs/finetune/wordnet-choice-minilm.yaml": Run(CHOICES, FINETUNE),
    "finetune my.yaml train.micro_batch_size=16": Run(REVIEWS, "train.max_steps=2"),
    "finetune my.yaml finetune.train_file=s3://bucket/labels/train.csv finetune.validation_file=s3://bucket/labels/dev.csv":
        Run({**REVIEWS, "s3://bucket/labels/train.csv": "reviews/reviews.csv",
             "s3://bucket/labels/dev.csv": "reviews/reviews-dev.csv"}, "train.max_steps=2"),
    # inference
    "predict runs/supersense-minilm --input bundled:supersense/test --out preds.jsonl":
        Run({**CLASSIFIER, **SUPERSENSE_FILES}, replace=BUNDLED_TEST),
    "predict runs/supersense-minilm --input texts.txt --out preds.jsonl --overwrite":
        Run({**CLASSIFIER, "texts.txt": "texts-txt"}),
    "predict runs/supersense-minilm --text \"a small domesticated carnivore\" --text \"to run fast\"": Run(CLASSIFIER),
    "predict runs/my-classifier --input s3://bucket/labels/new.jsonl --out predictions.jsonl":
        Run({"runs/my-classifier": "reviews-run", "s3://bucket/labels/new.jsonl": "reviews/new.jsonl"}),
    "predict runs/nli/final --input pairs.tsv --text-column premise --text-pair-column hypothesis  --id-column pair_id "
    "--out preds.jsonl": Run({"runs/nli": "nli/runs/nli", "pairs.tsv": "nli/pairs.tsv"}),
    "predict runs/supersense-tagging-minilm --input texts.jsonl --out entities.jsonl":
        Run({"runs/supersense-tagging-minilm": "tagger", "texts.jsonl": "tagging/texts.jsonl"}),
    "evaluate runs/supersense-minilm --data bundled:supersense/test":
        Run({**CLASSIFIER, **SUPERSENSE_FILES}, replace=BUNDLED_TEST),
    "evaluate runs/supersense-minilm --data bundled:supersense/test --split-name test2 --out-dir reports/":
        Run({**CLASSIFIER, **SUPERSENSE_FILES}, replace=BUNDLED_TEST),
    # a 2-step run's checkpoint stands for step 500
    "evaluate runs/reviews/checkpoints/step-00000500 --data reviews-test.csv --out-dir reports/":
        Run({"runs/reviews": "reviews-run", "reviews-test.csv": "reviews/reviews-test.csv"},
            replace=(("step-00000500", "step-00000002"),)),
    "evaluate runs/sts/final --data dev.tsv --text-column sentence1 --text-pair-column sentence2  --label-column score "
    "--split-name dev --out-dir reports/": Run({"runs/sts": "sts/runs/sts", "dev.tsv": "sts/dev.tsv"}),
    "evaluate runs/wordnet-embedding-minilm --data ~/.cache/bertforge/tasks/wordnet-embedding/test.jsonl":
        Run({**EMBEDDER, **EMBEDDING_PAIRS}),
    "evaluate runs/wordnet-choice-minilm --data ~/.cache/bertforge/tasks/wordnet-choice/test.jsonl":
        Run({"runs/wordnet-choice-minilm": "chooser", **CHOICES}),
    "embed runs/wordnet-embedding-minilm --input sentences.txt --out vectors.npy":
        Run({**EMBEDDER, "sentences.txt": "embedding-pairs/sentences.txt"}),
    "embed runs/wordnet-embedding-minilm --input sentences.txt --out vectors.npy --backend onnx":
        Run({**EMBEDDER, "sentences.txt": "embedding-pairs/sentences.txt"}),
    "embed all-MiniLM-L6-v2 --input pairs.jsonl --text-column anchor --out anchors.npy":
        Run({"pairs.jsonl": "embedding-pairs/pairs.jsonl"}),
    "embed all-MiniLM-L6-v2 --input pairs.jsonl --text-column anchor --out anchors.npy --overwrite":
        Run({"pairs.jsonl": "embedding-pairs/pairs.jsonl"}),
    "embed all-MiniLM-L6-v2 --input pairs.jsonl --text-column anchor --out anchors.parquet":
        Run({"pairs.jsonl": "embedding-pairs/pairs.jsonl"}),
    "fill-mask runs/quickstart-pretrain \"the [MASK] of the law\"": Run(PRETRAINED),
    "fill-mask runs/quickstart-pretrain \"[MASK] said unto moses\" --top-k 3 --json": Run(PRETRAINED),
    "fill-mask runs/quickstart-pretrain/final \"and god said , let there be [MASK]\" --top-k 3 --json": Run(PRETRAINED),
    "fill-mask runs/quickstart-pretrain --input masked.txt --out filled.jsonl": Run({**PRETRAINED, "masked.txt": "masked-txt"}),
    # export
    "export runs/supersense-minilm --out exported/supersense": Run(CLASSIFIER),
    "export runs/supersense-minilm --out exported/supersense-onnx --format onnx": Run(CLASSIFIER),
    "export runs/supersense-minilm/checkpoints/step-00000250 --out exported/onnx --format onnx":
        Run(CLASSIFIER, replace=(("step-00000250", "step-00000004"),)),
    "export runs/my-classifier --out s3://bucket/models/my-classifier": Run({"runs/my-classifier": "reviews-run"}),
    # GLUE on the WordNet stand-in tasks from the tiny pre-trained model, one task a command (a job is a process of
    # its own, ~9 s of CPU here) but two where RTE starts from MNLI's model; all eight: tests/test_glue_runner.py
    "glue configs/glue/minilm-cpu.yaml --data-dir /tmp/glue-demo --jobs 2  glue.tasks=[cola,sst2,mrpc,stsb,qqp,mnli,"
    "qnli,rte] glue.overrides.all=[train.max_steps=20]":
        Run({"/tmp/glue-demo": "glue", **PRETRAINED}, f"glue.tasks=[stsb] {TINY_GLUE}"),
    "glue configs/glue/minilm-cpu.yaml --data-dir glue_data --jobs 2 glue.tasks=[rte,mrpc]":
        Run({"glue_data": "glue", **PRETRAINED}, f"glue.tasks=[rte] {TINY_GLUE}"),
    # MNLI alone: the recipe's RTE waits for MNLI's model (glue.from_mnli), one more job process of the same kind that
    # tests/test_glue_runner.py already runs for RTE, MRPC and STS-B
    "glue configs/glue/bert-base.yaml --data-dir ~/data/glue":
        Run({"~/data/glue": "glue", "models/bert-base-uncased": "hf-bert"}, f"glue.tasks=[mnli] {GLUE_JOBS}"),
    # checking a machine
    "doctor": Run(),
    # bert-base's steps take over a minute of CPU here even at 1 x 32 tokens: the preset is shrunk as for pretrain
    "doctor --preset bert-base --seq-len 128 --steps 20 --json": Run(shrink="--preset bert-tiny --seq-len 32 --batch-size 1 "
                                                                       "--steps 1"),
}

# even at its smallest sizes a quickstart costs about 37 s of CPU here: the tokenizer and shards of the whole bundled
# corpus cannot be shrunk
QUICKSTART_AGAIN = ("`quickstart` with other sizes, --out and --seed: the same stages as `quickstart`, at about 37 s of "
                    "CPU each; tests/test_quickstart.py runs `quickstart` with its sizes as flags and holds the guide's "
                    "plan to the measured one, tests/test_cli_parsing.py parses these lines")
NOT_RUN: dict[str, str] = {
    "quickstart": "tests/test_quickstart.py runs `bertforge quickstart` through bertforge.cli.main with its sizes as "
    "flags (a plan that learns, MiniLM's stage skipped) and the MiniLM stage on its own: a second run of the whole "
    "pipeline here cost 37 s of CPU, most of it the tokenizer and shards of the whole bundled corpus",
    "predict runs/supersense-minilm --input s3://bucket/corpus/reviews.parquet  --out s3://bucket/predictions/reviews.parquet "
    "--num-parts 16 --part $SLURM_ARRAY_TASK_ID": "a Slurm array's line (Slurm sets the part); tests/test_parts.py runs "
    "every part of such splits of predict, embed and fill-mask, reads and writes a part in the suite's S3 bucket, and "
    "checks the parts read in order equal the one-machine run",
    "embed all-MiniLM-L6-v2 --input docs.parquet --id-column doc_id --out vectors.parquet  --num-parts 16 --part 3":
    "a part writes vectors.part-00003-of-00016.parquet, not --out itself; tests/test_parts.py runs embed parts with "
    "--id-column into .parquet and compares them with the one-machine run",
    "serve runs/supersense-tagging-minilm runs/supersense-minilm runs/wordnet-embedding-minilm --port 8080":
    "a server runs until stopped; tests/test_serve.py runs this line as written (on a free port) where the three "
    "runs are a tiny tagger, a tiny classifier and all-MiniLM-L6-v2, and runs the guide's curl and Python examples "
    "against it",
    "finetune configs/finetune/multilingual-distilbert.yaml": "starts from distilbert/distilbert-base-multilingual-cased "
    "in the Hugging Face cache (541 MB, not on this machine); the same recipe runs above from a model pre-trained here, "
    "and tests/test_multilingual_distilbert.py loads the Hub name from a cache holding a tiny DistilBERT under it",
    "quickstart --out runs/quickstart-short --pretrain-steps 1500 --seq-len 64 --train-rows 1000 --validation-rows 200 "
    "--test-rows 1000 --finetune-epochs 4 --minilm-epochs 1 --seed 1": QUICKSTART_AGAIN,
    "quickstart --out runs/quickstart-short --pretrain-steps 1500 --seq-len 64 --train-rows 1000 --validation-rows 200 "
    "--test-rows 1000 --finetune-epochs 4 --minilm-epochs 1": QUICKSTART_AGAIN,
    "quickstart --out runs/quickstart-seed2 --seed 2": QUICKSTART_AGAIN,
}


def all_documented() -> dict[str, str]:
    """Each documented command (its arguments) and where it is shown first."""
    found: dict[str, str] = {}
    for command in documented_commands() + help_examples():
        found.setdefault(command.arguments, command.where)
    return found


def test_every_documented_command_is_run_here_or_listed() -> None:
    documented = all_documented()
    new = [f"{where}: bertforge {arguments}" for arguments, where in documented.items()
           if arguments not in RUNS and arguments not in NOT_RUN]
    assert not new, "documented commands neither run nor listed in NOT_RUN with a reason:\n" + "\n".join(new)
    gone = sorted((RUNS.keys() | NOT_RUN.keys()) - documented.keys())
    assert not gone, "entries for commands the docs no longer show:\n" + "\n".join(gone)
    assert not RUNS.keys() & NOT_RUN.keys()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("documented-workspace"), request)


@pytest.fixture
def command_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh directory the command runs in, as a user's checkout: `configs/` and `examples/` are the
    repository's; `~` is this directory too, for the recipes' `~/.cache/bertforge/tasks/...` files."""
    cwd = tmp_path / "user"
    cwd.mkdir()
    for name in ("configs", "examples"):
        (cwd / name).symlink_to(REPO / name, target_is_directory=True)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(cwd))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield cwd


def with_placeholders(text: str, bucket: str) -> str:
    for placeholder, value in PLACEHOLDERS:
        text = text.replace(placeholder, value.format(bucket=bucket))
    return text


def command_line(arguments: str, run: Run, bucket: str) -> list[str]:
    for old, new in run.replace:
        assert old in arguments, f"{old!r} is no longer in the documented command"
        arguments = arguments.replace(old, new)
    words = shell_words(with_placeholders(f"{arguments} {run.shrink}", bucket))
    return [str(Path(word).expanduser()) if word.startswith("~/") else word for word in words]


def written_outputs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("--out", "--out-dir")]


@pytest.mark.parametrize("arguments", list(RUNS), ids=lambda arguments: arguments[:80])
def test_the_documented_command_runs(arguments: str, workspace: Workspace, command_directory: Path,
                                     request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    run = RUNS[arguments]
    bucket = f"s3://{BUCKET}/documented-{uuid.uuid4().hex[:8]}"
    if "s3://" in arguments:
        request.getfixturevalue("s3_environment")
    for at, item in run.inputs.items():
        workspace.place(item, with_placeholders(at, bucket), command_directory, copy=run.copy_inputs)
    argv = command_line(arguments, run, bucket)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == run.exit_code, f"bertforge {' '.join(argv)} exited {code}:\n{err[-3000:]}"
    for out in written_outputs(argv):
        if not out.startswith("s3://"):
            assert (command_directory / out).exists(), f"bertforge {' '.join(argv)} wrote no {out}"
