"""`bertforge.device`: how batches reach the model's device (the meta device stands in for a GPU on CPU-only CI)."""

import torch
from torch import nn

from bertforge.device import batch_on_device, model_device


def test_a_batch_for_another_device_has_its_tensors_moved_and_its_other_fields_kept() -> None:
    batch = {"input_ids": torch.arange(6), "cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32), "max_seqlen": 4}
    moved = batch_on_device(batch, torch.device("meta"))
    assert moved["input_ids"].device.type == "meta" and moved["cu_seqlens"].device.type == "meta"
    assert moved["cu_seqlens"].dtype == torch.int32 and moved["max_seqlen"] == 4
    assert batch["input_ids"].device.type == "cpu"  # the caller's batch is left as it was


def test_a_batch_for_the_cpu_is_returned_as_it_is() -> None:
    batch = {"input_ids": torch.arange(3)}
    assert batch_on_device(batch, torch.device("cpu")) is batch


def test_a_model_is_where_its_parameters_are() -> None:
    assert model_device(nn.Linear(2, 2)).type == "cpu"
    assert model_device(nn.Linear(2, 2, device="meta")).type == "meta"
