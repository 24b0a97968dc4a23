"""Is bertforge's dropout HF's in distribution? The same weights on both sides, many train-mode draws.

Both sides hold one model: HF's `AutoModelForSequenceClassification` with a seeded head, saved, and
that directory imported by bertforge (`load_for_task`, as `finetune model.init_from=` does). On one
batch of real training rows, each side runs `--draws` forward+backward passes in train mode, each
from its own seed, and keeps per draw: the logits, the loss, the first token's hidden state after
every layer, and the gradient norm. Dropout is the only randomness, so if the two implementations
drop out alike (same sites, rates, scaling, mask distribution) every statistic agrees within
sampling error: the mean of each element, and the spread over draws (variance ratio bertforge/HF).

Arms: `bertforge` (as shipped: its 16-bit CPU mask), `bertforge-F` (every bertforge dropout replaced
by `F.dropout`: separates the mask generator from the sites), `HF`. Written for issue 36 (MPNet
fine-tunes about one point below HF `Trainer` with dropout on, equal with it off).

    python benchmarks/dropout_distribution.py --model-dir "$(python -m benchmarks.common.packaged_models)" \
        --rows 32 --draws 100 --grad-draws 30 \
        --json benchmarks/results/dropout_distribution_mpnet_32rows_100draws.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if not __package__:  # run as `python benchmarks/dropout_distribution.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.reports import write_atomically  # noqa: E402
from benchmarks.common.tasks import load_task  # noqa: E402

ARMS = ("bertforge", "bertforge-F", "HF")
MAX_LENGTH = 128


@contextlib.contextmanager
def torch_dropout_in_bertforge() -> Iterator[None]:
    """bertforge's dropout function pointed at `F.dropout` where it is looked up (modules and attention)."""
    import bertforge.models.attention as attention
    import bertforge.models.dropout as ours

    saved = ours.dropout, attention.dropout
    ours.dropout = attention.dropout = F.dropout  # type: ignore[assignment]
    try:
        yield
    finally:
        ours.dropout, attention.dropout = saved


def hf_batch(rows: list[dict], model_dir: Path, labels: list[str]) -> dict[str, torch.Tensor]:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    encoded = tokenizer([r["text"] for r in rows], truncation=True, max_length=MAX_LENGTH, padding=True,
                        return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
            "labels": torch.tensor([labels.index(str(r["label"])) for r in rows])}


def bertforge_batch(rows: list[dict], model_dir: Path, labels: list[str]) -> dict:
    from bertforge.data.labeled import LabeledDataset, collate_unpadded
    from bertforge.data.labels import LabeledSplit

    split = LabeledSplit("train", "classification", [r["text"] for r in rows], None,
                         [labels.index(str(r["label"])) for r in rows], labels)
    dataset = LabeledDataset(split, model_dir, MAX_LENGTH)
    return collate_unpadded([dataset[i] for i in range(len(rows))])


class Recorder:
    """Per draw: logits [rows, labels], loss, first-token state per layer [layers, rows, hidden], grad norm."""

    def __init__(self) -> None:
        self.logits: list[np.ndarray] = []
        self.loss: list[float] = []
        self.first_tokens: list[np.ndarray] = []
        self.grad_norm: list[float] = []
        self.layer_states: list[torch.Tensor] = []

    def arrays(self) -> dict[str, np.ndarray]:
        return {"logits": np.stack(self.logits), "loss": np.array(self.loss),
                "first_tokens": np.stack(self.first_tokens), "grad_norm": np.array(self.grad_norm)}


def run_hf(model_dir: Path, batch: dict, draws: int, grad_draws: int, first_seed: int,
           eval_mode: bool = False) -> Recorder:
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    record = Recorder()
    for layer in model.mpnet.encoder.layer:
        layer.register_forward_hook(lambda _m, _i, out: record.layer_states.append(out[0][:, 0].detach()))
    model.eval() if eval_mode else model.train()
    for draw in range(draws):
        torch.manual_seed(first_seed + draw)
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(draw < grad_draws):
            output = model(**batch)
            if draw < grad_draws:
                output.loss.backward()
        finish_draw(record, model, output.logits, output.loss)
    return record


def run_bertforge(model_dir: Path, batch: dict, labels: list[str], draws: int, grad_draws: int, first_seed: int,
                  eval_mode: bool = False) -> Recorder:
    from bertforge.batch import model_inputs
    from bertforge.models.loading import load_for_task

    model = load_for_task(model_dir, "classification", num_labels=len(labels), label_names=labels)
    record = Recorder()
    starts = batch["cu_seqlens"][:-1].long()
    def first_tokens(_module: torch.nn.Module, _inputs: object, out: torch.Tensor) -> None:
        # the last layer computes the head's rows only (the first tokens), the others every token
        record.layer_states.append((out if out.shape[0] == len(starts) else out[starts]).detach())

    for layer in model.encoder.layers:
        layer.register_forward_hook(first_tokens)
    model.eval() if eval_mode else model.train()
    for draw in range(draws):
        torch.manual_seed(first_seed + draw)
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(draw < grad_draws):
            output = model(**model_inputs(batch), labels=batch["labels"])
            loss = output.loss_sum / batch["num_samples"]
            if draw < grad_draws:
                loss.backward()
        finish_draw(record, model, output.logits, loss)
    return record


