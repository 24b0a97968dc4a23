"""Time to quality: what four ways of pre-training a BERT reach in the same wall-clock minutes (issue 18).

One corpus, one WordPiece tokenizer (8192, trained on the corpus as `pretrain_vs_hf.py` trains it),
one model shape (`--model`, bert-mini by default), sequences of 128 tokens and 15% masking for all
four arms, each trained for each of the `--budgets` (minutes of training on this machine):

- `a`: HF `run_mlm.py` as a user runs it out of the box: `BertForMaskedLM` from a config, the
  training documents tokenized and cut into 128-token blocks by `group_texts` (`--max_seq_length
  128`, the one flag passed), `DataCollatorForLanguageModeling(mlm_probability=0.15)` and
  `TrainingArguments`' defaults (transformers 5.x): learning rate 5e-5, `lr_scheduler_type` linear,
  `warmup_steps` 0, `optim` adamw_torch_fused with betas 0.9/0.999, eps 1e-8, weight decay 0.0,
  `max_grad_norm` 1.0, `per_device_train_batch_size` 8, `logging_steps` 500, seed 42 (here the
  pre-training seed). The only argument sized here is `max_steps` (below);
- `b`: the same model, data and collator under HF `Trainer` with bertforge's tuned hyperparameters,
  as `pretrain_vs_hf.py`'s `HF (b) group_texts` arm: batch 32, lr 1e-3, linear decay after 6%
  warmup, AdamW betas 0.9/0.98, eps 1e-6, weight decay 0.01, clipping 1.0, dropout 0.1;
- `c`: `bertforge pretrain` with those hyperparameters on the prepared dataset (sentences of one
  document packed up to 128 tokens), as `pretrain_vs_hf.py`'s `bertforge` arm;
- `d`: `bertforge pretrain` with the budget recipe, `configs/pretrain/budget-cpu.yaml` (`--recipe`):
  every key of it except where and how long it runs (run.*, data.path, the budget keys, evaluation
  and logging), on the same prepared dataset. Its model section must not change the shape; its
  switches keyed to the step count get a step budget as well (below).

The budget. bertforge trains with `train.max_time_minutes`: its clock (`TrainingState.elapsed_seconds`)
counts the optimizer steps (data, forward, backward, optimizer), not the set-up, logging, its
evaluation or checkpoints, and its schedule follows that clock, so its learning rate reaches zero at
the budget. HF `Trainer` has no time budget: `BudgetClock` (a `TrainerCallback`) runs a clock from
`on_train_begin`, stops training when it passes the budget, and is paused while it exports. HF's
linear schedule is sized in steps, so `max_steps` is estimated by a timed calibration: the same
model, data and arguments, freshly built in the same process, train for `CALIBRATION_SECONDS` (60)
after `CALIBRATION_WARMUP` (20) steps (`--calibration`; the studies before the second debian-docs one
ran 20 s after 5 steps, which left 8 of 25 HF runs short of their budget); seconds per step is
measured between the starts of the timed steps, and `max_steps = budget / seconds per step`. The
calibration is thrown away and not counted. It is an estimate: where the real run is slower (a
busier machine, slower later steps), the clock stops it before its learning rate has decayed to zero;
where it is faster, it runs out of steps before the budget and its curve ends early. Each run records planned and done steps and its minutes.

Arm (d)'s recipe may turn on switches that bertforge keys to the step count (`Config.step_keyed_switches`:
`data.mask_schedule`, `data.seq_len_schedule`, `train.batch_ramp_start`), which it refuses under a
time budget alone. With any of them, arm (d)'s steps are planned from timed calibrations, bertforge runs
of the recipe on the same prepared data, thrown away, each timed by its own clock (`elapsed_seconds`)
over `CALIBRATION_SECONDS` after `CALIBRATION_WARMUP` steps, and the run gets both `train.max_steps`
and `train.max_time_minutes`: its schedules, the learning rate's included, follow the steps, and the
time budget is a hard stop. One calibration runs the recipe's most expensive step throughout
(`calibration_overrides`: the full batch, full-length samples, the higher of its mask rates, since the
vocabulary projection runs only on masked rows); where the ramp or a shorter phase makes cheaper
steps, a second runs its cheapest (`cheapest_calibration_overrides`: the ramp's first batch at the
shortest phase's length, the higher mask rate still). A step's seconds are modelled as a line in its
tokens (samples × length) through the two (`StepCost`), and the planned steps are the most whose
modelled seconds, over the step shapes the ramp and phases give (`step_tokens`, the trainer's own
functions of step and total steps), fit the budget (`steps_filling`). (Before the second calibration,
the dearest step's seconds alone sized the plan, and the 10-minute ramp and phase screens ended at 6.9
and 7.4 minutes.) The record says how many steps were planned and done, and both calibrations. A
recipe with only time-keyed switches trains for `train.max_time_minutes` alone, as arm (c) does.

Along each run the model is exported in HF format at 1/8, 1/4, 1/2 and 3/4 of the budget (by each
arm's own clock, not counted in it) and at the end (`final/`); with `train.ema` bertforge's exports
hold the moving average, as its `final/` does (with `train.average_last_k` only `final/` is an
average). Quality:

- validation MLM loss and accuracy of every export, by `pretrain_vs_hf.py`'s `mlm_accuracy`: stock
  `transformers.BertForMaskedLM` on the prepared dataset's validation split (the last 2% of the
  documents, Megatron's split 980,20, never trained on by any arm: HF's blocks are built from the
  documents before them) with masks fixed by one seed (`packed_validation_batches`). (The tokenizer
  is trained on the whole corpus, validation documents included, as in `pretrain_vs_hf.py`.)
- downstream test accuracy of each run's final model after the same `bertforge finetune` (the
  quickstart's recipe, `recipes/quickstart-finetune-tiny.yaml`: 3 epochs, max length 64) with
  `--downstream-seeds` seeds at the learning rate of `--downstream-lrs` (1e-3, 5e-4, 3e-4) and the
  dropout of `--downstream-dropouts` (the model's own, 0.1 here, or 0) that scored best on a dev split
  for that model and task (fine-tuned with the first seed on 9/10 of the training rows, scored on the
  other tenth; the BERT paper's per-model choice: one lr for all arms favoured the barely trained
  models, and supersense fine-tunes better without dropout); a fine-tune that already finished with
  the same config, model and code is read back, not re-run (its scores are kept, its weights deleted:
  a bert-mini fine-tune's checkpoint and export take ~85 MB, 18 per pre-training run). The tasks: the
  bundled supersense task (8,000 train / 2,000 test glosses, as `pretrain_vs_hf.py`) and `manpages`
  (all 2,998 train / 387 test rows: a man page's DESCRIPTION -> its manual section, 6 classes).
  manpages because it is technical prose like the debian-docs corpus yet kept out of it by
  `scripts/build_pretraining_corpus.py`, and it asks for another skill than glosses (what kind of
  thing a text documents), while staying small enough to fine-tune in a minute.
- MLM accuracy of each final model on each downstream task's test texts (masked once, as above): a
  model can only bring to a task what its corpus taught it about that task's text;
- time to quality: the first minute at which an arm's validation MLM accuracy reaches (b)'s at the
  largest budget, linearly interpolated between exports on each of the arm's runs (the earliest over
  its budgets; "≤" where its first export already reached it).

Every (arm, budget, pre-training seed) is one result file under `--work-dir`, written atomically as
soon as it is scored; a re-run skips the done ones (results measured with other settings are refused,
not mixed in). The report is built from every result in the store, so a study can be run in parts.
The work directory does not outlive its machine; `--results-from` puts a committed report's runs back
into the store, so a study split over machines resumes where its last report stopped (the report
counts the runs per CPU: the same minutes buy another number of steps on another CPU, and gives each
run's fp32 matmul rate, measured on idle cores as its invocation started: the same CPU's speed moves too).

The corpora (`--corpus`): `bundled` (the KJV and the supersense training glosses), `debian-docs`
(`scripts/build_pretraining_corpus.py`) and `mixed`: every k-th debian-docs document, k chosen for 2/3 of
the text, and the whole bundled corpus, spread evenly through one file written into the work directory
(`write_mixed_corpus`), so that the one corpus covers the text of both downstream tasks, and `tech-dictionaries`: the
FOLDOC, Jargon File and V.E.R.A. dictd databases (`apt-get install dict-foldoc dict-jargon dict-vera`),
6.8 MB of technical English that neither task's text is drawn from (`tech_dictionaries_corpus`; no line
of it of three or more words is a line of either task's text). Studies are run in parts, e.g.:

    .venv/bin/python benchmarks/time_to_quality.py --quick --arms a,b,c           # smoke run, a few minutes
    .venv/bin/python benchmarks/time_to_quality.py --corpus debian-docs --arms a,b --budgets 10,20,40
    .venv/bin/python benchmarks/time_to_quality.py --corpus debian-docs --arms c,d --budgets 10,20,40
    .venv/bin/python benchmarks/time_to_quality.py --corpus mixed --arms b,d --budgets 40 --downstream-seeds 5

    python scripts/build_parity_tasks.py                     # every evaluation task, manpages among them, once
    python scripts/build_pretraining_corpus.py               # then the debian-docs corpus, once

The corpus keeps out the text of every task built under the tasks cache, so it depends on which are
built: after all of them it holds 32,997 documents (the study's), after manpages alone 33,001, and a
committed report measured on one is refused by `--results-from` on the other (its data block).

The report goes to `benchmarks/results/time_to_quality.md` (+ `.json`, `.png`); `--quick` writes
into the work directory instead, so a smoke run never replaces a measurement.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
