"""``python -m specbench.demo``: make demo's calibration and sweep in one process, one fork server for both."""

from __future__ import annotations

import sys

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from specbench import calibrate, demo
from specbench.analytic import prediction
from specbench.config import engine_start_environment
from specbench.engine import start_environment
from specbench.plan import grid_jobs
from specbench.sweep import plan_cells


@pytest.fixture
def profile(tmp_path, monkeypatch):
    path = tmp_path / "hardware" / "calibrated.yaml"
    monkeypatch.setattr(prediction, "calibrated_path", lambda: path)
    return path


def _commands(calibration_status: int, sweep_status: int = 0):
    calls: list[tuple[str, list[str]]] = []

    def calibrate_main(args):
        calls.append(("calibrate", list(args)))
        return calibration_status

    def sweep(overrides):
        calls.append(("sweep", list(overrides)))
        return sweep_status

    return calls, {"calibrate_main": calibrate_main, "sweep": sweep}


NARROWED = ["--batch-sizes", "1,4", "--prompt-lengths", "16,512"]


@pytest.mark.parametrize("given, calibration", [
    ((), ["--heads", "eagle3", *NARROWED, "--draft-ks", "4"]),
    (("method=ngram",), ["--heads", "none", *NARROWED]),
    (("method=eagle,ngram,eagle3",), ["--heads", "eagle3,eagle", *NARROWED, "--draft-ks", "4"]),
    (("batch_size=1,8", "num_speculative_tokens=2,8"),
     ["--heads", "eagle3", "--batch-sizes", "1,4,16", "--prompt-lengths", "16,512", "--draft-ks", "2,8"]),
])
def test_without_a_profile_it_calibrates_the_grids_range_and_heads_in_one_round_then_sweeps(profile, given, calibration):
    # make demo's grid runs EAGLE-3 at K=4, batch 1 and 4, prompts of at most 485 tokens: its calibration times
    # 4 grid points of the default 8 (batch 1 and 4 at 16 and 512 tokens) and the EAGLE-3 head at K=4 alone;
    # EAGLE-1's two head engines are not started for it. A wider grid widens it to the default sizes that span it.
    calls, commands = _commands(0)
    assert demo.main(["sweep=cpu_demo", "sweep_name=x", *given], **commands) == 0
    assert calls == [("calibrate", ["--rounds", "1", *calibration]),
                     ("sweep", ["sweep=cpu_demo", "sweep_name=x", *given])]


@pytest.mark.parametrize("given, streams", [("verbose=true", True), ("verbose=false", False), ("seed=1", False)])
def test_a_verbose_sweeps_calibration_streams_too(profile, given, streams):
    # The engines' fork server, started by the calibration, keeps its output for every later worker.
    calls, commands = _commands(0)
    demo.main(["sweep=cpu_demo", given], **commands)
    assert calls[0] == ("calibrate", ["--rounds", "1", "--heads", "eagle3", *NARROWED, "--draft-ks", "4",
                                      *(["--verbose"] if streams else [])])


def test_a_cached_profile_is_reused(profile):
    profile.parent.mkdir(parents=True)
    profile.write_text("name: earlier\n")
    calls, commands = _commands(0)
    assert demo.main(["sweep=cpu_demo"], **commands) == 0
    assert calls == [("sweep", ["sweep=cpu_demo"])]


def test_a_failed_calibration_is_said_and_the_sweep_still_runs_with_its_own_status(profile, capsys):
    calls, commands = _commands(1, sweep_status=3)
    assert demo.main(["sweep=cpu_demo"], **commands) == 3
    assert [name for name, _ in calls] == ["calibrate", "sweep"]
    assert demo.CALIBRATION_FAILED in capsys.readouterr().err


@pytest.mark.parametrize("bad, named", [("batch_size=0", "batch_size"), ("sweep=cpu_dmo", "cpu_dmo")])
def test_a_bad_override_is_refused_before_any_engine(profile, capsys, bad, named):
    calls, commands = _commands(0)
    assert demo.main(["sweep=cpu_demo", bad], **commands) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err.startswith("error: ") and named in err


def test_hydras_information_flags_go_to_the_sweep_without_a_calibration(profile):
    calls, commands = _commands(0)
    assert demo.main(["sweep=cpu_demo", "--cfg", "job"], **commands) == 0
    assert calls == [("sweep", ["sweep=cpu_demo", "--cfg", "job"])]


def test_the_sweep_runs_as_python_m_specbench_in_this_process(monkeypatch):
    # The sweep is Hydra's entry point, which reads the command line: given the overrides, and sys.argv
    # restored after it, whatever status it exits with.
    import specbench.__main__ as entry

    seen = []

    def fake_main():
        seen.append(list(sys.argv))
        raise SystemExit(2)

    monkeypatch.setattr(entry, "main", fake_main)
    before = list(sys.argv)
    assert demo._sweep(["sweep=cpu_demo", "verbose=true"]) == 2
    assert seen == [["specbench", "sweep=cpu_demo", "verbose=true"]]
    assert sys.argv == before


def test_the_calibrations_engines_and_the_demos_share_the_fork_server():
    # A worker whose start environment differs from the fork server's is spawned instead, and imports vLLM
    # itself (specbench.engine.worker_context): every engine of the demo's sweep must start as the
    # calibration's did, or the process shared for one import would pay one per engine.
    args = calibrate.argument_parser().parse_args(demo.calibrate_args(demo.grid_cells(["sweep=cpu_demo"])))
    GlobalHydra.instance().clear()
    engines = calibrate.planned_engines(args)
    calibration = {tuple(sorted(start_environment(spec.preload, spec.cpu_huge_pages).items()))
                   for spec in (cell.engine_spec(prepare=False) for cell in engines.cells)}
    jobs = grid_jobs(["sweep=cpu_demo"])
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        planned = plan_cells(jobs, lambda job: compose(config_name="config", overrides=list(job)))
    GlobalHydra.instance().clear()
    sweep = {tuple(sorted(engine_start_environment(p.cell.config["engine"]).items())) for p in planned}
    assert len(calibration) == 1 and calibration == sweep
