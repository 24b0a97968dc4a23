"""The three tokenizer models `bertforge tokenizer train --model` trains, one record each.

- `wordpiece`: BERT's (`[CLS] a [SEP] b [SEP]`, token types 0/1), uncased by default (`data/tokenizer.py`).
- `bpe`: byte-level BPE as RoBERTa trains it: GPT-2's byte alphabet (every string encodes, nothing is
  `<unk>`), a space kept as part of the next word (`Ġword`), `<s> a </s></s> b </s>` with no token types.
- `unigram`: a SentencePiece Unigram model as XLM-R's: whitespace split, `▁` marking word starts, XLM-R's
  specials in XLM-R's order (`<unk>` is id 3 there) and template.

Each record also says what `tokenizer_config.json` names, so that `AutoTokenizer` builds the same
tokenizer: transformers 5 rebuilds RoBERTa's and XLM-R's tokenizers from the vocabulary alone, with
their own pre-tokenizer and no normalizer, which is why the trained ones have exactly that shape and
are cased (`--uncased` is WordPiece's only; a `--normalize` removal is a normalizer those classes would drop,
so such a tokenizer names the generic class instead, data/normalization.py). `<mask>` strips the space before it (RoBERTa's and
XLM-R's `lstrip`), so "the <mask> of" masks a whole `Ġword` as pre-training did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from bertforge.data.normalization import with_removals
from bertforge.data.tokenizer import SPECIAL_TOKENS, UNUSED_TOKEN, padded_vocab_size
from bertforge.errors import DataError

ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # fairseq's order: <pad> is 1, <unk> 3
ROBERTA_ROLES = {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>",
                 "bos": "<s>", "eos": "</s>"}
# Unigram's scores differ between two runs in their last bits (the Rust trainer sums over a hash map, whose order
# changes every process); rounded to this many decimals they are the same, and the segmentation does not notice
UNIGRAM_SCORE_DECIMALS = 4
UNUSED_SCORE_BELOW = 100.0  # padding pieces score this far below the worst trained one: never chosen


@dataclass(frozen=True)
class TokenizerModel:
    """What one model needs to be trained, saved and loaded back the same by `AutoTokenizer`."""

    name: str
    specials: tuple[str, ...]  # ids 0, 1, ... in this order
    roles: dict[str, str]  # role (cls, sep, pad, unk, mask, bos, eos) -> token, for special_tokens_map.json
    tokenizer_class: str  # tokenizer_config.json's: the transformers class that builds the same tokenizer
    minimum_vocab_size: int
    cased_only: bool
    input_names: tuple[str, ...]  # what the family's model takes: token types for BERT only
    config: dict[str, Any] = field(default_factory=dict)  # further tokenizer_config.json keys
    describe: str = ""


def byte_level_bpe(vocab_size: int, min_frequency: int, show_progress: bool) -> tuple[Tokenizer, trainers.Trainer]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(ROBERTA_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress)
    return tokenizer, trainer


def unigram(vocab_size: int, min_frequency: int, show_progress: bool) -> tuple[Tokenizer, trainers.Trainer]:
    del min_frequency  # Unigram prunes by likelihood, not by pair counts
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = _xlm_r_pre_tokenizer()
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(ROBERTA_SPECIALS), unk_token="<unk>",
                                      show_progress=show_progress)
    return tokenizer, trainer


def _xlm_r_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                    pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])


def train_subword(texts: Iterable[str], model: TokenizerModel, *, vocab_size: int, min_frequency: int,
                  show_progress: bool, normalize: tuple[str, ...] = ()) -> Tokenizer:
    """Train a byte-level BPE or Unigram vocabulary of (at most) `vocab_size`, padded to a multiple of 64.
    `normalize`: the resolved names of data/normalization.py, the tokenizer's only normalizer."""
    build = BUILDERS[model.name]
    tokenizer, trainer = build(vocab_size, min_frequency, show_progress)
    tokenizer.normalizer = with_removals(None, normalize)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    trained = tokenizer.get_vocab_size()
    if trained <= len(model.specials) + (256 if model.name == "bpe" else 0):
        raise DataError("the inputs hold no text to train a tokenizer on; check --input and --text-field")
    unused = [UNUSED_TOKEN.format(n) for n in range(padded_vocab_size(trained) - trained)]
    data = json.loads(tokenizer.to_str())
    cls, sep = model.roles["cls"], model.roles["sep"]
    if model.name == "bpe":
        vocab = data["model"]["vocab"]
        for token in unused:
            vocab[token] = len(vocab)  # no merge leads to them: never produced from text
        tokenizer.model = models.BPE(vocab, [tuple(pair.split(" ", 1)) if isinstance(pair, str) else tuple(pair)
                                             for pair in data["model"]["merges"]])
        tokenizer.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]),
                                                                trim_offsets=True, add_prefix_space=False)
    else:
        specials = [(piece, 0.0) for piece, _ in data["model"]["vocab"][:len(model.specials)]]
        learned = [(piece, round(score, UNIGRAM_SCORE_DECIMALS))
                   for piece, score in _required_characters_in_order(data["model"]["vocab"][len(model.specials):])]
        learned.sort(key=lambda item: (-item[1], item[0]))  # equal scores in one order, every run
        worst = min((score for _, score in learned), default=0.0)
        pieces = specials + learned + [(token, worst - UNUSED_SCORE_BELOW) for token in unused]
        tokenizer.model = models.Unigram(pieces, unk_id=model.specials.index(model.roles["unk"]), byte_fallback=False)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
            special_tokens=[(cls, model.specials.index(cls)), (sep, model.specials.index(sep))])
    # specials as RoBERTa's and XLM-R's are declared: the mask token swallows the space before it
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False, lstrip=token == model.roles["mask"])
                                  for token in model.specials])
    return tokenizer


