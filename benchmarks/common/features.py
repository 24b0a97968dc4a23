"""The state of an encoder's features on a set of texts: whether its layers still tell inputs apart.

A masked-language model on the unigram plateau predicts the corpus' token frequencies whatever the context; these
measures show whether it got there by ignoring its input (every token of every text mapped to nearly one vector)
or with features a classifier can still use. Per layer (the embeddings' output is layer 0), over the texts'
non-padding tokens:

- `norm`: the mean L2 norm of a token's hidden state;
- `common_share`: the share of the states' mean square that their common mean vector holds, |mean|^2 / mean |h|^2:
  1.0 when every token has the same state, near 0 when they spread around the origin;
- `effective_rank`: exp of the entropy of the normalised singular values of the centred token states (Roy and
  Vetterli 2007): how many directions they really span, at most the hidden size;
- `attention_entropy`: the mean entropy (nats) of a query's attention over the text's tokens, over heads, queries
  and texts, beside `uniform_entropy`, the mean of log(tokens), what attending to every token alike gives (the
  attention of layer i acts on layer i-1's states; none for layer 0);

and for the texts' [CLS] states and their mean-pooled states at the last layer (what a fresh pooler or a mean-pooling
head starts from): `mean_cosine` (the mean cosine similarity over pairs of texts; near 1.0 = all texts look alike)
and `effective_rank`.
"""

from __future__ import annotations

from typing import Any

import torch

from bertforge.models.heads import pool_padded


def effective_rank(states: torch.Tensor) -> float:
    """exp(entropy of the normalised singular values) of `states` [rows, dims], centred on their mean."""
    centred = states - states.mean(dim=0, keepdim=True)
    singular = torch.linalg.svdvals(centred.double())
    total = singular.sum()
    if total <= 0:
        return 0.0
    weights = singular / total
    weights = weights[weights > 0]
    return float(torch.exp(-(weights * weights.log()).sum()))


def common_share(states: torch.Tensor) -> float:
    """|mean state|^2 / mean |state|^2 over the rows of `states` [rows, dims]."""
    energy = float(states.double().pow(2).sum(dim=1).mean())
    return float(states.double().mean(dim=0).pow(2).sum()) / energy if energy > 0 else 0.0


def mean_cosine(vectors: torch.Tensor) -> float:
    """The mean cosine similarity over distinct pairs of rows of `vectors` [rows, dims]."""
    rows = vectors.shape[0]
    if rows < 2:
        return 1.0
    unit = torch.nn.functional.normalize(vectors.double(), dim=1)
    similarity = unit @ unit.T
    return float((similarity.sum() - similarity.diagonal().sum()) / (rows * (rows - 1)))


def attention_entropy(attention: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean entropy (nats) of the real queries' attention [batch, heads, queries, keys] under a padding `mask`
    [batch, keys] (padded keys get no attention), over heads and queries."""
    entropy = -(attention.double() * attention.double().clamp_min(1e-30).log()).sum(dim=-1)  # [batch, heads, queries]
    return float(entropy.mean(dim=1)[mask.bool()].mean())


def uniform_entropy(mask: torch.Tensor) -> float:
    """The mean over real queries of log(the text's tokens): the entropy of attending to every token alike."""
    return float(mask.sum(dim=1, keepdim=True).double().log().expand_as(mask)[mask.bool()].mean())


def feature_report(model_dir: str, texts: list[str], tokenizer_dir: str | None = None, max_length: int = 64,
                   batch_size: int = 64) -> dict[str, Any]:
    """The measures of the module's docstring for the encoder in the HF directory `model_dir` (a `BertModel` or
    `BertForMaskedLM`, whose encoder is read) on `texts`, tokenised by `tokenizer_dir` (the model's own by default)
    up to `max_length` tokens."""
    from transformers import AutoTokenizer, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager", add_pooling_layer=False).eval()
    layers: list[list[torch.Tensor]] = []
    entropies: list[list[tuple[float, int]]] = []
    uniform: list[tuple[float, int]] = []
    cls, pooled = [], []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            encoded = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length,
                                padding=True, return_tensors="pt")
            output = model(**encoded, output_hidden_states=True, output_attentions=True)
            mask = encoded["attention_mask"]
            real = mask.bool()
            queries = int(real.sum())
            if not layers:
                layers = [[] for _ in output.hidden_states]
                entropies = [[] for _ in output.attentions]
            for index, states in enumerate(output.hidden_states):
                layers[index].append(states[real])
            for index, attention in enumerate(output.attentions):
                entropies[index].append((attention_entropy(attention, mask), queries))
            uniform.append((uniform_entropy(mask), queries))
            last = output.hidden_states[-1]
            cls.append(last[:, 0])
            pooled.append(pool_padded(last, mask, "mean"))

    def weighted(values: list[tuple[float, int]]) -> float:
        return sum(value * count for value, count in values) / sum(count for _, count in values)

    per_layer = []
    for index, parts in enumerate(layers):
        states = torch.cat(parts)
        per_layer.append({
            "layer": index, "norm": float(states.norm(dim=1).mean()), "common_share": common_share(states),
            "effective_rank": effective_rank(states),
            "attention_entropy": weighted(entropies[index - 1]) if index else None})
    cls_states, pooled_states = torch.cat(cls), torch.cat(pooled)
    return {"texts": len(texts), "hidden_size": model.config.hidden_size, "uniform_entropy": weighted(uniform),
            "layers": per_layer,
            "cls": {"mean_cosine": mean_cosine(cls_states), "effective_rank": effective_rank(cls_states)},
            "mean_pooled": {"mean_cosine": mean_cosine(pooled_states), "effective_rank": effective_rank(pooled_states)}}
