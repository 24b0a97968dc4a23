"""How to respect sequence boundaries with SDPA on CPU: the candidates, measured on a bert-base layer.

The encoder carries a micro-batch as packed tokens; SDPA wants [rows, heads, len, head_dim]. Each
candidate below gets the same packed q/k/v and must return what attending within each sequence
gives. We time forward + backward of a whole bert-base layer (fused QKV, attention, output, MLP,
norms), and of attention alone, on two micro-batches with real length distributions — pre-training
samples of the bundled corpus (mostly near 128 tokens) and fine-tuning examples of the bundled
supersense set (short glosses) — and check each against the eager per-sequence reference.

    .venv/bin/python benchmarks/attention_cpu.py           # bert-base layer, 32 samples
    .venv/bin/python benchmarks/attention_cpu.py --quick   # small smoke run
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from model_step import corpus_samples, minilm_dir

from bertforge.models import EncoderConfig, get_preset
from bertforge.models.attention import PackedAttention, eager_attention
from bertforge.models.encoder import EncoderLayer

Tensor = torch.Tensor


class PadToLongest:
    """Every sequence padded to the longest of the batch; a key-padding mask."""

    def __init__(self, cu_seqlens: Tensor, max_seqlen: int):
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        self.batch, self.length = lengths.numel(), max_seqlen
        sequence = torch.repeat_interleave(torch.arange(self.batch), lengths)
        position = torch.arange(int(cu_seqlens[-1])) - torch.repeat_interleave(cu_seqlens[:-1].long(), lengths)
        self.slots = sequence * max_seqlen + position
        self.mask = (torch.arange(max_seqlen)[None, :] < lengths[:, None])[:, None, None, :]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> Tensor:
        heads, dim = q.shape[1:]

        def rows(x: Tensor) -> Tensor:
            padded = x.new_zeros(self.batch * self.length, heads, dim).index_copy(0, self.slots, x)
            return padded.view(self.batch, self.length, heads, dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(rows(q), rows(k), rows(v), attn_mask=self.mask)
        return out.transpose(1, 2).reshape(-1, heads, dim).index_select(0, self.slots)


class LengthBuckets:
    """Sequences sorted by length and split into buckets, each padded to its own longest."""

    def __init__(self, cu_seqlens: Tensor, max_seqlen: int, buckets: int = 4):
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        order = sorted(range(len(lengths)), key=lambda s: -lengths[s])
        size = -(-len(order) // buckets)
        self.parts = []
        for start in range(0, len(order), size):
            members = order[start:start + size]
            longest = lengths[members[0]]
            tokens = torch.cat([torch.arange(int(cu_seqlens[s]), int(cu_seqlens[s + 1])) for s in members])
            slots = torch.cat([row * longest + torch.arange(lengths[s]) for row, s in enumerate(members)])
            member_lengths = torch.tensor([lengths[s] for s in members])
            mask = None
            if int(member_lengths.min()) != longest:
                mask = (torch.arange(longest)[None, :] < member_lengths[:, None])[:, None, None, :]
            self.parts.append((tokens, slots, len(members), longest, mask))
        self.inverse = torch.argsort(torch.cat([part[0] for part in self.parts]))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> Tensor:
        heads, dim = q.shape[1:]
        outputs = []
        for tokens, slots, count, longest, mask in self.parts:
            def rows(x: Tensor, tokens: Tensor = tokens, slots: Tensor = slots, count: int = count,
                     longest: int = longest) -> Tensor:
                padded = x.new_zeros(count * longest, heads, dim).index_copy(0, slots, x.index_select(0, tokens))
                return padded.view(count, longest, heads, dim).transpose(1, 2)

            out = F.scaled_dot_product_attention(rows(q), rows(k), rows(v), attn_mask=mask)
            outputs.append(out.transpose(1, 2).reshape(-1, heads, dim).index_select(0, slots))
        return torch.cat(outputs).index_select(0, self.inverse)


class NestedJagged:
    """torch.nested jagged tensors straight from the packed layout (no padding at all)."""

    def __init__(self, cu_seqlens: Tensor, max_seqlen: int):
        self.offsets, self.max_seqlen = cu_seqlens.long(), max_seqlen

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> Tensor:
        def nested(x: Tensor) -> Tensor:
            values = x.contiguous()  # jagged SDPA finds no kernel for strided views
            return torch.nested.nested_tensor_from_jagged(values, self.offsets, max_seqlen=self.max_seqlen).transpose(1, 2)

        return F.scaled_dot_product_attention(nested(q), nested(k), nested(v)).transpose(1, 2).values()


class FlexDocumentMask:
    """FlexAttention over the whole packed micro-batch with a document block mask."""

    def __init__(self, cu_seqlens: Tensor, max_seqlen: int):
        from torch.nn.attention.flex_attention import create_block_mask

        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        sequence = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        total = int(cu_seqlens[-1])

        def same_sequence(b: Tensor, h: Tensor, q_index: Tensor, kv_index: Tensor) -> Tensor:
            return sequence[q_index] == sequence[kv_index]

        self.block_mask = create_block_mask(same_sequence, None, None, total, total, device="cpu")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        out = flex_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), block_mask=self.block_mask)
        return out[0].transpose(0, 1)


class EagerReference:
    def __init__(self, cu_seqlens: Tensor, max_seqlen: int):
        self.cu_seqlens = cu_seqlens

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **_: object) -> Tensor:
        return eager_attention(q, k, v, self.cu_seqlens)


CANDIDATES: dict[str, Callable[[Tensor, int], object]] = {
    "rows + block-diagonal mask (bertforge `sdpa`)": lambda cu, n: PackedAttention(cu, n, "sdpa"),
    "pad to longest + key mask": PadToLongest,
    "4 length buckets + key masks": LengthBuckets,
    "nested jagged tensors": NestedJagged,
    "FlexAttention document mask": FlexDocumentMask,
    "eager per-sequence loop (reference)": EagerReference,
}


def interleaved_medians(functions: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, timed round-robin so background load hits all of them alike."""
    for function in functions.values():
        function()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def supersense_lengths(count: int) -> list[int]:
    """Token counts ([CLS] and [SEP] included) of the first supersense train glosses: fine-tuning's shape."""
    from tokenizers import Tokenizer

    from bertforge.data.bundled import supersense_path

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    with gzip.open(supersense_path("train"), "rt", encoding="utf-8") as rows:
        texts = [json.loads(line)["text"] for _, line in zip(range(count), rows, strict=False)]
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]


