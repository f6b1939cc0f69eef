"""Where a sweep's logs go: a quiet terminal, and everything in one file in the sweep directory.

The terminal shows what a user needs (the plan, one progress bar, a line per
cell, warnings, where the results are); specbench's own INFO log, vLLM's log
and whatever the engine workers print go to ``<sweep dir>/specbench.log``.
``verbose=true`` streams all of it to the terminal as well.

Hydra configures logging from ``conf/hydra/job_logging/specbench.yaml`` and
``conf/hydra/hydra_logging/specbench.yaml``, which name the filter and the
file handler below; engine workers redirect their own output with
:func:`redirect_output`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

LOG_FILE = "specbench.log"
# Where the engine workers' fork server sends what it prints while importing vLLM.
ENGINE_LOG_ENV = "SPECBENCH_ENGINE_LOG"


def engine_log(run_dir: Path, verbose: bool) -> Path | None:
    """Where a run's engine output goes: its log file, or None (the terminal) when ``verbose``."""
    return None if verbose else run_dir / LOG_FILE


class TerminalFilter(logging.Filter):
    """Lets warnings and errors through to the terminal; everything when ``verbose``."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.verbose = bool(verbose)

    def filter(self, record: logging.LogRecord) -> bool:
        """True for records the terminal should show."""
        return self.verbose or record.levelno >= logging.WARNING


def sweep_log_file(run_dir: str, sweep_dir: str, mode: Any) -> logging.FileHandler:
    """The log file of this sweep (``hydra.sweep.dir``) or single run (``hydra.run.dir``).

    One file for the whole sweep, appended to by every job and engine worker,
    rather than Hydra's default of one file per job directory. ``mode`` is
    Hydra's run mode (``RUN`` or ``MULTIRUN``).
    """
    directory = Path(sweep_dir if getattr(mode, "name", str(mode)).endswith("MULTIRUN") else run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    return logging.FileHandler(directory / LOG_FILE, mode="a", encoding="utf-8")


def redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``, appending.

    At the descriptor level, so that output from C extensions, vLLM's own
    logging handlers and child processes lands in the file too.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for stream in (1, 2):
            os.dup2(fd, stream)
    finally:
        os.close(fd)
