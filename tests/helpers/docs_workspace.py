"""What the documented commands read, made once per test module, tiny and real: the files and run
directories behind the docs' placeholders (`runs/quickstart-pretrain`, `my.yaml`, `reviews-test.csv`,
`runs/sts/final`, `s3://bucket/labels/train.csv`, ...).

`Workspace.item(NAME)` builds item NAME on first use (the runs through `bertforge.cli.main`, as a
user would make them) and returns its path; `Workspace.place(NAME, at)` links it where a command
looks for it, or uploads it when `at` is an `s3://` URL. Items are read-only: a command that writes
into one gets a copy (`place(..., copy=True)`).
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zstandard

from bertforge.cli import main
from bertforge.data.bundled import supersense_labels, supersense_lines
from helpers.documented_commands import REPO
from helpers.finetuning import minilm_dir
from helpers.pairs import gloss_pairs, write_jsonl

TINY_SHAPE = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64"]
QUIET_TRAINING = ["data.num_workers=0", "log.plots=false", "log.tensorboard=false", "log.progress=false"]


def supersense_rows(split: str, count: int) -> list[dict[str, str]]:
    return [json.loads(line) for line in supersense_lines(split, count)]


def write_csv(path: Path, rows: list[dict[str, str]], delimiter: str = ",") -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def finetune_ok(directory: Path, *overrides: str) -> None:
    """`bertforge finetune` of a tiny BERT for 2 steps, set by `overrides` on an empty recipe."""
    recipe = directory / "recipe.yaml"
    recipe.write_text("{}\n", encoding="utf-8")
    run_ok("finetune", str(recipe), "model.preset=bert-tiny", *TINY_SHAPE, "finetune.max_length=32", "train.max_steps=2",
           "train.micro_batch_size=8", "train.global_batch_size=8", *QUIET_TRAINING, *overrides)


def run_ok(*arguments: str) -> None:
    """`bertforge ARGS` in this process; a workspace item that cannot be made is the fixture's failure."""
    assert main(["-q", *arguments]) == 0, f"making a workspace item failed: bertforge {' '.join(arguments)}"


