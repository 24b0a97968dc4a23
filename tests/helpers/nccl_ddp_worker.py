"""A torchrun worker (one process, one GPU): the tiny pre-training encoder under DDP over NCCL, bf16
autocast, 3 AdamW steps, against the same steps without DDP. One rank has nothing to average with, so
the losses must agree; what this checks is that NCCL starts, DDP's gradient all-reduce runs on
the encoder's parameters (an unused one would make DDP raise).
Prints one JSON line.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from bertforge.models import BertforgeForPreTraining, EncoderConfig
from bertforge.train.distributed import shutdown_distributed
from bertforge.train.precision import Precision


def losses(use_ddp: bool, device: torch.device) -> list[float]:
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                           hidden_dropout=0.0, attention_dropout=0.0)
    model = BertforgeForPreTraining(config).to(device)
    wrapped = DistributedDataParallel(model, device_ids=[device.index]) if use_ddp else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    lengths = torch.tensor([30, 64, 7, 21])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).int()]).to(device)
    result = []
    for _ in range(3):
        input_ids = torch.randint(0, 128, (int(lengths.sum()),), generator=generator).to(device)
        masked = torch.randperm(int(lengths.sum()), generator=generator)[:18].sort().values.to(device)
        with Precision("bf16").autocast(device):
            output = wrapped(input_ids=input_ids, cu_seqlens=cu_seqlens, max_seqlen=64, masked_positions=masked,
                             masked_labels=input_ids[masked])
        loss = output.mlm_loss_sum / masked.numel()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        result.append(float(loss))
    return result


def main() -> None:
    dist.init_process_group("nccl")  # bertforge starts no group for one process; this worker wants NCCL anyway
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    total = torch.tensor([1.0], device=device)
    dist.all_reduce(total)
    with_ddp, without = losses(True, device), losses(False, device)
    print(json.dumps({"backend": dist.get_backend(), "world_size": dist.get_world_size(), "all_reduce": total.item(),
                      "ddp": with_ddp, "plain": without}), flush=True)
    shutdown_distributed()


if __name__ == "__main__":
    main()
