"""The training engine: a `Trainer` that runs any `Task` on one CPU, one GPU or many through torchrun."""