REQUIRED_CHARACTER_STEP = 1e-4  # the Unigram trainer's score step between the characters it puts back at the end


def _required_characters_in_order(pieces: list[list[Any]]) -> list[tuple[str, float]]:
    """The trainer's pieces, with the characters it had pruned and then put back given their scores in code-point
    order. It scores them one step (1e-4) apart below the others, in the order of a hash set, which changes every
    process (so 'q' and '$' swapped ids between two runs). They are the lowest pieces: single characters whose
    scores differ by a step or nothing."""
    ascending = sorted(range(len(pieces)), key=lambda i: pieces[i][1])
    run = []
    for i in ascending:
        piece, score = pieces[i]
        gap = (score - pieces[run[-1]][1]) / REQUIRED_CHARACTER_STEP if run else 0.0
        if len(piece) != 1 or gap > 1 + 1e-6 or min(abs(gap), abs(gap - 1)) > 1e-6:
            break
        run.append(i)
    scores = sorted((pieces[i][1] for i in run), reverse=True)
    reordered = dict(zip(sorted(pieces[i][0] for i in run), scores, strict=True))
    return [(piece, reordered.get(piece, score)) for piece, score in pieces]


BUILDERS: dict[str, Callable[[int, int, bool], tuple[Tokenizer, trainers.Trainer]]] = {
    "bpe": byte_level_bpe, "unigram": unigram}

_SHARED = {"model_max_length": 512, "clean_up_tokenization_spaces": False}

TOKENIZER_MODELS: dict[str, TokenizerModel] = {model.name: model for model in (
    TokenizerModel(name="wordpiece", specials=SPECIAL_TOKENS,
                   roles=dict(zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS, strict=True)),
                   tokenizer_class="BertTokenizerFast", minimum_vocab_size=105, cased_only=False,
                   input_names=("input_ids", "token_type_ids", "attention_mask"),
                   config={"strip_accents": None, "tokenize_chinese_chars": True, **_SHARED},
                   describe="WordPiece"),
    TokenizerModel(name="bpe", specials=ROBERTA_SPECIALS, roles=ROBERTA_ROLES, tokenizer_class="RobertaTokenizerFast",
                   minimum_vocab_size=256 + len(ROBERTA_SPECIALS) + 100, cased_only=True,
                   input_names=("input_ids", "attention_mask"),
                   config={"add_prefix_space": False, "trim_offsets": True, "errors": "replace", **_SHARED},
                   describe="byte-level BPE"),
    TokenizerModel(name="unigram", specials=ROBERTA_SPECIALS, roles=ROBERTA_ROLES,
                   tokenizer_class="XLMRobertaTokenizerFast", minimum_vocab_size=105, cased_only=True,
                   input_names=("input_ids", "attention_mask"),
                   config={"add_prefix_space": True, **_SHARED}, describe="Unigram"),
)}


def tokenizer_model(name: str) -> TokenizerModel:
    if name not in TOKENIZER_MODELS:
        raise DataError(f"--model {name!r} is not a tokenizer model; choose one of {', '.join(TOKENIZER_MODELS)}")
    return TOKENIZER_MODELS[name]


def model_of_saved(tokenizer: Tokenizer) -> str:
    """wordpiece / bpe / unigram: the model a trained tokenizer holds (what its saved files follow)."""
    kind = type(tokenizer.model).__name__
    return {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}[kind]
