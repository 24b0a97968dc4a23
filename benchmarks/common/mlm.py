"""The pre-training comparisons' shared settings and their one MLM scoring: every model, bertforge's or HF's, is
scored by stock `transformers.BertForMaskedLM` on the same batches with the same fixed masks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bertforge.tasks.mlm_plateau import UnigramGuess

SEQ_LEN = 128
VOCAB_SIZE = 8192
MASK_PROBABILITY = 0.15
WARMUP_FRACTION = 0.06
EVAL_BATCH = 64
EVALUATION_SEED = 42  # the validation masks: the same for every arm and every training seed
DEVICE_DEFAULTS = {  # model, global batch, real tokens per arm, peak learning rate
    "cpu": {"model": "bert-mini", "batch_size": 32, "tokens": 350_000, "lr": 1e-3},
    "cuda": {"model": "bert-base", "batch_size": 256, "tokens": 10_000_000, "lr": 2e-4},
}


def packed_validation_batches(data_dir: Path, seed: int) -> list[dict[str, Any]]:
    """bertforge's validation split as padded HF batches with fixed masks (labels -100 elsewhere)."""
    from bertforge.data.masking import MaskingSettings
    from bertforge.data.pretraining_loader import build_eval_loader
    from bertforge.data.shards import PretokenizedDataset

    validation = PretokenizedDataset(data_dir, "validation")
    loader = build_eval_loader(validation, micro_batch_size=EVAL_BATCH, layout="padded",
                               masking=MaskingSettings(mask_prob=MASK_PROBABILITY, seed=seed))
    return list(loader)


def line_validation_batches(tokenizer_dir: Path, lines: list[str], seed: int) -> list[dict[str, Any]]:
    """The validation documents' single lines, masked once by HF's collator under a fixed seed."""
    import torch
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY)
    encoded = tokenizer(lines, truncation=True, max_length=SEQ_LEN)
    rows = [{key: encoded[key][i] for key in encoded} for i in range(len(lines))]
    torch.manual_seed(seed)
    return [collator(rows[start:start + EVAL_BATCH]) for start in range(0, len(rows), EVAL_BATCH)]


def mlm_accuracy(model_dir: str, batches: list[dict[str, Any]], device: str) -> dict[str, float]:
    import torch
    from transformers import BertForMaskedLM

    model = BertForMaskedLM.from_pretrained(model_dir, attn_implementation="sdpa").to(device).eval()
    correct = masked = 0
    loss_sum = 0.0
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        for batch in batches:
            inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids")}
            labels = batch["labels"].to(device)
            logits = model(**inputs).logits.float()
            chosen = labels != -100
            correct += int((logits[chosen].argmax(-1) == labels[chosen]).sum())
            masked += int(chosen.sum())
            loss_sum += float(torch.nn.functional.cross_entropy(logits[chosen], labels[chosen], reduction="sum"))
    return {"accuracy": correct / max(masked, 1), "loss": loss_sum / max(masked, 1), "masked_tokens": masked}


def unigram_baseline(data_dir: Path, batches: list[dict[str, Any]]) -> tuple[UnigramGuess, float]:
    """The product's unigram guess (`bertforge pretrain`'s: the training split's most frequent maskable token) and
    its accuracy on `batches`' masked tokens (HF labels, -100 elsewhere), by the product's own functions."""
    from bertforge.data.shards import PretokenizedDataset
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.tasks.mlm_plateau import unigram_accuracy, unigram_guess

    train = PretokenizedDataset(data_dir, "train")
    guess = unigram_guess(train, load_tokenizer(train.tokenizer_path))
    masked = [{"masked_labels": batch["labels"][batch["labels"] != -100]} for batch in batches]
    return guess, unigram_accuracy(masked, guess)


def guess_record(guess: UnigramGuess) -> dict[str, Any]:
    """What a report keeps of the guess, so that a reader knows which baseline its plateau figures used."""
    return {"definition": "the training data's most frequent maskable token (bertforge.tasks.mlm_plateau)",
            **guess.as_json()}
