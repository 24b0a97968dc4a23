"""Tasks: what to train and how to score it — pre-training, classification/regression fine-tuning,
GLUE (task table, parsers, results table) and the metrics they report."""
