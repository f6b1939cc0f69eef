"""``python -m specbench --help``: Hydra's help, configured for a user (conf/config.yaml, hydra.help)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_help_names_the_app_examples_groups_and_companion_commands_and_no_internal_keys(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specbench", "--help"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("specbench: ")
    assert len(re.findall(r"^  python -m specbench (?:-m )?\S+=", text, flags=re.MULTILINE)) == 4  # the examples
    assert "python -m specbench -m method=ngram,eagle num_speculative_tokens=2,4,8" in text
    # The config groups, listed by Hydra from conf/: every method included.
    assert "method: baseline, controlled, draft_model, eagle, eagle3, ngram" in text
    assert re.search(r"^sweep: .*cpu_demo", text, flags=re.MULTILINE)
    for module in ("specbench.plan", "specbench.calibrate", "specbench.capacity", "specbench.analytic.recommend",
                   "specbench.report", "specbench.heads"):
        assert f"python -m {module} " in text
    # Neither the composed config nor Hydra's boilerplate.
    for internal in ("engine_run:", "passes:", "${", "powered by Hydra", "__main__"):
        assert internal not in text


def test_the_defaults_help_states_are_the_configs(compose_cell):
    """Each "(default N)" in the help text (conf/config.yaml, hydra.help) is the composed config's value."""
    source = (Path(__file__).resolve().parents[1] / "conf" / "config.yaml").read_text()
    stated = dict(re.findall(r"^\s+(\w+)\s+.*\(default (\d+)\)\s*$", source, flags=re.MULTILINE))
    assert {"repetitions", "engine_runs", "num_speculative_tokens", "batch_size"} <= set(stated)
    cfg = compose_cell([])
    for key, value in stated.items():
        assert int(cfg[key]) == int(value), f"--help says {key} defaults to {value}; the config says {cfg[key]}"