def measure(title: str, lengths: list[int], config: EncoderConfig, repeats: int, threads: int) -> None:
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total, max_seqlen = sum(lengths), max(lengths)
    torch.manual_seed(0)
    layer = EncoderLayer(config, 0)
    hidden = torch.randn(total, config.hidden_size, requires_grad=True)
    heads, dim = config.num_heads, config.head_dim
    qkv = [torch.randn(total, heads, dim, requires_grad=True) for _ in range(3)]
    frozen = [x.detach() for x in qkv]  # FlexAttention refuses inputs that require grad on CPU
    upstream = torch.randn(total, heads, dim)

    reference_layer = layer(hidden, EagerReference(cu_seqlens, max_seqlen), None).detach()
    print(f"### {title}: {len(lengths)} sequences, {total:,} tokens, lengths {min(lengths)}-{max_seqlen} "
          f"(mean {total / len(lengths):.0f}); {config.hidden_size}-wide layer, fp32, {threads} threads\n")
    print("| strategy | layer fwd+bwd (ms) | attention fwd+bwd (ms) | attention fwd (ms) | max abs error |")
    print("|---|---:|---:|---:|---:|")
    functions: dict[str, Callable[[], None]] = {}
    errors: dict[str, float] = {}
    no_backward: dict[str, str] = {}
    for name, build in CANDIDATES.items():
        attention = build(cu_seqlens, max_seqlen)
        with torch.no_grad():
            errors[name] = (layer(hidden, attention, None) - reference_layer).abs().max().item()  # type: ignore[arg-type]

        def layer_step(attention: object = attention) -> None:
            layer(hidden, attention, None).sum().backward()  # type: ignore[arg-type]

        def attention_step(attention: object = attention) -> None:
            torch.autograd.backward(attention.attend(*qkv), upstream)  # type: ignore[attr-defined]

        def attention_forward(attention: object = attention) -> None:
            with torch.no_grad():
                attention.attend(*frozen)  # type: ignore[attr-defined]

        functions[f"{name}/forward"] = attention_forward
        try:
            attention_step()
        except (NotImplementedError, RuntimeError) as failure:
            no_backward[name] = str(failure).split(".")[0]
            continue
        functions[f"{name}/attention"] = attention_step
        functions[f"{name}/layer"] = layer_step
    medians = interleaved_medians(functions, repeats)
    for name in CANDIDATES:
        forward = medians[f"{name}/forward"] * 1e3
        if name in no_backward:
            print(f"| {name} | no backward: {no_backward[name]} | — | {forward:,.1f} | {errors[name]:.1e} |")
        else:
            print(f"| {name} | {medians[f'{name}/layer'] * 1e3:,.0f} | {medians[f'{name}/attention'] * 1e3:,.1f} "
                  f"| {forward:,.1f} | {errors[name]:.1e} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=32, help="sequences per micro-batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    config = get_preset("bert-base")
    max_documents = None
    if args.quick:
        config = get_preset("bert-mini")
        args.samples, args.repeats, max_documents = 8, 2, 100
    config.hidden_dropout = config.attention_dropout = 0.0

    samples = corpus_samples(128, max_documents)
    generator = torch.Generator().manual_seed(0)
    picked = torch.randperm(len(samples), generator=generator)[:args.samples].tolist()
    print("## Attention on CPU\n")
    measure("Pre-training samples (bundled corpus, packed to 128)", [len(samples[i]) for i in picked], config,
            args.repeats, args.threads)
    measure("Fine-tuning examples (supersense glosses)", supersense_lengths(args.samples), config, args.repeats,
            args.threads)

if __name__ == "__main__":
    main()
