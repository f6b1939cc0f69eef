"""``python -m specbench.gpu_timing`` on the CPU: a tiny decoder timed eagerly (no CUDA here, so no
CUDA graphs and PyTorch's default attention kernel: the code path runs, the figures are not a
GPU's), its table fitted into a profile the sweeps can load."""

from __future__ import annotations

import json

import pytest
import yaml

from specbench import gpu_timing
from specbench.analytic import prediction, profiles

TINY = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}


def test_time_then_fit_a_tiny_model_on_the_cpu(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    table_path = tmp_path / "passes.json"
    assert gpu_timing.main(["time", "--model", str(config), "--out", str(table_path), "--reps", "3",
                            "--grid", "16:1,4,16;64:1,4", "--tokens-per-seq", "1,2,3"]) == 0
    assert "no CUDA device: timing eagerly" in capsys.readouterr().out
    table = json.loads(table_path.read_text())
    # Every (C, B, q) of the grid, and a head step per (C, B).
    assert sorted((p["C"], p["B"], p["q"]) for p in table["passes"]) == sorted(
        (c, b, q) for c, bs in ((16, (1, 4, 16)), (64, (1, 4))) for b in bs for q in (1, 2, 3))
    assert len(table["head"]["steps"]) == 5
    assert all(p["min_s"] <= p["median_s"] and p["median_s"] > 0 for p in table["passes"])
    assert table["copy_bandwidth_Bps"] > 1e8 and table["matmul_flops"] > 1e8
    assert "eager" in table["timing"]
    # The weights the table says it timed are the ones the model profile counts (qkv biases, untied head).
    model = profiles.ModelProfile.from_config_json(gpu_timing.table_shape(table).config())
    assert table["weight_bytes"] == pytest.approx(model.weight_bytes * 2, rel=1e-9)  # float32 here, bf16 there
    out = tmp_path / "profile.yaml"
    assert gpu_timing.main(["fit", str(table_path), "--name", "tiny-cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "device copy" in printed and "per layer and pass" in printed
    doc = yaml.safe_load(out.read_text())
    assert doc["device_rates"]["copy_bandwidth_gbps"] > 0 and isinstance(doc["fit_warnings"], list)
    fitted = prediction.load_hardware_file(out).profile
    assert fitted.name == "tiny-cpu" and fitted.memory_bandwidth <= 1.05 * table["copy_bandwidth_Bps"] * (1 + 1e-6)
    assert fitted.peak_flops <= 1.05 * table["matmul_flops"] * (1 + 1e-6)


def test_the_shared_h200_table_fits_from_the_command_line(tmp_path, capsys):
    data = "tests/data/gpu-h200/"
    out = tmp_path / "h200.yaml"
    assert gpu_timing.main(["fit", data + "verify-passes-qwen2.5-7b-shape.json", "--head-steps",
                            data + "eagle3-head-steps-qwen2.5-7b-shape.json", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["memory_bandwidth_gbps"] <= 4261.2 * 1.05 and doc["peak_tflops"] <= 795.7 * 1.05
    assert 0.05 < doc["per_layer_overhead_ms"] < 0.12 and doc["draft_overhead_ms"] >= 0


@pytest.mark.parametrize(("argv", "key"), [
    (["time", "--model", "x.json", "--out", "o.json", "--grid", "512"], "--grid"),
    (["time", "--model", "x.json", "--out", "o.json", "--tokens-per-seq", "0"], "--tokens-per-seq"),
    (["time", "--model", "/nonexistent/config.json", "--out", "o.json"], "--model"),
])
def test_bad_input_is_refused_with_the_key(argv, key, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert gpu_timing.main(argv) == 2
    assert key in capsys.readouterr().err
