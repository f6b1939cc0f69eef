"""Refusals end the command cleanly: their lines, a non-zero exit, no Python traceback.

Each case runs an entry point's ``main`` in this process on its own command line,
as a user would type it, on one class of refusal (validation, workload loading,
a Hydra override, a damaged results file). None of them gets as far as starting
an engine. A fresh process per case would prove nothing more and cost seconds of
imports each; the last tests run the real commands in subprocesses, once per
kind of entry point, for the exit status a shell sees.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hydra.core.global_hydra import GlobalHydra

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Outcome:
    """What a command left: its exit status and everything it printed."""

    returncode: int
    output: str


@pytest.fixture()
def command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
            ) -> Iterator[Callable[..., Outcome]]:
    """``command(["-m", module, *args])``: that command's ``main`` run here, from ``tmp_path``.

    Hydra's state and the logging it configures (handlers on the root logger)
    are put back afterwards, so the next test starts as a fresh process would.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)  # that switch asks for the traceback on purpose
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def call(args: list[str]) -> Outcome:
        flag, module, *rest = args
        assert flag == "-m"
        target = importlib.import_module(module)
        if hasattr(target, "__path__"):  # a package: `python -m` runs its __main__
            target = importlib.import_module(f"{module}.__main__")
        GlobalHydra.instance().clear()
        capsys.readouterr()
        try:
            if module == "specbench":  # Hydra's entry point reads sys.argv
                monkeypatch.setattr(sys, "argv", [module, *rest])
                code = target.main()
            else:
                code = target.main(rest)
        except SystemExit as exc:
            code = exc.code
        finally:
            GlobalHydra.instance().clear()
        out = capsys.readouterr()
        return Outcome(0 if code is None else code, out.out + out.err)

    yield call
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def assert_refused(result: Outcome | subprocess.CompletedProcess[str], *expected: str) -> None:
    output = result.output if isinstance(result, Outcome) else result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for text in expected:
        assert text in output, output


@pytest.fixture()
def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": oops}\n', encoding="utf-8")
    return path


def sweep(*overrides: str, multirun: bool, out: Path) -> list[str]:
    dirs = [f"hydra.run.dir={out / 'run'}", f"hydra.sweep.dir={out / 'sweep'}"]
    return ["-m", "specbench", *(["-m"] if multirun else []), *overrides, *dirs]


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["method=medusa"], ["method/medusa", "Available options in 'method'"]),
        (["num_speculative_tokens=0"], ["num_speculative_tokens=0 must be an integer in 1..64"]),
        (["method=draft_model", "model.drafts.small=/no/such/draft"],
         ["model.drafts.small", "/no/such/draft", "no such directory"]),
        (["method=eagle", "model.eagle=null"],
         ["method=eagle (model.eagle) is not set",
          "python -m specbench.heads train --method eagle --target embedded:smollm2-135m-instruct"]),
        (["batch_size=1", "no_such_key=3"], ["Could not override 'no_such_key'"]),
        (["passes=3"], ["passes=3: this key was renamed engine_runs", "use engine_runs=3"]),
        (["engine.max_model_len=long"], ["Value 'long' of type 'str' could not be converted to Integer",
                                         "full_key: engine.max_model_len"]),
    ],
    ids=["unknown-method", "k-below-1", "missing-draft", "eagle-without-head", "unknown-key", "renamed-key",
         "wrong-type"],
)
def test_config_refusals(command, tmp_path: Path, overrides: list[str], expected: list[str], multirun: bool) -> None:
    assert_refused(command(sweep(*overrides, multirun=multirun, out=tmp_path)), *expected)
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


