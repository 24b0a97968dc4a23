"""What a tokenizer directory's special tokens are: each role's token (pad, unk, cls, sep, mask) and its id.

A leaf of the package (it imports nothing else of bertforge), so that the data readers, the tokenizer
and the model exporters (`models/`, which imports nothing above it) read a tokenizer's roles one way.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordPiece

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # BERT's, in the order a new vocabulary starts with
ROLES = ("pad", "unk", "cls", "sep", "mask")
BERT_TOKENS = dict(zip(ROLES, SPECIAL_TOKENS, strict=True))
ROBERTA_TOKENS = {"pad": "<pad>", "unk": "<unk>", "cls": "<s>", "sep": "</s>", "mask": "<mask>"}


def special_tokens_of(directory: Path | None, tokenizer: Tokenizer) -> dict[str, str]:
    """Role (pad/unk/cls/sep/mask) -> token, as the directory's special_tokens_map.json / tokenizer_config.json
    name them; a role they leave out takes BERT's token, or RoBERTa's (`<s>`, `</s>`, `<pad>`, `<unk>`,
    `<mask>`) when the vocabulary has that one instead. Roles with neither in the vocabulary are left out."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name if directory is not None else None
        if path is None or not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        for role in ROLES:
            value = data.get(f"{role}_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and role not in found:
                found[role] = value
    def in_vocabulary(token: str) -> bool:
        # not `token in tokenizer.get_vocab()`: that builds the whole vocabulary as a dict, 40 ms for MiniLM's
        # 30k words, and a fine-tune asks here about ten times
        return tokenizer.token_to_id(token) is not None

    for role in ROLES:
        if role not in found:
            found[role] = next((defaults[role] for defaults in (BERT_TOKENS, ROBERTA_TOKENS)
                                if in_vocabulary(defaults[role])), BERT_TOKENS[role])
    return {role: token for role, token in found.items() if in_vocabulary(token)}


def special_token_ids(tokenizer_dir: str | Path | None) -> dict[str, int]:
    """pad/cls/sep/mask ids of a tokenizer directory (tokenizer.json, or BERT's vocab.txt), by role: the tokens its
    special_tokens_map.json names, else BERT's ([PAD] [CLS] [SEP] [MASK]) or RoBERTa's (<pad> <s> </s> <mask>)."""
    if tokenizer_dir is None:
        return {}
    directory = Path(tokenizer_dir)
    if (directory / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    elif (directory / "vocab.txt").is_file():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
        tokenizer = Tokenizer(WordPiece({token: index for index, token in enumerate(lines)}))
    else:
        return {}
    roles = special_tokens_of(directory, tokenizer)
    return {role: tokenizer.token_to_id(token) for role, token in roles.items() if role in ("pad", "cls", "sep", "mask")}
