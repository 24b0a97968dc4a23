"""What runs the model under the inference engine: `--backend torch | onnx | onnx-int8`.

A backend is the engine's `Backend` (a batch in, what the model's forward returns, through `output`):

- `torch`: eager PyTorch on our unpadded model (`engine.torch_backend`), the default;
- `onnx`: ONNX Runtime (CPU, as many intra-op threads as torch uses) on the model's ONNX export
  (`export.export_onnx`: the stock `transformers` model, padded inputs). The engine's batches are
  unpadded and sorted by length, so padding each one to its longest text costs little; the graph's
  output is unpadded again and finished by the task kind's `from_onnx`, so every kind's results
  are the ones its torch backend gives (within float error);
- `onnx-int8`: the same graph with its linear layers' weights quantized to int8 (ONNX Runtime's
  dynamic quantization: activations quantized per batch at run time). Faster, less exact: never the
  default. PyTorch's own dynamic quantization (`torch.ao.quantization.quantize_dynamic` of every nn.Linear)
  measured as fast here (1.14x torch against 1.15x, all-MiniLM-L6-v2 on glosses, a shared 2-core machine)
  but far less exact (retrieval nDCG@10 -2.9 points against -0.65; vectors' smallest cosine to fp32 0.75
  against 0.97: docs/benchmarks.md, benchmarks/backends.py), so int8 runs in ONNX Runtime.

The graphs are cached under `$BERTFORGE_CACHE/onnx/<digest>/` (default ~/.cache/bertforge), the digest
taken over the model's class, config and weights: a second run of the same model reuses its export
(tens of seconds saved), a changed model gets a new one, and nothing is written beside the user's
model (a run directory may be read-only, remote, or shared with other runs). Delete the folder to
reclaim the space.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertforge.engine import BACKENDS, Backend, Batch, torch_backend
from bertforge.errors import BertforgeError

if TYPE_CHECKING:
    from torch import nn

    from bertforge.tasks.kinds.kind import TaskKind

INT8_FILE = "model.int8.onnx"


def backend_for(name: str, model: nn.Module, tokenizer_dir: Path | None, max_length: int,
                output: Callable[[Any], Any] = lambda out: out, extra: tuple[str, ...] = ()) -> Backend:
    """The backend `name` for `model` (a bertforge model in eval mode); `output` picks what the caller keeps
    of the model's forward (e.g. the logits) and `extra` names the head's batch fields (torch only: the
    ONNX graph reads token ids and the mask, and the kind's `from_onnx` reads the rest from the batch)."""
    if name == "torch":
        return torch_backend(model, output, extra)
    if name == "onnx":
        return onnx_backend(model, tokenizer_dir, max_length, output)
    if name == "onnx-int8":
        return onnx_int8_backend(model, tokenizer_dir, max_length, output)
    raise BertforgeError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}")


def onnx_backend(model: nn.Module, tokenizer_dir: Path | None, max_length: int,
                 output: Callable[[Any], Any] = lambda out: out) -> Backend:
    """ONNX Runtime on the model's (cached) fp32 export."""
    kind = _onnx_kind(model, "onnx")
    return _session_backend(model, kind, _exported(model, kind, tokenizer_dir, max_length) / "model.onnx", output)


def onnx_int8_backend(model: nn.Module, tokenizer_dir: Path | None, max_length: int,
                      output: Callable[[Any], Any] = lambda out: out) -> Backend:
    """ONNX Runtime on the export with int8 linear-layer weights (quantized once, cached beside it)."""
    kind = _onnx_kind(model, "onnx-int8")
    directory = _exported(model, kind, tokenizer_dir, max_length)
    quantized = directory / INT8_FILE
    if not quantized.is_file():
        _quantize(directory / "model.onnx", quantized)
    return _session_backend(model, kind, quantized, output)


# ---------------------------------------------------------------------------------------------


def _require_onnxruntime(flag: str) -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as error:
        raise BertforgeError(f"--backend {flag} needs {error.name or 'onnxruntime'} (ONNX Runtime and the ONNX "
                             "exporter); install the extra: pip install 'bertforge[onnx]'") from None


def _onnx_kind(model: nn.Module, flag: str) -> TaskKind:
    """The task kind of `model`, if its graph can run in ONNX Runtime; else a one-line error."""
    from bertforge.tasks.kinds import KINDS

    kind = next((kind for kind in KINDS if type(model) is kind.model_class), None)
    if kind is None or kind.from_onnx is None:
        what = f"a {kind.name} model" if kind is not None else f"a {type(model).__name__}"
        raise BertforgeError(f"--backend {flag} cannot run {what} (no ONNX graph for it); use --backend torch")
    _require_onnxruntime(flag)
    return kind


