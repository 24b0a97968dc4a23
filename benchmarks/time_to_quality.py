"""Time to quality: what four ways of pre-training a BERT reach in the same wall-clock minutes (issue 18).

The study is described in `benchmarks/ttq/__init__.py` (`--help` prints it); its parts live in `benchmarks/ttq/`.
"""

import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/time_to_quality.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])


from benchmarks.ttq.cli import main

if __name__ == "__main__":
    main()
