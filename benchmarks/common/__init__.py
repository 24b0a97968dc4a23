"""What several benchmarks share: one home each, imported as `benchmarks.common.<module>`.

- `stats`: mean ± std as the reports print it, Welch's confidence interval of a difference;
- `corpora`: the documents of a corpus file as `bertforge prepare` reads them, the debian-docs corpus, mixing two;
- `mlm`: the pre-training comparisons' shared settings and their one MLM scoring (fixed masks, stock `transformers`);
- `hf_arms`: the Hugging Face side: training sets as `run_mlm.py` builds them, `BertForMaskedLM` of a preset,
  `TrainerCallback`s for a time budget and a step-time calibration;
- `tasks`: the fine-tuning tasks (bundled supersense, the parity tasks in the cache) and their seeds;
- `reports`: atomic writes, the machine a result was measured on, a run in a child process.
"""