def finish_draw(record: Recorder, model: torch.nn.Module, logits: torch.Tensor, loss: torch.Tensor) -> None:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    if norms:  # the first `--grad-draws` draws run backward too
        record.grad_norm.append(float(torch.stack(norms).norm()))
    record.logits.append(logits.detach().float().numpy())
    record.loss.append(float(loss.detach()))
    record.first_tokens.append(torch.stack(record.layer_states).float().numpy())
    record.layer_states.clear()


def compare(ours: np.ndarray, theirs: np.ndarray, resamples: int = 200) -> dict[str, float]:
    """Summed variance over draws, ours/theirs (bootstrap 95% interval over draws), and the mean squared
    z of the per-element mean difference (about 1 when the means agree)."""
    def variance_ratio(a: np.ndarray, b: np.ndarray) -> float:
        return float(a.var(axis=0, ddof=1).sum() / b.var(axis=0, ddof=1).sum())

    rng = np.random.default_rng(0)
    boot = [variance_ratio(ours[rng.integers(0, len(ours), len(ours))],
                           theirs[rng.integers(0, len(theirs), len(theirs))]) for _ in range(resamples)]
    standard_error2 = ours.var(axis=0, ddof=1) / len(ours) + theirs.var(axis=0, ddof=1) / len(theirs)
    z2 = (ours.mean(axis=0) - theirs.mean(axis=0)) ** 2 / np.maximum(standard_error2, 1e-30)
    return {"variance_ratio": variance_ratio(ours, theirs), "ci_low": float(np.percentile(boot, 2.5)),
            "ci_high": float(np.percentile(boot, 97.5)), "mean_z2": float(z2.mean()),
            "mean_ours": float(ours.mean()), "mean_theirs": float(theirs.mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--grad-draws", type=int, default=30, help="of the draws, how many also run backward "
                        "(the gradient norm; forward-only draws cost about a third)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--head-seed", type=int, default=17)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.model_dir / "config.json").is_file():
        print(f"error: --model-dir {args.model_dir} has no config.json; pass a Hugging Face model directory",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    import transformers

    task = load_task("supersense", args.rows, 0)
    labels = task.labels
    with tempfile.TemporaryDirectory(prefix="dropout-distribution-") as work:
        init = Path(work) / "init"
        transformers.set_seed(args.head_seed)  # one head draw, saved: both sides start from these weights
        model = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(args.model_dir), num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={name: i for i, name in enumerate(labels)})
        model.save_pretrained(str(init))
        transformers.AutoTokenizer.from_pretrained(str(args.model_dir)).save_pretrained(str(init))
        del model
        hf_inputs, our_inputs = hf_batch(task.train, init, labels), bertforge_batch(task.train, init, labels)
        hf_eval = run_hf(init, hf_inputs, 1, 1, 0, eval_mode=True).arrays()
        our_eval = run_bertforge(init, our_inputs, labels, 1, 1, 0, eval_mode=True).arrays()
        report: dict = {"rows": args.rows, "draws": args.draws, "tokens": int(our_inputs["cu_seqlens"][-1]),
                        "padded_tokens": int(hf_inputs["input_ids"].numel()),
                        "eval_mode_max_logit_difference": float(np.abs(hf_eval["logits"] - our_eval["logits"]).max()),
                        "eval_mode_grad_norms": [float(hf_eval["grad_norm"][0]), float(our_eval["grad_norm"][0])],
                        "arms": {}}
        print(json.dumps({k: v for k, v in report.items() if k != "arms"}), flush=True)
        results: dict[str, dict[str, np.ndarray]] = {}
        for arm in args.arms.split(","):
            seed = 10_000 * (ARMS.index(arm) + 1)  # draws independent across arms
            if arm == "HF":
                results[arm] = run_hf(init, hf_inputs, args.draws, args.grad_draws, seed).arrays()
            elif arm == "bertforge-F":
                with torch_dropout_in_bertforge():
                    results[arm] = run_bertforge(init, our_inputs, labels, args.draws, args.grad_draws, seed).arrays()
            else:
                results[arm] = run_bertforge(init, our_inputs, labels, args.draws, args.grad_draws, seed).arrays()
            print(f"{arm}: done", flush=True)
        if "HF" in results:
            for arm in (a for a in results if a != "HF"):
                rows = {name: compare(results[arm][name].reshape(len(results[arm][name]), -1),
                                      results["HF"][name].reshape(len(results["HF"][name]), -1))
                        for name in ("logits", "loss", "grad_norm")}
                layers = results[arm]["first_tokens"].shape[1]
                for layer in range(layers):
                    rows[f"first_token_layer{layer + 1}"] = compare(
                        results[arm]["first_tokens"][:, layer].reshape(args.draws, -1),
                        results["HF"]["first_tokens"][:, layer].reshape(args.draws, -1))
                report["arms"][f"{arm} vs HF"] = rows
                print(f"\n{arm} vs HF ({args.draws} draws each, {args.grad_draws} with backward)")
                print(f"{'statistic':<22} {'var ratio':>9} {'95% CI':>17} {'mean z^2':>9} {'mean ours':>10} {'mean HF':>10}")
                for name, row in rows.items():
                    print(f"{name:<22} {row['variance_ratio']:9.3f} [{row['ci_low']:6.3f}, {row['ci_high']:6.3f}] "
                          f"{row['mean_z2']:9.2f} {row['mean_ours']:10.4f} {row['mean_theirs']:10.4f}")
    if args.json:
        write_atomically(args.json, json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
