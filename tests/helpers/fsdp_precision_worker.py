"""A torchrun worker for the FSDP2 mixed-precision checks (2 CPU ranks, gloo).

1. `parallelize` with `dist.strategy=fsdp` and fp16's parameter dtype: the layer computes in fp16
   (the policy casts the gathered parameters) while the sharded parameters the optimizer updates
   stay fp32.
2. One fp16 + GradScaler step where only rank 1's gradient shard holds an inf: every rank must skip
   the step and back off the scale alike, or the replicas part ways (FSDP2's DTensor gradients make
   torch's GradScaler all-reduce the inf finding; this checks that it still does).

Prints one JSON line per rank.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from bertforge.config import DistSection
from bertforge.train.distributed import init_distributed, parallelize, shutdown_distributed
from bertforge.train.precision import Precision


def main() -> None:
    env, device = init_distributed("cpu")
    precision = Precision("fp16")
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    model = nn.Sequential(layer)
    parallelize(model, [layer], DistSection(strategy="fsdp"), env, device, precision.fsdp_param_dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = precision.grad_scaler(device)
    assert scaler is not None
    before = layer.weight.to_local().detach().clone()
    output = model(torch.ones(2, 4))
    scaler.scale(output.float().sum()).backward()
    if env.rank == 1:
        layer.weight.grad.to_local()[0, 0] = float("inf")  # an overflow in this rank's shard only
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    print(json.dumps({"rank": env.rank, "compute_dtype": str(output.dtype), "param_dtype": str(layer.weight.dtype),
                      "moved": not torch.equal(layer.weight.to_local().detach(), before),
                      "scale": scaler.get_scale()}), flush=True)
    shutdown_distributed()


if __name__ == "__main__":
    main()
