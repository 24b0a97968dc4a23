"""The sentence embedding model: the encoder, then one vector per sequence (mean, [CLS] or last token).

No weights besides the encoder's: a sentence-transformers model is a transformer plus a pooling
rule (and optionally unit length), and that is what this class is, so it exports to that format
exactly (`models.sentence_transformers_format`). With cls or last pooling the encoder's last
layer computes only the pooled rows (`BertforgeModel.encode` with rows). The losses live in
`tasks/contrastive.py`: they need the embeddings of the whole global batch, which one forward of one
micro-batch does not see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import ConfigError
from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel, pack_inputs
from bertforge.models.heads import pool, pooled_rows
from bertforge.models.serialization import SavableModel

EMBEDDING_POOLINGS = ("mean", "cls", "last")


class BertforgeForEmbedding(SavableModel, nn.Module):
    def __init__(self, config: EncoderConfig, normalize: bool = False, pooler: bool = False):
        """`pooler`: keep the BERT pooler a source checkpoint carries (all-MiniLM-L6-v2's), unused by the vectors,
        so an export gives back every weight it was given; a model trained here has none."""
        super().__init__()
        if config.pooling not in EMBEDDING_POOLINGS:
            raise ConfigError(f"sentence embeddings pool by {', '.join(EMBEDDING_POOLINGS)}, not "
                              f"pooling={config.pooling} (BERT's pooler belongs to classifiers); set model.pooling")
        self.config = config
        self.normalize = normalize
        self.encoder = BertforgeModel(config, pooler=pooler)

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, num_samples: int | None = None) -> torch.Tensor:
        """[sequences, hidden] embeddings, unit length when `normalize` (`num_samples` is unused)."""
        packed = pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids, attention_mask)
        hidden = self.encoder.encode(packed, pooled_rows(packed.cu_seqlens, self.config.pooling))
        embeddings = pool(hidden, packed.cu_seqlens, self.config.pooling)
        return F.normalize(embeddings, dim=-1) if self.normalize else embeddings

    head_kind = "embedding"
    output_name = "last_hidden_state"  # ONNX holds the transformer; the vectors are pooled from its states

    @classmethod
    def for_head(cls, config: EncoderConfig, *, normalize: bool = False, **_: object) -> BertforgeForEmbedding:
        return cls(config, normalize)

    @classmethod
    def source_overrides(cls, source: Any, path: Path, overrides: dict[str, object]) -> dict[str, object]:
        return overrides if "pooling" in overrides else overrides | {"pooling": embedding_pooling(source, path)}

    def pooler_module(self) -> nn.Module | None:
        return self.encoder.pooler  # kept from the source for export only; the vectors do not use it

    def head_arguments(self) -> dict[str, object]:
        return {"normalize": self.normalize, "pooler": self.encoder.pooler is not None}


def embedding_pooling(source: Any, path: Path) -> str:
    """How a model's token states become one vector when nothing says otherwise: an embedding model's own
    pooling, a sentence-transformers directory's (its 1_Pooling/config.json), else the token mean."""
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    if isinstance(source, BertforgeForEmbedding):
        return source.config.pooling
    settings = read_sentence_transformers(path)
    if settings is None:
        return "mean"
    problem = settings.unsupported()
    if problem is not None:
        raise ConfigError(f"{path} is a sentence-transformers model bertforge cannot reproduce: {problem}; set "
                          "model.pooling (mean, cls or last) to start from its transformer alone")
    assert settings.pooling is not None
    return settings.pooling
