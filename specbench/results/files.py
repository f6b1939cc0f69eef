"""Files a sweep writes: atomically and durably, readable by everyone, and where one cell's live.

Every file is written to a temporary name, fsynced, made 0644 and renamed
into place, so a killed sweep leaves either a complete file or none, and a
SLURM sweep's files can be read from the user's other nodes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from specbench.results.schema import TOKENS_SCHEMA, rows_to_table

PLAN_FILE = "plan.json"
"""The sweep's planned cells, in its directory: ``[{"cell_id": ..., "overrides": [...]}, ...]`` (``sweep.write_plan``)."""


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` atomically and durably: ``write`` fills a temporary file
    beside it, which is fsynced, made world-readable and renamed into place.

    A killed process leaves the old file or the new one, never half of one.
    mkstemp creates files 0600; results, profiles and reports are shared (a
    SLURM sweep's cells are read by the user's other nodes and colleagues),
    so every file gets 0644.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_table(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` as Parquet, atomically (:func:`write_atomic`)."""
    write_atomic(path, lambda f: pq.write_table(table, f))


# Beside a sweep's cell files: measurements a later one replaced (remeasure=flagged, a stale resume).
REPLACED_DIR = "replaced"


@dataclass(frozen=True)
class CellFiles:
    """Where one cell's measurement and its output tokens live."""

    cells_dir: Path
    cell_id: str

    @property
    def row(self) -> Path:
        """The measured row; its presence (written last) marks the cell done."""
        return self.cells_dir / f"{self.cell_id}.parquet"

    @property
    def tokens(self) -> Path:
        """Output token ids per request (for the exactness check)."""
        return self.cells_dir / f"{self.cell_id}.tokens.parquet"

    def write(self, row: dict[str, Any], token_ids: Sequence[Sequence[int]], prompt_ids: Sequence[str]) -> None:
        """Tokens first, row last: a row on disk implies its tokens are there."""
        if token_ids:
            tokens = pa.Table.from_pylist(
                [
                    {"request_index": i, "prompt_id": prompt_ids[i % len(prompt_ids)], "token_ids": list(ids)}
                    for i, ids in enumerate(token_ids)
                ],
                schema=TOKENS_SCHEMA,
            )
            write_table(tokens, self.tokens)
        write_table(rows_to_table([row]), self.row)

    def set_aside(self) -> Path | None:
        """Move a stored measurement of this cell (row and tokens) into ``replaced/``, named by the cell
        and the time it was set aside, before the cell is measured again; return the row's new path
        (None: nothing stored). The merge reads only the cells folder itself, so the new measurement
        replaces the old one there, and the old stays on disk."""
        if not self.row.exists():
            return None
        aside = self.cells_dir / REPLACED_DIR
        aside.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        if self.tokens.exists():
            os.replace(self.tokens, aside / f"{self.cell_id}.{stamp}.tokens.parquet")
        moved = aside / f"{self.cell_id}.{stamp}.parquet"
        os.replace(self.row, moved)
        return moved

    def read_tokens(self) -> list[list[int]] | None:
        """Token ids by request index, or None if the file is absent or unreadable."""
        try:
            table = pq.read_table(self.tokens)
        except Exception:  # absent or damaged: exactness is then unknown, not false
            return None
        ordered = sorted(table.to_pylist(), key=lambda r: r["request_index"])
        return [r["token_ids"] for r in ordered]


def write_results(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write merged rows to ``results.parquet`` atomically."""
    write_table(rows_to_table(rows), path)


def planned_cell_ids(sweep_dir: Path) -> list[str] | None:
    """The cell ids a sweep planned (its :data:`PLAN_FILE`); None where it has none or it cannot be read
    (a sweep written before the plan was kept, a single run): the grid is then the one its rows imply."""
    try:
        return [str(entry["cell_id"]) for entry in json.loads((sweep_dir / PLAN_FILE).read_text())]
    except (OSError, ValueError, TypeError, KeyError):
        return None
