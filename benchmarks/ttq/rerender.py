"""Re-render a committed time-to-quality report from its JSON with today's report code.

A report's table and plot are derived from its stored runs alone, so a new column (e.g. the ratio at (b)'s accuracy
one standard error up and down) reaches an older report without its corpus, which may take a Debian archive of
another day to rebuild: `python -m benchmarks.ttq.rerender benchmarks/results/time_to_quality_debian_docs.json`.
The runs are not changed; the .md, .json and .png are each replaced whole.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.ttq.report import publish_report

# What the first studies' reports lack (the plateau baseline, not recorded before the seeded studies) and
# today's table shows. Named rather than caught as a KeyError from rendering, so that a report broken some other way
# is not told it is merely old.
RECORDED_LATER = ("unigram_guess", "unigram_accuracy")


def rerender(report_json: Path) -> list[Path]:
    """Raises ValueError, touching no file, for a report written before a field today's table shows was recorded
    (the first studies had no plateau baseline): only its study, run again, can fill it in."""
    report = json.loads(report_json.read_text(encoding="utf-8"))
    missing = [key for key in RECORDED_LATER if key not in report["data"]]
    if missing:
        raise ValueError(f"{report_json}: written before reports recorded {', '.join(map(repr, missing))}, which "
                         "today's table shows; it stays as it is (run its study again to refresh it)")
    _, written = publish_report(report_json.with_suffix(""), report)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    reports = parser.parse_args().reports
    for report_json in reports:  # every path checked before any report is rewritten
        if not report_json.is_file() or report_json.suffix != ".json":
            parser.error(f"{report_json}: not a report's .json file; give e.g. "
                         "benchmarks/results/time_to_quality_bundled_seeds.json")
    for report_json in reports:
        try:
            print(", ".join(str(path) for path in rerender(report_json)))
        except ValueError as error:
            parser.exit(2, f"error: {error}\n")


if __name__ == "__main__":
    main()
