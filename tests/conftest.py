"""Shared fixtures: Hydra composition of the packaged configs.

Result rows for tests are built in one place, ``tests/rows.py`` (merged rows,
cell rows, a whole sweep of them and their files).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig


@pytest.fixture
def compose_cell() -> Callable[[Sequence[str]], DictConfig]:
    """Compose the packaged config with overrides, as the app would."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        yield lambda overrides=(): compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
