"""Every preset in sweeps/ composes, validates cell by cell, and spans the grid it documents."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from specbench.plan import GridComposer
from specbench.sweep import CellSweeper, plan_cells

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"

# preset -> (speculative cells in the grid, baselines, engine runs)
EXPECTED = {
    "cpu_demo": (2 * 1 * 2 * 2, 2 * 2, 3),
    "full_grid": (3 * 4 * 3 * 7, 3 * 7, 3),  # no EAGLE-1 for Qwen2 in vLLM 0.32
    "batch_decay": (2 * 1 * 2 * 8, 2 * 8, 3),
    "k_sweep": (3 * 8 * 3 * 1, 3 * 1, 2),
    "k_schedule_cpu": (1 * 3 * 2 * 4, 2 * 4, 2),
    "sampling": (2 * 3 * 2 * 2, 3 * 2 * 2, 2),
    # Serving: a baseline per workload and rate (the same offered load).
    "serving_cpu": (2 * 2 * 3, 2 * 3, 2),
    "serving_4090": (2 * 2 * 3 * 4, 3 * 4, 2),
}
# The machine each preset is written for: the memory check prices it there, not
# on whatever this machine's calibrated profile says (a CPU's 2 GiB KV pool
# refuses the Qwen grids, as it should).
HARDWARE = {"cpu_demo": "cpu-amd-epyc-2-cores", "full_grid": "h200", "batch_decay": "h200", "k_sweep": "h200",
            "k_schedule_cpu": "cpu-amd-epyc-2-cores",
            "sampling": "cpu-amd-epyc-2-cores", "serving_cpu": "cpu-amd-epyc-2-cores", "serving_4090": "rtx4090"}


def test_every_preset_is_listed():
    assert {p.stem for p in SWEEPS.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_preset_plans_its_grid(preset):
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        pinned = [f"sweep={preset}", f"hardware={HARDWARE[preset]}"]
        root = compose(config_name="config", overrides=pinned, return_hydra_config=True)
        assert root.hydra.mode.name == "MULTIRUN"
        params = [f"{k}={v}" for k, v in root.hydra.sweeper.params.items()]
        jobs = CellSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)[0]
        # The plan's composition (one Hydra compose per choice of config groups, scalars set on a copy),
        # which the plan and the vLLM validation test check against Hydra's own: full_grid's 273 composes
        # took 32 s of the fast pass.
        composer = GridComposer()
        planned = plan_cells(jobs, lambda job: composer([*pinned, *job]))
    GlobalHydra.instance().clear()
    speculative, baselines, passes = EXPECTED[preset]
    assert len(jobs) == speculative
    assert len(planned) == (speculative + baselines) * passes
    assert {p.cell.engine_run for p in planned} == set(range(passes))
    assert sum(p.cell.is_baseline for p in planned) == baselines * passes


@pytest.mark.parametrize("preset", ["cpu_demo", "serving_cpu"])
def test_the_plans_composition_is_hydras(preset):
    # GridComposer composes once per choice of config groups and sets each point's scalars on a copy; the
    # preset test above and the plan rely on that giving what Hydra's compose of the whole point gives.
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        pinned = [f"sweep={preset}", f"hardware={HARDWARE[preset]}"]
        root = compose(config_name="config", overrides=pinned, return_hydra_config=True)
        params = [f"{k}={v}" for k, v in root.hydra.sweeper.params.items()]
        jobs = CellSweeper.split_arguments(OverridesParser.create().parse_overrides(params), None)[0]
        composer = GridComposer()
        for job in jobs:
            overrides = [*pinned, *job]
            assert OmegaConf.to_container(composer(overrides)) == OmegaConf.to_container(
                compose(config_name="config", overrides=overrides)), job
    GlobalHydra.instance().clear()
