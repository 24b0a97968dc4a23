"""Heads on top of the packed hidden states: MLM, next-sentence prediction, sequence classification.

The MLM head is called with the hidden states of the masked positions only. Its vocabulary
projection is [hidden x vocab] per token — on bert-base about a fifth of a training step when run
on every token — so projecting only the ~15% masked rows skips ~85% of that work (Mosaic BERT and
ModernBERT do the same).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.models.config import EncoderConfig
from bertforge.models.dropout import Dropout
from bertforge.models.embeddings import layer_norm
from bertforge.models.mlp import ACTIVATIONS


class PredictionTransform(nn.Module):
    """dense -> activation -> norm: BERT's MLM transform, and ModernBERT's head (MLM and classifiers).

    `width`: the output's, when not hidden_size: ELECTRA's generator maps back to its narrower embeddings."""

    def __init__(self, config: EncoderConfig, width: int | None = None):
        super().__init__()
        width = width or config.hidden_size
        self.dense = nn.Linear(config.hidden_size, width, bias=config.bias)
        self.activation = ACTIVATIONS[config.activation]
        self.norm = layer_norm(config, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.activation(self.dense(hidden)))


class MaskedLMHead(nn.Module):
    def __init__(self, config: EncoderConfig, word_embeddings: nn.Embedding):
        super().__init__()
        # the decoder shares the word embeddings' width (ELECTRA's generator: narrower than the encoder)
        self.transform = PredictionTransform(config, config.embedding_width)
        self.decoder = nn.Linear(config.embedding_width, config.vocab_size)
        if config.tie_word_embeddings:
            self.decoder.weight = word_embeddings.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab]; pass only the rows you need logits for."""
        return self.decoder(self.transform(hidden))


# a dense layer and an activation on [CLS], by `pooling`: BERT's pooler (and RoBERTa's classifier.dense),
# DistilBERT's pre_classifier, ELECTRA's classifier.dense (exact GELU whatever hidden_act is, as transformers has it)
POOLER_ACTIVATIONS = {"pooler": torch.tanh, "relu_pooler": torch.relu, "gelu_pooler": nn.functional.gelu}


class Pooler(nn.Module):
    """BERT's pooler: tanh(dense(hidden of [CLS])); relu_pooler / gelu_pooler: ReLU / GELU instead of tanh."""

    def __init__(self, config: EncoderConfig, pooling: str = "pooler"):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.activation = POOLER_ACTIVATIONS[pooling]

    def forward(self, first_token_hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(first_token_hidden))


class NextSentenceHead(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.pooler = Pooler(config)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, first_token_hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooler(first_token_hidden))


def mean_per_sequence(hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[tokens, hidden] -> [sequences, hidden]: the mean over each sequence's tokens."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    sequence_of_token = torch.repeat_interleave(torch.arange(lengths.numel(), device=hidden.device), lengths,
                                                output_size=hidden.shape[0])
    sums = hidden.new_zeros(lengths.numel(), hidden.shape[1]).index_add_(0, sequence_of_token, hidden)
    return sums / lengths.clamp(min=1).unsqueeze(1).to(hidden.dtype)


def pooled_rows(cu_seqlens: torch.Tensor, pooling: str) -> torch.Tensor | None:
    """The tokens whose final states a pooling reads: each sequence's first ([CLS]; also BERT's pooler)
    or last token ([SEP]), or every token (None) for the mean."""
    if pooling == "mean":
        return None
    return (cu_seqlens[1:] - 1).long() if pooling == "last" else cu_seqlens[:-1].long()


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, pooling: str) -> torch.Tensor:
    """[sequences, hidden] from the states of `pooled_rows`: the token mean, or the rows as they are."""
    return mean_per_sequence(hidden, cu_seqlens) if pooling == "mean" else hidden


def pool_padded(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`pool` on a right-padded [rows, length, hidden] layout, `attention_mask` [rows, length] marking the real
    tokens: what an exported graph computes, since ONNX runtimes feed padded inputs (`bertforge.export`). Right
    padding, as `collate_padded` and BERT tokenizers pad, puts [CLS] in column 0 and the last real token at the
    mask's count - 1; a left-padded batch would pool the wrong rows for `cls` and `last`."""
    if pooling == "mean":
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
    if pooling == "last":
        last = attention_mask.long().sum(dim=1).clamp(min=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    return hidden[:, 0]  # [CLS]: the pooler's and `cls` pooling's row


class SequenceHead(nn.Module):
    """pooler: BERT's tanh pooler on [CLS] (as HF `BertForSequenceClassification`, and RoBERTa's
    classifier.dense); relu_pooler: dense+ReLU on [CLS] (DistilBERT's pre_classifier); gelu_pooler: dense+GELU
    on [CLS] (ELECTRA's classifier.dense);
    cls / mean / last: [CLS], the token mean or the last token, then dense-act-norm (as HF
    `ModernBertForSequenceClassification` does for cls and mean).

    Dropouts, each drawn only where its rate is not 0, in the order HF's heads draw them: `config.pooler_dropout`
    on the pooled vector (DeBERTa's ContextPooler); `input_dropout` on it too, before the dense layer (HF's
    RoBERTa/ELECTRA/MPNet `*ClassificationHead`: dropout, dense, activation, dropout, out_proj; ELECTRA's
    multiple-choice summary_first_dropout); `dropout` before the linear layer (None: the classifier's rate).
    Without the first two the head is BERT's (pooler, dropout, classifier)."""

    def __init__(self, config: EncoderConfig, num_outputs: int, *, input_dropout: float = 0.0,
                 dropout: float | None = None):
        super().__init__()
        self.pooling = config.pooling
        pooler = config.pooling in POOLER_ACTIVATIONS
        self.pooler = Pooler(config, config.pooling) if pooler else None
        self.transform = PredictionTransform(config) if not pooler else None
        # None: the head has no such dropout (its HF class: an Identity, or no module at all)
        self.pooler_dropout = Dropout(config.pooler_dropout) if config.pooler_dropout else None
        self.input_dropout = Dropout(input_dropout) if input_dropout else None
        self.dropout = Dropout(config.effective_classifier_dropout if dropout is None else dropout)
        self.classifier = nn.Linear(config.hidden_size, num_outputs)

    def input_rows(self, cu_seqlens: torch.Tensor) -> torch.Tensor | None:
        """The tokens whose final states the head reads (`pooled_rows`)."""
        return pooled_rows(cu_seqlens, self.pooling)

    def forward(self, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """Logits from the states of `input_rows`: every token's [tokens, hidden] for mean pooling, else
        one state per sequence [sequences, hidden]."""
        return self.from_pooled(pool(hidden, cu_seqlens, self.pooling))

    def from_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """Logits from the pooled [sequences, hidden] vectors (`pool`, or `pool_padded` in an exported graph)."""
        for first_dropout in (self.pooler_dropout, self.input_dropout):
            if first_dropout is not None:
                pooled = first_dropout(pooled)
        pooled = self.pooler(pooled) if self.pooler is not None else self.transform(pooled)
        return self.classifier(self.dropout(pooled))
