"""bertforge: from raw text to a trained, evaluated, exported BERT-family encoder."""

from __future__ import annotations

__version__ = "0.1.0"
