"""The shipped EAGLE heads in the real vLLM engine: loaded whole, exact, and accepting drafts.

``specbench.heads verify`` runs in processes forked from the engine fork server
(:func:`specbench.engine.worker_context`), as engine workers are: vLLM is
imported once, not once per head. Each shipped head is loaded once; the check
of a broken head reads what vLLM loaded for the shipped one.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import Sweep
from specbench import engine, models
from specbench.heads.__main__ import main

pytestmark = pytest.mark.engine


def _verify_in_worker(argv: list[str], conn: Connection) -> None:
    """The verify command in this (forked) process; sends back its exit code, what it printed and the drafter's
    tensors as vLLM loaded them (as numpy arrays: a torch tensor would be sent as shared memory, which dies
    with this process)."""
    from specbench.engine import worker

    out, code, loaded = io.StringIO(), -1, {}
    load = worker.loaded_drafter_parameters

    def keep(spec: Any) -> dict[str, Any]:
        found = load(spec)
        loaded.update({name: tensor.numpy() for name, tensor in found.items()})
        return found

    worker.loaded_drafter_parameters = keep
    try:
        with contextlib.redirect_stdout(out):
            code = main(["verify", *argv])
    except BaseException:  # noqa: BLE001 - sent to the test, which fails on it
        out.write(traceback.format_exc())
    conn.send((code, out.getvalue(), loaded))


def verify(*argv: str) -> tuple[int, str, dict[str, Any]]:
    """``python -m specbench.heads verify <argv>``: its exit code, what it printed, and the tensors vLLM loaded."""
    ctx = engine.worker_context(None)
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_verify_in_worker, args=(list(argv), send))
    process.start()
    send.close()
    try:
        return receive.recv()
    except EOFError:
        return -1, "the verify process died without a word", {}
    finally:
        process.join()


@pytest.fixture(scope="module")
def verified() -> Callable[[str], tuple[int, str, dict[str, Any]]]:
    """Each shipped head verified once, on an engine of its own, for every test that reads the outcome."""
    outcomes: dict[str, tuple[int, str, dict[str, Any]]] = {}

    def outcome(method: str) -> tuple[int, str, dict[str, Any]]:
        if method not in outcomes:
            outcomes[method] = verify(f"heads:smollm2-135m-instruct-{method}", "--method", method)
        return outcomes[method]

    return outcome


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_every_tensor_vllm_loads_for_a_shipped_head_comes_from_its_file(verified, method):
    code, out, loaded = verified(method)
    assert code == 0, out[-4000:]
    assert "tensors of the" in out and "equal its file" in out
    assert loaded


def test_verify_catches_a_tensor_missing_from_the_file(tmp_path, verified, monkeypatch):
    """vLLM itself loads such a head silently (EAGLE's load_weights skips its check; the missing tensor keeps its
    random start). The verify command on a head whose file lacks a tensor, vLLM's load replaced by what it loaded
    for the shipped head, under vLLM's own names: what verify compares is what a real load of this head gives,
    the missing tensor's values aside, without an engine of its own."""
    from specbench.engine import worker

    _, _, loaded = verified("eagle")
    shipped = models.shipped_head_path("heads:smollm2-135m-instruct-eagle")
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(shipped / "config.json", broken / "config.json")
    tensors = load_file(str(shipped / "model.safetensors"))
    del tensors["layers.0.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    monkeypatch.setattr(worker, "loaded_drafter_parameters",
                        lambda spec: {name: torch.from_numpy(array) for name, array in loaded.items()})
    monkeypatch.setattr(os, "environ", dict(os.environ))  # verify sets the engine's environment variables
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["verify", str(broken), "--method", "eagle"])
    assert code == 1, out.getvalue()[-4000:]
    assert "model.layers.0.mlp.down_proj.weight: not in the file" in out.getvalue()


def test_eagle_and_eagle3_run_exact_with_accepted_drafts(reference_sweep: Sweep):
    results = reference_sweep.results
    spec = results[results["method"].isin(["eagle", "eagle3"])]
    assert sorted(spec["method"]) == ["eagle", "eagle", "eagle3", "eagle3"]  # batch sizes 1 and 2
    assert (spec["status"] == "ok").all() and spec["exact_match"].all()
    assert (spec["acceptance_length"] > 1.0).all()