@contextmanager
def working_directory(directory: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        yield


class Workspace:
    """The module's items under `root`, each built once, when a test first needs it."""

    def __init__(self, root: Path, request: pytest.FixtureRequest) -> None:
        self.root = root
        self.request = request
        self.built: dict[str, Path] = {}
        self.builders: dict[str, Callable[[Path], Path]] = {
            name.removeprefix("make_").replace("_", "-"): getattr(self, name)
            for name in dir(self) if name.startswith("make_")}

    def item(self, name: str) -> Path:
        if name not in self.built:
            directory = self.root / name
            directory.mkdir(parents=True, exist_ok=True)  # exists when an earlier test's try failed
            self.built[name] = self.builders[name](directory)
        return self.built[name]

    def place(self, name: str, at: str, cwd: Path, copy: bool = False) -> None:
        """Item `name` (or a file in it: `name/sub/path`) at `at`: a path relative to `cwd` (`~` is `cwd`) or a URL."""
        item, _, inside = name.partition("/")
        source = self.item(item) / inside if inside else self.item(item)
        if at.startswith("s3://"):
            import fsspec

            fs, target = fsspec.core.url_to_fs(at)
            files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
            for file in files:
                fs.put_file(str(file), target if file == source else f"{target}/{file.relative_to(source).as_posix()}")
            return
        target = cwd / Path(at).expanduser() if at.startswith("~") else cwd / at
        target.parent.mkdir(parents=True, exist_ok=True)
        if copy:
            (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        else:
            target.symlink_to(source, target_is_directory=source.is_dir())

    def fixture(self, name: str) -> Path:
        return self.request.getfixturevalue(name)

    # --- text, tokenizers and prepared data -------------------------------------------------------------

    def make_corpus_slice(self, directory: Path) -> Path:
        """300 documents of the bundled corpus (KJV chapters, WordNet glosses) as one .txt file."""
        return self.fixture("corpus_slice")

    def documents(self) -> list[str]:
        return self.item("corpus-slice").read_text(encoding="utf-8").rstrip("\n").split("\n\n")

    def make_corpus(self, directory: Path) -> Path:
        """`corpus/`: the slice as gzipped JSON lines (`corpus/*.jsonl.gz`) and as zstd JSON lines (`*.zst`)."""
        lines = "".join(json.dumps({"text": document}) + "\n" for document in self.documents()).encode()
        (directory / "part-0.jsonl.gz").write_bytes(gzip.compress(lines))
        (directory / "part-1.json.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
        return directory

    def make_c4_corpus(self, directory: Path) -> Path:
        """`s3://corpus/c4/`: one zstd JSON-lines file, as C4 ships."""
        shutil.copy(self.item("corpus") / "part-1.json.zst", directory / "c4-train.00000-of-01024.json.zst")
        return directory

    def make_tokenizer(self, directory: Path) -> Path:
        """A WordPiece tokenizer of 2,000 tokens trained on the slice."""
        return self.fixture("tokenizer_dir")

    def make_prepared(self, directory: Path) -> Path:
        """The slice prepared with `tokenizer` (NSP pairs, 128 tokens)."""
        return self.fixture("prepared_corpus")

    def make_prepared_minilm(self, directory: Path) -> Path:
        """The slice prepared with all-MiniLM-L6-v2's tokenizer, for continued pre-training of MiniLM."""
        run_ok("prepare", "pretrain", "--input", str(self.item("corpus-slice")), "--tokenizer", str(minilm_dir()),
               "--out", str(directory / "data"), "--seq-len", "64", "--workers", "0")
        return directory / "data"

    def prepared_parts(self, directory: Path, parts: int) -> Path:
        for part in range(parts):
            run_ok("prepare", "pretrain", "--input", str(self.item("corpus") / "*.zst"), "--tokenizer",
                   str(self.item("tokenizer")), "--out", str(directory / str(part)), "--num-parts", str(parts),
                   "--part", str(part), "--workers", "0", "--chunk-mb", "0.05")
        return directory

    def make_parts_of_4(self, directory: Path) -> Path:
        """`parts/0` ... `parts/3`: `prepare pretrain --num-parts 4` of `corpus/*.zst`."""
        return self.prepared_parts(directory, 4)

    def make_parts_of_2(self, directory: Path) -> Path:
        return self.prepared_parts(directory, 2)

    def make_bpe_tokenizer(self, directory: Path) -> Path:
        """A byte-level BPE tokenizer of 2,000 tokens trained on the slice (`runs/bpe`)."""
        run_ok("tokenizer", "train", "--model", "bpe", "--input", str(self.item("corpus-slice")), "--vocab-size", "2000",
               "--out", str(directory / "bpe"))
        return directory / "bpe"

    def make_prepared_bpe(self, directory: Path) -> Path:
        """The slice prepared with `bpe-tokenizer` (`data/bpe`)."""
        run_ok("prepare", "pretrain", "--input", str(self.item("corpus-slice")), "--tokenizer",
               str(self.item("bpe-tokenizer")), "--out", str(directory / "bpe"), "--workers", "0")
        return directory / "bpe"

    # --- runs -------------------------------------------------------------------------------------------

    def make_pretrained(self, directory: Path) -> Path:
        """`runs/quickstart-pretrain`: a tiny BERT pre-trained 2 steps on `prepared` (final/ has its MLM head)."""
        run_ok("pretrain", str(REPO / "configs/pretrain/quickstart.yaml"), f"data.path={self.item('prepared')}",
               f"run.output_dir={directory}", "run.name=quickstart-pretrain", "train.max_steps=2",
               "train.micro_batch_size=8", "train.global_batch_size=8", "data.validation_samples=8", *TINY_SHAPE,
               *QUIET_TRAINING)
        return directory / "quickstart-pretrain"

    def make_roberta(self, directory: Path) -> Path:
        """`runs/roberta`: roberta-tiny pre-trained 2 steps on `prepared-bpe`."""
        run_ok("pretrain", str(REPO / "configs/pretrain/quickstart.yaml"), "model.preset=roberta-tiny",
               f"data.path={self.item('prepared-bpe')}", f"run.output_dir={directory}", "run.name=roberta",
               "train.max_steps=2", "train.micro_batch_size=8", "train.global_batch_size=8", "data.validation_samples=8",
               *QUIET_TRAINING)
        return directory / "roberta"

    def make_hf_bert(self, directory: Path) -> Path:
        """A Hugging Face BERT directory (`models/bert-base-uncased` in configs/glue/bert-base.yaml)."""
        return self.item("pretrained") / "final"

    def make_supersense(self, directory: Path) -> Path:
        """`supersense/{train,validation,test}.jsonl`: 64 / 16 / 16 evenly spaced rows of the bundled splits."""
        for split, rows in (("train", 64), ("validation", 16), ("test", 16)):
            write_jsonl(directory / f"{split}.jsonl", supersense_rows(split, rows))
        return directory

    def make_classifier(self, directory: Path) -> Path:
        """`runs/supersense-minilm`: the suite's tiny supersense classifier (MiniLM's tokenizer, 45 labels,
        checkpoints at steps 2 and 4)."""
        return self.fixture("tiny_classifier")

    def make_texts_txt(self, directory: Path) -> Path:
        path = directory / "texts.txt"
        path.write_text("".join(row["text"] + "\n" for row in supersense_rows("test", 6)), encoding="utf-8")
        return path

    def make_masked_txt(self, directory: Path) -> Path:
        path = directory / "masked.txt"
        path.write_text("the [MASK] of the law\nand god said , let there be [MASK]\n", encoding="utf-8")
        return path

    def make_reviews(self, directory: Path) -> Path:
        """The guide's `finetune:` example as `my.yaml` (its reviews with 1-5 stars, negative/neutral/positive
        through label_map) on a tiny BERT, and its files: real glosses as reviews, stars by row."""
        guide = (REPO / "docs/guide.md").read_text(encoding="utf-8")
        [example] = [block for block in guide.split("```yaml\n")[1:] if block.startswith("finetune:")
                     and "label_map" in block]
        example = example.split("```")[0]
        for name, split, rows in (("reviews.csv", "train", 40), ("reviews-dev.csv", "validation", 10),
                                  ("reviews-test.csv", "test", 10)):
            write_csv(directory / name, [{"review": row["text"], "stars": str(1 + i % 5)}
                                         for i, row in enumerate(supersense_rows(split, rows))])
        write_jsonl(directory / "new.jsonl", [{"id": row["id"], "review": row["text"]}
                                              for row in supersense_rows("test", 5)])
        (directory / "my.yaml").write_text(
            f"run: {{name: reviews, output_dir: runs}}\n"
            f"model: {{preset: bert-tiny, tokenizer: {self.item('tokenizer')}, hidden_size: 32, num_layers: 2, "
            "num_heads: 2, intermediate_size: 64}\n"
            "train: {max_epochs: 1, checkpoint_every: 1}\n"
            "data: {num_workers: 0}\nlog: {plots: false, tensorboard: false}\n" + example, encoding="utf-8")
        return directory

    def make_reviews_run(self, directory: Path) -> Path:
        """`runs/reviews` (and `runs/my-classifier`): `finetune my.yaml` for 2 steps, checkpoints at 1 and 2."""
        reviews = self.item("reviews")
        with working_directory(reviews):
            run_ok("finetune", "my.yaml", f"run.output_dir={directory}", "train.max_steps=2")
        return directory / "reviews"

    def glue_rows(self, task: str) -> list[tuple[str, str | None, str]]:
        """The first 48 train rows of a task of `glue_layout` (by its directory name, `MNLI`)."""
        _, expected = self.fixture("glue_layout")
        return expected[task]["train"][:48]

    def make_sts(self, directory: Path) -> Path:
        """`runs/sts` (a tiny pair regressor, sentence1/sentence2/score) and its `dev.tsv`: STS-B-style
        stand-in rows of tests/glue_layout.py."""
        rows = [{"sentence1": a, "sentence2": b, "score": score} for a, b, score in self.glue_rows("STS-B")]
        write_csv(directory / "dev.tsv", rows[:16], delimiter="\t")
        write_csv(directory / "train.tsv", rows[16:], delimiter="\t")
        self.finetune_pairs(directory, "sts", "regression", "sentence1", "sentence2", "score")
        return directory

    def make_nli(self, directory: Path) -> Path:
        """`runs/nli` (a tiny pair classifier, premise/hypothesis) and `pairs.tsv` with a pair_id column: MNLI-style
        stand-in rows of tests/glue_layout.py."""
        rows = [{"pair_id": f"p{i}", "premise": a, "hypothesis": b, "label": label}
                for i, (a, b, label) in enumerate(self.glue_rows("MNLI"))]
        write_csv(directory / "pairs.tsv", rows[:8], delimiter="\t")
        write_csv(directory / "train.tsv", rows[8:], delimiter="\t")
        self.finetune_pairs(directory, "nli", "classification", "premise", "hypothesis", "label")
        return directory

    def finetune_pairs(self, directory: Path, name: str, task_type: str, text: str, pair: str, label: str) -> None:
        train = directory / "train.tsv"
        finetune_ok(directory, f"run.output_dir={directory / 'runs'}", f"run.name={name}",
                    f"model.tokenizer={self.item('tokenizer')}", f"finetune.task_type={task_type}",
                    f"finetune.train_file={train}", f"finetune.validation_file={train}", f"finetune.text_column={text}",
                    f"finetune.text_pair_column={pair}", f"finetune.label_column={label}")

    def make_tagging(self, directory: Path) -> Path:
        """`~/.cache/bertforge/tasks/supersense-tagging/`: glosses' words, the first word of each tagged with its
        gloss's supersense in BIO (real words; the tags are a stand-in for build_parity_tasks.py's)."""
        train_labels: set[str] = set()
        for split, rows in (("train", 48), ("validation", 24), ("test", 24)):
            sentences = []
            for row in supersense_rows(split, rows):
                if split != "train" and row["label"] not in train_labels:
                    continue  # the real task's train split has every tag; a slice of it has not
                train_labels.add(row["label"])
                words = row["text"].split()[:12]
                sentences.append({"tokens": words, "tags": [f"B-{row['label']}"] + ["O"] * (len(words) - 1)})
            write_jsonl(directory / f"{split}.jsonl", sentences)
        write_jsonl(directory / "texts.jsonl", [{"text": row["text"]} for row in supersense_rows("test", 4)])
        return directory

    def make_tagger(self, directory: Path) -> Path:
        """`runs/supersense-tagging-minilm`: a tiny tagger (MiniLM's tokenizer) on `tagging`, 2 steps."""
        tagging = self.item("tagging")
        finetune_ok(directory, f"run.output_dir={directory}", "run.name=tagger", f"model.tokenizer={minilm_dir()}",
                    "finetune.task_type=token_classification", f"finetune.train_file={tagging / 'train.jsonl'}",
                    f"finetune.validation_file={tagging / 'validation.jsonl'}")
        return directory / "tagger"

    def make_embedding_pairs(self, directory: Path) -> Path:
        """`~/.cache/bertforge/tasks/wordnet-embedding/`: anchor/positive pairs of real glosses, `sentences.txt`
        and `pairs.jsonl` (an `anchor` column)."""
        for split, rows in (("train", 32), ("validation", 8), ("test", 8)):
            write_jsonl(directory / f"{split}.jsonl", [{"anchor": pair["anchor"], "positive": pair["positive"]}
                                                       for pair in gloss_pairs(rows, split)])
        (directory / "sentences.txt").write_text("".join(pair["anchor"] + "\n" for pair in gloss_pairs(5, "test")),
                                                 encoding="utf-8")
        shutil.copy(directory / "test.jsonl", directory / "pairs.jsonl")
        return directory

    def make_embedder(self, directory: Path) -> Path:
        """`runs/wordnet-embedding-minilm`: a tiny embedding model (MiniLM's tokenizer) on `embedding-pairs`."""
        pairs = self.item("embedding-pairs")
        finetune_ok(directory, f"run.output_dir={directory}", "run.name=embedder", f"model.tokenizer={minilm_dir()}",
                    "finetune.task_type=embedding", f"finetune.train_file={pairs / 'train.jsonl'}",
                    f"finetune.validation_file={pairs / 'validation.jsonl'}", "finetune.text_column=anchor",
                    "finetune.text_pair_column=positive")
        return directory / "embedder"

    def make_choices(self, directory: Path) -> Path:
        """`~/.cache/bertforge/tasks/wordnet-choice/`: a gloss's first words and four glosses to choose from, its
        own one of them (real text; build_parity_tasks.py's questions are a synset's word and usage)."""
        for split, rows in (("train", 32), ("validation", 8), ("test", 8)):
            glosses = [row["text"] for row in supersense_rows(split, rows + 3)]
            write_jsonl(directory / f"{split}.jsonl", [
                {"text": " ".join(gloss.split()[:4]), "choices": glosses[i:i + 4][::-1] if i % 2 else glosses[i:i + 4],
                 "label": 3 if i % 2 else 0} for i, gloss in enumerate(glosses[:rows])])
        return directory

    def make_chooser(self, directory: Path) -> Path:
        """`runs/wordnet-choice-minilm`: a tiny multiple-choice model (MiniLM's tokenizer) on `choices`."""
        choices = self.item("choices")
        finetune_ok(directory, f"run.output_dir={directory}", "run.name=chooser", f"model.tokenizer={minilm_dir()}",
                    "finetune.task_type=multiple_choice", f"finetune.train_file={choices / 'train.jsonl'}",
                    f"finetune.validation_file={choices / 'validation.jsonl'}")
        return directory / "chooser"

    def make_user_task(self, directory: Path) -> Path:
        """`my_task.py` (class MyTask: the bag-of-words example under a user's name) and its `my.yaml`."""
        example = (REPO / "examples/tasks/bag_of_words.py").read_text(encoding="utf-8")
        (directory / "my_task.py").write_text(example + "\n\nclass MyTask(BagOfWordsSupersense):\n    pass\n",
                                              encoding="utf-8")
        shutil.copy(REPO / "examples/tasks/bag_of_words.yaml", directory / "my.yaml")
        return directory

    def make_multilingual_task(self, directory: Path) -> Path:
        """`~/.cache/bertforge/tasks/manpages-multilingual/`: 8 / 2 / 4 rows per language of each split of the task
        scripts/build_parity_tasks.py builds from the installed man pages."""
        from helpers.scripts import load_repo_script

        script = load_repo_script("scripts/build_parity_tasks.py", "build_parity_tasks")
        task = script.build_manpages_multilingual()
        for split, per_language in (("train", 8), ("validation", 2), ("test", 4)):
            rows = [row for language in script.MAN_LANGUAGES
                    for row in script._evenly_spaced([r for r in task.splits[split] if r["language"] == language],
                                                     per_language)]
            write_jsonl(directory / f"{split}.jsonl", rows)
        return directory

    def make_multilingual_tokenizer(self, directory: Path) -> Path:
        """`runs/multilingual-tokenizer`: a cased WordPiece tokenizer of the task slice's train text."""
        run_ok("tokenizer", "train", "--cased", "--input", str(self.item("multilingual-task") / "train.jsonl"),
               "--text-field", "text", "--vocab-size", "1000", "--out", str(directory / "tokenizer"))
        return directory / "tokenizer"

    def make_multilingual_data(self, directory: Path) -> Path:
        """`runs/multilingual-data`: the slice's train text prepared with `multilingual-tokenizer`."""
        run_ok("prepare", "pretrain", "--input", str(self.item("multilingual-task") / "train.jsonl"), "--text-field",
               "text", "--tokenizer", str(self.item("multilingual-tokenizer")), "--out", str(directory / "data"),
               "--seq-len", "64", "--workers", "0")
        return directory / "data"

    def make_multilingual_pretrained(self, directory: Path) -> Path:
        """`runs/multilingual-distilbert-pretrain`: configs/pretrain/multilingual-distilbert.yaml at 32 wide, 2 steps."""
        run_ok("pretrain", str(REPO / "configs/pretrain/multilingual-distilbert.yaml"),
               f"data.path={self.item('multilingual-data')}", f"run.output_dir={directory}", "run.name=pretrained",
               "train.max_steps=2", "train.micro_batch_size=8", "train.global_batch_size=8", "data.validation_samples=4",
               *TINY_SHAPE, *QUIET_TRAINING)
        return directory / "pretrained"

    def make_glue(self, directory: Path) -> Path:
        """A GLUE-layout directory of WordNet stand-in tasks (tests/glue_layout.py), 300 train / 100 dev rows."""
        return self.fixture("glue_dir")


SUPERSENSE_LABELS = f"finetune.labels=[{','.join(supersense_labels())}]"
