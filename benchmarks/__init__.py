"""Side-by-side benchmarks against the reference tools (docs/benchmarks.md quotes their commands and results).

Each benchmark is one module here, run from the repository root as `python benchmarks/NAME.py` (the commands the
docs quote) or `python -m benchmarks.NAME`. They import what they share as the package it is, never a file by path:

- `benchmarks.common`: the helpers of several benchmarks: statistics, corpora, the Hugging Face arms (datasets as
  `run_mlm.py` builds them, `BertForMaskedLM`, time-budget callbacks), MLM scoring with stock `transformers`, the
  downstream tasks, and the reports' plumbing (atomic writes, the machine, child processes);
- `benchmarks.ttq`: the parts of `time_to_quality.py`, one module per concern.

Run by path, a benchmark's first lines put the repository root, instead of `benchmarks/`, first on the import path
(`python -m` does the same), so that every module is imported once, under its package name.
"""
