"""The sweep report: one self-contained HTML page built from ``results.parquet``.

:func:`write_report`, :func:`render_report`, :func:`verdict_lines` and :data:`REPORT_FILE` live in
:mod:`specbench.report.page` and are imported from there on first use. The package itself imports
nothing heavy because ``python -m specbench.report`` imports it before its ``__main__`` runs: the command
refuses a file that is not a specbench result before pandas, matplotlib and seaborn load (seconds).
"""

from __future__ import annotations

from typing import Any

__all__ = ["REPORT_FILE", "render_report", "verdict_lines", "write_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from specbench.report import page

        return getattr(page, name)
    raise AttributeError(f"module 'specbench.report' has no attribute {name!r}")
