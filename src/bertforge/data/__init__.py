"""Data: sources, tokenizers, shards, pre-training samples, masking, loaders, bundled samples."""
