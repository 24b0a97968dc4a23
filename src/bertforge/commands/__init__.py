"""CLI commands, one module each; see `bertforge.cli`."""
