"""``python -m specbench.demo [overrides]``: what ``make demo`` runs, in one process.

First this machine's hardware profile, unless one is cached
(:func:`specbench.analytic.prediction.calibrated_path`): ``python -m
specbench.calibrate --rounds 1`` (one pass over the grid; ``calibrate`` alone
takes two). Then the sweep, ``python -m specbench <overrides>`` (``make demo``
passes ``sweep=cpu_demo``). Both start their engines from one fork server, the
process that imports vLLM once (:func:`specbench.engine.worker_context`): as two
commands, each imported it (about 10 s on 2 cores) and started Python, Hydra
and transformers again.

A calibration that fails says so and the sweep still runs, its report without
the model's curves. The exit status is the sweep's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from specbench import calibrate
from specbench.analytic import prediction

# make demo's calibration: one round (specbench/calibrate.py: its predicted speedups within 1-7% of two rounds').
CALIBRATE_ARGS = ("--rounds", "1")
CALIBRATION_FAILED = "calibration failed: the report will show no model curves"


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
    """Calibrate if no profile is cached, then sweep; the sweep's exit status.

    ``calibrate_main`` and ``sweep``: the two commands (:func:`specbench.calibrate.main` and
    ``python -m specbench``), given as arguments so that a test can follow the order without engines.
    """
    overrides = list(sys.argv[1:] if argv is None else argv)
    if not prediction.calibrated_path().is_file():
        if calibrate_main(list(CALIBRATE_ARGS)) != 0:
            print(CALIBRATION_FAILED, file=sys.stderr, flush=True)
    return sweep(overrides)


if __name__ == "__main__":
    sys.exit(main())
