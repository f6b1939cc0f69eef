"""Hydra finds sweepers only by classes defined under the hydra_plugins namespace.

The logic lives in :mod:`specbench.sweep`; this subclass only gives it a name
Hydra accepts (``hydra/sweeper=specbench`` selects it).
"""

from specbench.sweep import CellSweeper


class SpecbenchSweeper(CellSweeper):
    """specbench's sweeper as a Hydra plugin."""
