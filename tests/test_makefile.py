"""The Makefile's engine choice: given once, else detected, then remembered by the venv (``make -n``: nothing runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory with the Makefile and pyproject.toml, and a bin/ whose nvidia-smi a test decides."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "bin").mkdir()
    return tmp_path


def _gpu(checkout: Path, present: bool) -> None:
    smi = checkout / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H100'\n" if present else "exit 9\n"))
    smi.chmod(0o755)


def _make(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{checkout / 'bin'}:{os.environ['PATH']}")
    env.pop("ENGINE", None)
    return subprocess.run(["make", "-n", *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=60)


def _installs(plan: str) -> str:
    return next(line for line in plan.splitlines() if "-e '.[" in line)


@pytest.mark.parametrize(("gpu", "extra"), [(True, ".[gpu,test]"), (False, ".[cpu,test]")])
def test_a_fresh_machine_gets_the_engine_its_hardware_needs(checkout, gpu, extra):
    _gpu(checkout, gpu)
    done = _make(checkout, "setup")
    assert done.returncode == 0, done.stderr
    assert extra in _installs(done.stdout)


def test_every_target_keeps_the_engine_the_venv_was_set_up_with(checkout):
    _gpu(checkout, False)  # no GPU visible now: the venv's memory wins over detection
    stamp = checkout / ".venv" / ".specbench-setup-gpu"
    stamp.parent.mkdir()
    stamp.touch()
    os.utime(stamp, (0, 0))  # older than the Makefile: make plans the set-up again, as after an edit
    for target in ("setup", "demo", "test"):
        done = _make(checkout, target)
        assert done.returncode == 0, done.stderr
        assert ".[gpu,test]" in _installs(done.stdout)


def test_asking_for_the_other_engine_on_a_set_up_venv_is_refused_with_the_way_out(checkout):
    _gpu(checkout, False)
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".specbench-setup-cpu").touch()
    done = _make(checkout, "demo", "ENGINE=gpu")
    assert done.returncode != 0
    assert "was set up with ENGINE=cpu; run `make clean` first to switch to ENGINE=gpu" in done.stderr
    assert _make(checkout, "clean", "ENGINE=gpu").returncode == 0


def test_an_unknown_engine_is_refused(checkout):
    _gpu(checkout, False)
    done = _make(checkout, "setup", "ENGINE=tpu")
    assert done.returncode != 0 and "ENGINE=tpu: must be cpu or gpu" in done.stderr


def test_the_targets_let_python_cache_the_bytecode_it_compiles(checkout):
    """With PYTHONDONTWRITEBYTECODE set (as some images do), every process would compile vLLM again;
    the targets' commands run without it. A stand-in python reports what it was given."""
    _gpu(checkout, False)
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text('#!/bin/sh\necho "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-unset} $*"\n')
    python.chmod(0o755)
    (checkout / ".venv" / ".specbench-setup-cpu").touch()  # newer than the Makefile: nothing to set up
    env = dict(os.environ, PATH=f"{checkout / 'bin'}:{os.environ['PATH']}", PYTHONDONTWRITEBYTECODE="1",
               SPECBENCH_CACHE=str(checkout / "cache"))
    env.pop("ENGINE", None)
    done = subprocess.run(["make", "demo"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    runs = [line for line in done.stdout.splitlines() if line.startswith("PYTHONDONTWRITEBYTECODE=")]
    assert runs and all(line.startswith("PYTHONDONTWRITEBYTECODE=unset ") for line in runs), done.stdout
    assert any("sweep=cpu_demo" in line for line in runs)


def test_the_demo_calibrates_and_sweeps_in_one_process(checkout):
    # One python process for both (specbench.demo): their engines fork from one server, which imports vLLM
    # once; as two commands each imported it. `make -n` on a set-up venv lists what the demo runs.
    _gpu(checkout, False)
    (checkout / ".venv").mkdir()
    (checkout / ".venv" / ".specbench-setup-cpu").touch()  # newer than the Makefile: nothing to set up
    done = _make(checkout, "demo")
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if "python" in line] == [
        ".venv/bin/python -m specbench.demo sweep=cpu_demo"]


@pytest.mark.parametrize(("lists", "calls"), [
    ("current", ["install -y -qq chromium"]),  # the lists name chromium: no refetch of every list
    ("missing", ["install -y -qq chromium", "update -qq", "install -y -qq chromium"]),
])
def test_the_browser_is_installed_from_apts_lists_and_they_are_refetched_only_when_they_fail(checkout, lists, calls):
    # A stand-in apt-get logs its calls and installs only once its lists are there; the PATH holds nothing else
    # (no chromium), and the user is root.
    bin_dir, log, fetched = checkout / "bin", checkout / "apt.log", checkout / "lists"
    if lists == "current":
        fetched.touch()
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        f'case "$1" in update) : > {fetched};; install) [ -e {fetched} ] || exit 100;; esac\n')
    for tool in ("id", "apt-get"):
        (bin_dir / tool).chmod(0o755)
    make = shutil.which("make")
    assert make is not None
    done = subprocess.run([make, "-s", "browser"], cwd=checkout, env={"PATH": str(bin_dir)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == calls
    assert "will be skipped" not in done.stdout