# model -> (what its weights were when digested, the digest). A server builds a backend for every merged
# batch of /predict or /tag, and hashing all-MiniLM-L6-v2's 90 MB of weights took 0.27 s each time (2 threads,
# a shared 2-core VM); a tensor's version counter moves on every in-place change, so a changed weight is still seen.
_DIGESTS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[object, ...], str]] = weakref.WeakKeyDictionary()


def model_digest(model: nn.Module) -> str:
    """A digest of what the exported graph depends on: the model's class, config and every weight."""
    tensors = model.state_dict(keep_vars=True)
    config = repr(getattr(model, "config", None))
    versions = (config, *((id(tensor), tensor._version) for tensor in tensors.values()))
    cached = _DIGESTS.get(model)
    if cached is not None and cached[0] == versions:
        return cached[1]
    digest = hashlib.blake2b(digest_size=16)
    digest.update(type(model).__qualname__.encode())
    digest.update(config.encode())
    for name, tensor in tensors.items():
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    _DIGESTS[model] = (versions, digest.hexdigest())
    return digest.hexdigest()


def onnx_cache_dir(model: nn.Module) -> Path:
    from bertforge.storage import cache_root

    return cache_root() / "onnx" / model_digest(model)


def _exported(model: nn.Module, kind: TaskKind, tokenizer_dir: Path | None, max_length: int) -> Path:
    """The directory of the model's ONNX export, exported (and checked against PyTorch) the first time."""
    from bertforge.console import log
    from bertforge.export import export_onnx
    from bertforge.inference import LoadedModel
    from bertforge.locate import ModelLocation

    directory = onnx_cache_dir(model)
    if (directory / "model.onnx").is_file():
        return directory
    traced, _ = kind.for_onnx(model)
    log.info(f"exporting the model to ONNX once, into {directory} (reused while the model is unchanged)")
    location = ModelLocation(path=directory, format="bertforge", run_dir=None)
    export_onnx(LoadedModel(traced, location, tokenizer_dir, max_length), directory)
    return directory


def _quantize(source: Path, target: Path) -> None:
    """int8 weights for the MatMuls with a constant weight (the linear layers), one scale per output channel,
    activations quantized per batch at run time. Per channel because one scale per tensor cost all-MiniLM-L6-v2's
    vectors a mean cosine of 0.966 to the fp32 ones on glosses, per channel 0.994 (300 glosses). Written
    under a temporary name and renamed, so a killed run leaves no half-written graph in the cache."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # it advises shape pre-processing on every call, which dynamic quantization skips
    try:
        quantize_dynamic(source, staging, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         per_channel=True)
        os.replace(staging, target)
    finally:
        root.setLevel(level)
        staging.unlink(missing_ok=True)


@functools.lru_cache(maxsize=8)
def _session(graph: str, written_ns: int, threads: int) -> Any:
    """One ONNX Runtime session per graph file (as written) and thread count: building one took 0.33 s for
    all-MiniLM-L6-v2's graph (same machine), which a server building a backend per merged batch paid every batch.
    `written_ns` keys a graph rewritten in place (a re-export) to a new session."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads  # as many as the torch backend would use
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: its warnings about unused initializers are not the user's
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


def _session_backend(model: nn.Module, kind: TaskKind, graph: Path, output: Callable[[Any], Any]) -> Backend:
    session = _session(str(graph), graph.stat().st_mtime_ns, torch.get_num_threads())
    names = [node.name for node in session.get_inputs()]
    from_onnx = kind.from_onnx
    assert from_onnx is not None  # checked by _onnx_kind

    def forward(batch: Batch) -> Any:
        lengths = np.diff(np.asarray(batch["cu_seqlens"], dtype=np.int64))
        padded, mask = padded_inputs(batch, lengths)
        result = session.run(None, {name: padded[name] for name in names})[0]
        graph_output = torch.from_numpy(result)
        if graph_output.ndim == 3:  # one row per token: back to the engine's unpadded tokens
            graph_output = graph_output[torch.from_numpy(mask)]
        return output(from_onnx(model, graph_output, batch))

    return forward


def padded_inputs(batch: Batch, lengths: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The unpadded batch's token ids and segments laid out one sequence per row, Hugging Face style
    (`input_ids`, `attention_mask`, `token_type_ids`, [rows, longest] int64), and the [rows, longest]
    bool mask of the real tokens."""
    from bertforge.batch import padded_grid

    rows, columns = padded_grid(lengths)
    shape = (len(lengths), int(lengths.max()) if len(lengths) else 0)
    padded = {}
    for key in ("input_ids", "token_type_ids"):
        grid = np.zeros(shape, dtype=np.int64)
        grid[rows, columns] = np.asarray(batch[key], dtype=np.int64)
        padded[key] = grid
    mask = np.zeros(shape, dtype=bool)
    mask[rows, columns] = True
    padded["attention_mask"] = mask.astype(np.int64)
    return padded, mask