# Each way a K schedule can be wrong, refused by the real command before any engine loads (multirun:
# the way a schedule is swept beside fixed K, method.k_schedule=null,<schedule>).
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["method.k_schedule=null,[[1,4,4],[3,64,2]]"],
         ["method.k_schedule=[[1,4,4],[3,64,2]]: ranges overlap or are out of order at batch size 3"]),
        (["method.k_schedule=[[1,4,4],[8,64,2]]"],
         ["method.k_schedule=[[1,4,4],[8,64,2]]: batch sizes 5..7 are in no range (a gap"]),
        (["method.k_schedule=[[2,64,4]]"], ["the first range must start at batch size 1 (it starts at 2)"]),
        (["method.k_schedule=[[1,4,4],[5,64,-1]]"], ["every K must be an integer in 0..64"]),
        (["method.k_schedule=[[1,4]]"],
         ["method.k_schedule=[[1,4]] must be a list of [first batch size, last batch size, K] integer triples"]),
        (["method=controlled", "method.k_schedule=[[1,4,4],[5,64,2]]"],
         ["vLLM 0.32 does not schedule K for method=controlled", "allowed for method=ngram, eagle, eagle3, draft_model"]),
        (["+method.speculative_config.num_speculative_tokens_per_batch_size=[[1,4,4],[5,64,2]]"],
         ["set the K schedule with method.k_schedule=[[1,4,4],[5,64,2]]"]),
    ],
    ids=["overlap", "gap", "first-not-1", "negative-k", "malformed", "unscheduled-method", "old-key"],
)
def test_k_schedule_refusals(command, tmp_path: Path, overrides: list[str], expected: list[str]) -> None:
    assert_refused(command(sweep(*overrides, "batch_size=1,8", multirun=True, out=tmp_path)), *expected)
    assert not (tmp_path / "sweep" / "cells").exists()


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_malformed_prompt_file_is_refused_before_any_cell(command, tmp_path: Path, bad_jsonl: Path,
                                                          multirun: bool) -> None:
    overrides = ["workload.source=jsonl", f"workload.path={bad_jsonl}", "batch_size=1,2" if multirun else "batch_size=1"]
    result = command(sweep(*overrides, multirun=multirun, out=tmp_path))
    assert_refused(result, f"{bad_jsonl}:2: malformed JSON line")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_too_few_prompts_within_max_prompt_tokens_are_refused_before_any_cell(command, tmp_path: Path,
                                                                               multirun: bool) -> None:
    from specbench import models

    if not (Path(models.resolve("embedded:smollm2-135m-instruct", prepare=False)) / "tokenizer.json").is_file():
        pytest.skip("the embedded model is not prepared: validation has no tokenizer to count with")
    overrides = ["workload=summarize", "workload.num_prompts=32", "workload.max_prompt_tokens=512",
                 "batch_size=1,8" if multirun else "batch_size=1"]
    result = command(sweep(*overrides, multirun=multirun, out=tmp_path))
    assert result.returncode == 2
    assert_refused(result, "workload.num_prompts=32 but only 9 prompts of summarize (source=builtin) fit "
                           "workload.max_prompt_tokens=512 (29 of 38 are longer")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize("module", ["specbench.report", "specbench.analytic.prediction", "specbench.analytic.recommend"])
def test_corrupt_results_file(command, tmp_path: Path, module: str) -> None:
    damaged = tmp_path / "results.parquet"
    damaged.write_bytes(b"PAR1 this is not a parquet file")
    assert_refused(command(["-m", module, str(damaged)]), str(damaged), "not a readable Parquet file")


def test_a_misspelt_key_in_a_users_own_workload_file_is_refused(command, tmp_path: Path) -> None:
    (tmp_path / "conf" / "workload").mkdir(parents=True)
    text = (REPO / "conf" / "workload" / "creative.yaml").read_text().replace("max_tokens:", "max_token:")
    (tmp_path / "conf" / "workload" / "mine.yaml").write_text(text)
    result = command(sweep(f"--config-dir={tmp_path / 'conf'}", "workload=mine", multirun=False, out=tmp_path))
    assert_refused(result, "Key 'max_token' not in 'WorkloadSchema'", "full_key: workload.max_token")


def test_calibrate_refuses_an_unknown_model(command) -> None:
    assert_refused(command(["-m", "specbench.calibrate", "model=nope"]), "model/nope")


def test_calibrate_refuses_an_invalid_setting(command) -> None:
    result = command(["-m", "specbench.calibrate", "engine.max_model_len=0"])
    assert_refused(result, "exceeds engine.max_model_len=0")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python <args>`` in a subprocess, with this checkout's specbench first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_hydra_command_exits_with_the_refusal_status(tmp_path: Path) -> None:
    result = run(sweep("num_speculative_tokens=0", multirun=False, out=tmp_path), tmp_path)
    assert result.returncode == 2
    assert_refused(result, "num_speculative_tokens=0 must be an integer in 1..64")


def test_a_module_command_exits_with_its_mains_status(tmp_path: Path) -> None:
    damaged = tmp_path / "results.parquet"
    damaged.write_bytes(b"PAR1 this is not a parquet file")
    result = run(["-m", "specbench.report", str(damaged)], tmp_path)
    assert result.returncode == 2
    assert_refused(result, str(damaged), "not a readable Parquet file")


