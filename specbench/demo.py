"""``python -m specbench.demo [overrides]``: what ``make demo`` runs, in one process.

First this machine's hardware profile, unless one is cached
(:func:`specbench.analytic.prediction.calibrated_path`): ``python -m
specbench.calibrate --rounds 1`` (one pass over the grid; ``calibrate`` alone
takes two) narrowed to what the sweep prices (:func:`calibrate_args`): ``make
demo``'s times batch 1 and 4 at prompts of 16 and 512 tokens (4 grid points of
8) and the EAGLE-3 head at K=4 alone (one engine of two), EAGLE-1 not at all.
A later sweep outside that range has the rest timed first, as ``calibrate
--complete`` (or ``--add-heads eagle``) does. Then the sweep, ``python -m specbench <overrides>`` (``make demo``
passes ``sweep=cpu_demo``). Both start their engines from one fork server, the
process that imports vLLM once (:func:`specbench.engine.worker_context`): as two
commands, each imported it (about 10 s on 2 cores) and started Python, Hydra
and transformers again.

The overrides are checked first, every grid point as the sweeper checks it
(:func:`specbench.sweep.plan_cells`): a bad one is refused in one line, exit 2,
before the calibration's engines load. Hydra's information flags (``--help``,
``--cfg`` ...) go to ``python -m specbench`` unchanged, with no calibration. A
calibration that fails says so and the sweep still runs, its report without
the model's curves. The exit status is the sweep's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from hydra import initialize_config_module

from specbench import calibrate
from specbench.analytic import prediction
from specbench.config import Cell, longest_prompt
from specbench.plan import GridComposer, grid_jobs
from specbench.sweep import plan_cells

# make demo's calibration: one round (specbench/calibrate.py: its predicted speedups within 1-7% of two rounds').
CALIBRATE_ARGS = ("--rounds", "1")
CALIBRATION_FAILED = "calibration failed: the report will show no model curves"
# Hydra's flags that print something and start nothing.
INFO_FLAGS = frozenset({"--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc"})


def grid_cells(overrides: Sequence[str]) -> list[Cell]:
    """The cells of the sweep these overrides make, every grid point composed and validated as the sweeper
    does (each workload's prompts read once); raises what the sweep would refuse them with (Hydra's own
    message, or the sweeper's ConfigError, names the bad override). Flags (``-m``) are left to Hydra."""
    jobs = grid_jobs([o for o in overrides if not o.startswith("-")])
    with initialize_config_module(config_module="specbench.conf", version_base="1.3"):
        return [p.cell for p in plan_cells(jobs, GridComposer())]


def _up_to(defaults: Sequence[int], needed: int) -> list[int]:
    """The defaults up to the first that reaches ``needed`` (all of them if none does), at least two: the
    calibration's grid spans the sweep's range, and a fit needs two of each."""
    kept = [v for v in sorted(defaults) if v < needed]
    return sorted(defaults)[:max(len(kept) + 1, 2)]


def calibrate_args(cells: Sequence[Cell]) -> list[str]:
    """The calibration of a grid of ``cells``: :data:`CALIBRATE_ARGS`, narrowed to what the grid prices
    (:mod:`specbench.calibrate`'s ``settings.narrowed_to``): the default grid's batch sizes and prompt lengths
    up to the first that reaches the sweep's largest batch and longest prompt, and only the EAGLE heads the
    grid runs, each at the grid's K alone (an engine per K). A later sweep outside that range, or of a head
    left out, has what it lacks timed first (:func:`specbench.calibrate.time_missing`)."""
    methods = list(dict.fromkeys(c.method for c in cells))
    heads = [m for m in calibrate.DRAFT_METHODS if m in methods]
    longest = max(longest_prompt(c.config) or max(calibrate.DEFAULT_PROMPT_LENGTHS) for c in cells)
    args = [*CALIBRATE_ARGS, "--heads", ",".join(heads) or "none",
            "--batch-sizes", ",".join(map(str, _up_to(calibrate.DEFAULT_BATCH_SIZES, max(c.batch_size for c in cells)))),
            "--prompt-lengths", ",".join(map(str, _up_to(calibrate.DEFAULT_PROMPT_LENGTHS, longest)))]
    if ks := sorted({c.k for c in cells if c.method in heads}):
        args += ["--draft-ks", ",".join(map(str, ks))]
    return args


def _verbose(overrides: Sequence[str]) -> bool:
    """Whether the overrides ask the sweep to stream vLLM's log (``verbose=true``; the last one wins)."""
    values = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == "verbose" and "=" in o]
    return bool(values) and values[-1].strip().lower() in ("true", "yes", "on", "1")


def _sweep(overrides: Sequence[str]) -> int:
    """``python -m specbench <overrides>`` in this process; its exit status."""
    from specbench.__main__ import main as specbench_main

    argv = sys.argv
    sys.argv = ["specbench", *overrides]  # Hydra's entry point reads its overrides from the command line
    try:
        specbench_main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return 0


def main(argv: Sequence[str] | None = None, *, calibrate_main: Callable[[list[str]], int] = calibrate.main,
         sweep: Callable[[Sequence[str]], int] = _sweep) -> int:
    """Calibrate if no profile is cached (the overrides checked first: 2 if refused), then sweep; the
    sweep's exit status.

    ``calibrate_main`` and ``sweep``: the two commands (:func:`specbench.calibrate.main` and
    ``python -m specbench``), given as arguments so that a test can follow the order without engines.
    """
    overrides = list(sys.argv[1:] if argv is None else argv)
    if INFO_FLAGS.isdisjoint(overrides) and not prediction.calibrated_path().is_file():
        try:
            cells = grid_cells(overrides)
        except Exception as exc:  # refused: said in one line before the calibration's engines load
            print(f"error: {exc}", file=sys.stderr)
            return 2
        # The fork server keeps the output of the first command that starts it: a verbose sweep's engines
        # stream to the terminal only if the calibration's did.
        verbose = ["--verbose"] if _verbose(overrides) else []
        if calibrate_main([*calibrate_args(cells), *verbose]) != 0:
            print(CALIBRATION_FAILED, file=sys.stderr, flush=True)
    return sweep(overrides)


if __name__ == "__main__":
    sys.exit(main())
