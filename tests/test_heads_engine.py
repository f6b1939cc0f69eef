"""The shipped EAGLE heads in the real vLLM engine: loaded whole, exact, and accepting drafts.

``specbench.heads verify`` runs in processes forked from the engine fork server
(:func:`specbench.engine.worker_context`), as engine workers are: vLLM is
imported once, not once per head.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import traceback
from multiprocessing.connection import Connection

import pytest
from safetensors.torch import load_file, save_file

from conftest import Sweep
from specbench import engine, models
from specbench.heads.__main__ import main

pytestmark = pytest.mark.engine


def _verify_in_worker(argv: list[str], conn: Connection) -> None:
    """The verify command in this (forked) process; sends back its exit code and what it printed."""
    out, code = io.StringIO(), -1
    try:
        with contextlib.redirect_stdout(out):
            code = main(["verify", *argv])
    except BaseException:  # noqa: BLE001 - sent to the test, which fails on it
        out.write(traceback.format_exc())
    conn.send((code, out.getvalue()))


def verify(*argv: str) -> tuple[int, str]:
    """``python -m specbench.heads verify <argv>``: its exit code and what it printed."""
    ctx = engine.worker_context(None)
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_verify_in_worker, args=(list(argv), send))
    process.start()
    send.close()
    try:
        return receive.recv()
    except EOFError:
        return -1, "the verify process died without a word"
    finally:
        process.join()


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_every_tensor_vllm_loads_for_a_shipped_head_comes_from_its_file(method):
    code, out = verify(f"heads:smollm2-135m-instruct-{method}", "--method", method)
    assert code == 0, out[-4000:]
    assert "tensors of the" in out and "equal its file" in out


def test_verify_catches_a_tensor_missing_from_the_file(tmp_path):
    """vLLM itself loads such a head silently (EAGLE's load_weights skips its check)."""
    shipped = models.shipped_head_path("heads:smollm2-135m-instruct-eagle")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(shipped / "config.json", broken / "config.json")
    tensors = load_file(str(shipped / "model.safetensors"))
    del tensors["layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    code, out = verify(str(broken), "--method", "eagle")
    assert code == 1, out[-4000:]
    assert "model.layers.0.mlp.down_proj.weight: not in the file" in out


def test_eagle_and_eagle3_run_exact_with_accepted_drafts(reference_sweep: Sweep):
    results = reference_sweep.results
    spec = results[results["method"].isin(["eagle", "eagle3"])]
    assert sorted(spec["method"]) == ["eagle", "eagle", "eagle3", "eagle3"]  # batch sizes 1 and 2
    assert (spec["status"] == "ok").all() and spec["exact_match"].all()
    assert (spec["acceptance_length"] > 1.0).all()