def test_suffix_without_arctic_inference_is_refused_in_one_line_before_any_engine(tmp_path: Path) -> None:
    """vLLM would say it only at engine start; arctic_inference is not installed in this venv (CUDA-only)."""
    if importlib.util.find_spec("arctic_inference") is not None:
        pytest.skip("arctic_inference is installed here: method=suffix is not refused")
    result = run(sweep("method=suffix", multirun=False, out=tmp_path), tmp_path)
    assert result.returncode == 2
    assert_refused(result, "pip install arctic-inference==0.1.1")
    refusals = [line for line in (result.stdout + result.stderr).splitlines() if "arctic-inference" in line]
    assert len(refusals) == 1 and "method=suffix needs the arctic-inference" in refusals[0], refusals
    assert not (tmp_path / "run" / "cells").exists()


@pytest.fixture()
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command that would start an engine fails the test instead: a refusal must come before any."""
    import specbench.__main__ as entry
    from specbench import job

    def engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine would start: the input was not refused")

    monkeypatch.setattr(entry, "run_cell", engine)
    monkeypatch.setattr(job, "start_engine_server", engine)


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # Hydra's own hint for a misspelt key is to add it with +: the added key must not run at the default.
        (["+num_speculative_token=8"], "num_speculative_token=8: no such key; did you mean num_speculative_tokens?"),
        (["+engine.gpu_mem=0.5"], "engine.gpu_mem=0.5: no such key; did you mean engine.gpu_memory_utilization?"),
        (["+load.slo.tpot=50"], "load.slo.tpot=50: no such key; did you mean load.slo.tpot_ms?"),
        (["engine.gpu_memory_utilization=1.5"], "engine.gpu_memory_utilization=1.5 must be in (0, 1]"),
        (["engine.gpu_memory_utilization=0"], "engine.gpu_memory_utilization=0.0 must be in (0, 1]"),
        # Values that no rate makes matter are checked all the same.
        (["load.max_concurrency=0"], "load.max_concurrency=0 must be null or an integer >= 1"),
        (["load.slo.tpot_ms=-5"], "load.slo.tpot_ms=-5.0 must be null or > 0 (milliseconds)"),
        (["batch_size=100000", "engine.max_num_seqs=100000"], "batch_size=100000 must be at most 4096"),
        (["engine.max_num_seqs=100000"], "engine.max_num_seqs=100000 must be an integer in 1..4096"),
    ],
    ids=["added-misspelt-key", "added-engine-key", "added-slo-key", "memory-fraction-above-1",
         "memory-fraction-0", "concurrency-0-offline", "negative-slo-offline", "huge-batch", "huge-max-num-seqs"],
)
def test_every_value_and_added_key_is_refused_before_any_engine(command, no_engine, tmp_path: Path,
                                                                 overrides: list[str], expected: str,
                                                                 multirun: bool) -> None:
    result = command(sweep(*overrides, multirun=multirun, out=tmp_path))
    assert result.returncode == 2
    assert_refused(result, expected)
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["hardware=rtx4090", "engine.gpu_memory_utilization=1.5"], "engine.gpu_memory_utilization=1.5 must be in (0, 1]"),
        (["+num_speculative_token=8"], "num_speculative_token=8: no such key; did you mean num_speculative_tokens?"),
        (["load.max_concurrency=0"], "load.max_concurrency=0 must be null or an integer >= 1"),
        (["load.slo.tpot_ms=-5"], "load.slo.tpot_ms=-5.0 must be null or > 0"),
        (["batch_size=100000", "engine.max_num_seqs=100000"], "batch_size=100000 must be at most 4096"),
    ],
    ids=["memory-fraction", "added-key", "concurrency-0-offline", "negative-slo-offline", "huge-batch"],
)
def test_the_plan_refuses_what_the_sweep_refuses(command, overrides: list[str], expected: str) -> None:
    result = command(["-m", "specbench.plan", *overrides])
    assert result.returncode == 1  # the plan's status for a grid with refused cells
    assert_refused(result, "REFUSED: invalid setting", expected)
    assert "0 refused" not in result.output


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["load.slo.tpot_ms=-5"], "error: load.slo.tpot_ms=-5 must be > 0 (milliseconds)"),
        (["load.slo.tpot_ms=0", "load.slo.ttft_ms=-1"],
         "error: load.slo.ttft_ms=-1 must be > 0 (milliseconds); load.slo.tpot_ms=0 must be > 0 (milliseconds)"),
    ],
    ids=["negative", "two-bad"],
)
def test_capacity_refuses_a_bad_slo_in_one_line(command, overrides: list[str], expected: str) -> None:
    result = command(["-m", "specbench.capacity", *overrides])
    assert result.returncode == 2
    assert_refused(result, expected)


def test_unknown_slo_keys_are_named_by_the_capacity_search() -> None:
    from specbench.analytic.capacity import CapacityError, slo_targets

    with pytest.raises(CapacityError, match=r"^unknown SLO key\(s\) load.slo.foo_ms; load.slo.tpot_ms=-5 must be > 0"):
        slo_targets({"foo_ms": 3, "tpot_ms": -5})


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_hydras_own_refusals_exit_2(command, tmp_path: Path, multirun: bool) -> None:
    for overrides in (["no_such_key=3"], ["method=medusa"], ["batch_size=four"]):
        result = command(sweep(*overrides, multirun=multirun, out=tmp_path))
        assert result.returncode == 2, result.output
        assert_refused(result)


def test_the_hydra_command_exits_2_on_hydras_own_refusal(tmp_path: Path) -> None:
    result = run(sweep("no_such_key=3", multirun=False, out=tmp_path), tmp_path)
    assert result.returncode == 2
    assert_refused(result, "Could not override 'no_such_key'")


# Every command that takes a sweep's results: its arguments for one results file.
RESULTS_COMMANDS = {
    "specbench.report": lambda path: [path],
    "specbench.analytic.prediction": lambda path: [path],
    "specbench.analytic.recommend": lambda path: [path],
    "specbench.results.serving": lambda path: [path, path],
}


@pytest.mark.parametrize("module", list(RESULTS_COMMANDS))
def test_a_parquet_file_that_is_not_a_specbench_result_is_refused_in_one_line(command, tmp_path: Path,
                                                                            module: str) -> None:
    import warnings

    import pandas as pd

    foreign = tmp_path / "other.parquet"
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(foreign)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = command(["-m", module, *RESULTS_COMMANDS[module](str(foreign))])
    assert result.returncode == 2
    assert_refused(result, f"{foreign}: not a specbench results file (no column schema_version, cell_id, status")
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not caught, [str(w.message) for w in caught]
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("make", ["missing", "foreign", "damaged"])
def test_the_report_command_refuses_before_the_pages_libraries_load(tmp_path: Path, make: str) -> None:
    # `python -m specbench.report` imports the package before its __main__: a refusal that waited for pandas,
    # matplotlib, seaborn and scipy took 5 s of CPU on 2 cores.
    path = tmp_path / "results.parquet"
    if make == "foreign":
        import pandas as pd

        pd.DataFrame({"a": [1]}).to_parquet(path)
    elif make == "damaged":
        path.write_bytes(b"PAR1 not parquet")
    probe = ("import sys; from specbench.report.__main__ import main; rc = main([sys.argv[1]]); "
             "print(rc, sorted(m for m in ('pandas', 'matplotlib', 'seaborn', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "2 []", done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: ")


def test_an_older_results_file_is_reported_without_library_warnings(tmp_path: Path) -> None:
    import warnings

    from specbench.report import write_report
    from specbench.results.schema import COLUMNS
    from tests.rows import make_row, write_results

    # A file of an early schema: the identifying columns and the cell's own, every later column missing.
    kept = {"schema_version", "cell_id", "status", "method", "num_speculative_tokens", "batch_size", "workload",
            "model", "speedup", "wall_time_s"}
    path = write_results(tmp_path, [make_row("baseline"), make_row("ngram", 2, speedup=1.3)],
                         drop=[c for c in COLUMNS if c not in kept])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report(path)
    assert not [w for w in caught if "fragmented" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_an_hf_source_without_datasets_is_refused_once_before_any_engine(command, no_engine, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         multirun: bool) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed, whatever this machine has
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    overrides = ["workload.source=hf", "workload.dataset=cnn_dailymail", "workload.dataset_config=3.0.0",
                 "workload.text_field=article", "batch_size=1,2" if multirun else "batch_size=1"]
    result = command(sweep(*overrides, multirun=multirun, out=tmp_path))
    assert result.returncode == 2
    assert_refused(result, "workload.source=hf needs the datasets package (pip install datasets)")
    assert result.output.count("needs the datasets package") == 1, result.output
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()


def test_the_plan_takes_a_sweeps_command_line_whole(command, tmp_path: Path) -> None:
    # A sweep's command line, pasted: -m, the output folders, a launcher, a folder of one's own configs.
    (tmp_path / "conf" / "workload").mkdir(parents=True)
    (tmp_path / "conf" / "workload" / "mine.yaml").write_text(
        (REPO / "conf" / "workload" / "creative.yaml").read_text())
    pasted = command(["-m", "specbench.plan", "-m", f"--config-dir={tmp_path / 'conf'}", "workload=mine",
                      "batch_size=1,4", f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                      "hydra/launcher=basic", "hydra.job.chdir=false"])
    assert pasted.returncode == 0, pasted.output
    assert "4 cells: 4 fit, 0 refused" in pasted.output
    assert "hydra" not in pasted.output.split("\n\n")[0]  # no cell is labelled with Hydra's settings
    plain = command(["-m", "specbench.plan", "workload=creative", "batch_size=1,4"])
    assert pasted.output == plain.output  # the same cells, priced the same


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_a_head_the_calibration_left_out_is_timed_before_any_cell_or_the_sweep_is_refused_naming_the_command(
        command, no_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, multirun: bool) -> None:
    # make demo calibrates EAGLE-3's head alone (calibrate --heads eagle3): an EAGLE-1 sweep priced with
    # EAGLE-3's cost per pass would be silently off, so its head is timed and added first (calibrate
    # --add-heads), before any cell's engine; where that fails, the sweep is refused naming the command.
    from specbench import calibrate
    from specbench.analytic import prediction

    profile = tmp_path / "calibrated.yaml"
    profile.write_text("name: cpu\nsettings:\n  heads_left_out: [eagle]\n")
    monkeypatch.setattr(prediction, "calibrated_path", lambda: profile)
    added: list[tuple[Path, list[str]]] = []
    status = 1

    def add_heads(path: Path, methods: list[str], verbose: bool) -> int:
        added.append((path, list(methods)))
        return status

    monkeypatch.setattr(calibrate, "add_heads", add_heads)
    result = command(sweep("method=eagle", "workload=creative", multirun=multirun, out=tmp_path))
    assert added == [(profile, ["eagle"])] and result.returncode == 2
    assert_refused(result, f"the calibrated profile {profile} has no timing of the eagle head",
                   "error: the eagle head could not be timed (above)",
                   "`python -m specbench.calibrate --add-heads eagle` adds it")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()
    # Timed: the sweep plans its cells and goes on to them (the engine no_engine stops, which a single
    # run's job reports as its failure and a multirun raises).
    status = 0
    try:
        command(sweep("method=eagle", "workload=creative", multirun=multirun, out=tmp_path / "again"))
    except AssertionError as exc:
        assert "an engine would start" in str(exc)
    assert added[1:] == [(profile, ["eagle"])]
    assert (tmp_path / "again" / ("sweep" if multirun else "run") / "plan.json").is_file()
    # Priced with a named hardware profile instead, or as heads the calibration timed: nothing to time.
    assert prediction.heads_left_out(["eagle"], {"name": "rtx4090"}) == []
    assert prediction.heads_left_out(["eagle3", "ngram", "baseline"], None) == []


@pytest.mark.parametrize("multirun", [False, True], ids=["single", "multirun"])
def test_a_sweep_outside_a_narrowed_calibration_has_the_rest_timed_before_any_cell_or_is_refused_naming_the_command(
        command, no_engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, multirun: bool) -> None:
    # make demo's calibration measured batch 1 and 4 at prompts of up to 512 tokens, EAGLE-3 at K=4: a sweep
    # at batch 16 would be priced outside what it measured, so the rest of the default calibration is timed
    # first (calibrate --complete); where that fails, the sweep is refused naming the command.
    from specbench import calibrate
    from specbench.analytic import prediction

    profile = tmp_path / "calibrated.yaml"
    profile.write_text("name: cpu\nsettings:\n  narrowed_to: {batch_sizes: [1, 4], prompt_lengths: [16, 512], "
                       "draft_ks: [4]}\n")
    monkeypatch.setattr(prediction, "calibrated_path", lambda: profile)
    completed: list[Path] = []
    monkeypatch.setattr(calibrate, "complete", lambda path, verbose: completed.append(path) or 1)
    result = command(sweep("method=ngram", "workload=creative", "batch_size=16", multirun=multirun, out=tmp_path))
    assert completed == [profile] and result.returncode == 2
    assert_refused(result, f"the calibrated profile {profile} was measured for a narrower sweep (batch 16 above its 4)",
                   "`python -m specbench.calibrate --complete` times it")
    assert not (tmp_path / "sweep" / "cells").exists() and not (tmp_path / "run" / "cells").exists()
    # Inside its range: nothing timed, the sweep goes on to its cells (the engine no_engine stops).
    try:
        command(sweep("method=ngram", "workload=creative", "batch_size=4", multirun=multirun, out=tmp_path / "in"))
    except AssertionError as exc:
        assert "an engine would start" in str(exc)
    assert completed == [profile] and (tmp_path / "in" / ("sweep" if multirun else "run") / "plan.json").is_file()
