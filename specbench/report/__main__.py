"""``python -m specbench.report <sweep dir or results.parquet> [--out PATH]``: write the HTML report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.results.schema import ResultsError, checked_results_path


def main(argv: list[str] | None = None) -> int:
    """Write ``report.html`` beside the results (or to ``--out``) and print its path."""
    parser = argparse.ArgumentParser(
        prog="python -m specbench.report",
        description="Write a self-contained HTML report of a specbench sweep.",
    )
    parser.add_argument("results", type=Path, help="a sweep directory or its results.parquet")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="where to write the page (default: report.html beside the results)",
    )
    args = parser.parse_args(argv)
    try:
        # Refused before the page's libraries load: a missing, foreign or damaged file costs a second, not
        # their imports.
        checked_results_path(args.results)
        from specbench.report.page import write_report

        path = write_report(args.results, args.out)
    except (FileNotFoundError, ResultsError) as exc:  # no results, or not a results file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
