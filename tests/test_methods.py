"""The method registry: one entry (plus its conf/method/<name>.yaml) makes a method known everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbench import config, methods
from specbench.analytic import checks

TOY_YAML = """\
# Prompt lookup over longer n-grams: a toy method added the way the README says.
name: toy
speculative_config:
  method: ngram
  num_speculative_tokens: ${num_speculative_tokens}
  prompt_lookup_min: 3
  prompt_lookup_max: 8
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry, restored after the test."""
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))


def test_every_registered_method_has_a_config_and_a_price_the_theory_knows():
    conf = Path(config.__file__).parent / "conf" / "method"
    for name in methods.names():
        assert (conf / f"{name}.yaml").is_file(), name
        assert methods.priced_as(name) in checks.METHODS, name
    assert {p.stem for p in conf.glob("*.yaml")} == set(methods.names())


def test_each_method_specific_key_is_typed_and_read_by_a_registered_method():
    conf = Path(config.__file__).parent / "conf" / "method"
    fields = set(methods.MethodSchema.__dataclass_fields__) - {"name", "speculative_config"}
    assert fields == set(methods.OWN_KEYS)
    for key, reader in methods.OWN_KEYS.items():
        assert methods.get(reader) is not None, reader
        assert f"\n{key}:" in "\n" + (conf / f"{reader}.yaml").read_text(), (key, reader)


def test_a_toy_method_joins_validation_pricing_and_the_engine_spec(registry, compose_cell, tmp_path):
    (tmp_path / "method").mkdir()
    (tmp_path / "method" / "toy.yaml").write_text(TOY_YAML)
    overrides = ["method=toy", "num_speculative_tokens=3", f"hydra.searchpath=[file://{tmp_path}]"]
    unregistered = config.validate(compose_cell(overrides))
    assert any("method='toy' is not one of baseline, ngram" in e for e in unregistered), unregistered

    methods.register(methods.Method("toy", priced_as="ngram"))
    cfg = compose_cell(overrides)
    assert config.validate(cfg) == []
    spec = config.cell_from_config(cfg).engine_spec()
    assert spec.speculative_config == {"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 3, "prompt_lookup_max": 8}
    assert methods.priced_as("toy") == "ngram"


def test_a_method_with_a_head_checkpoint_is_checked_before_any_engine(registry, compose_cell, tmp_path):
    methods.register(methods.Method("eagle", priced_as="eagle", checkpoint=None))
    assert config.validate(compose_cell(["method=eagle", f"model.eagle={tmp_path}/none"])) == []
    methods.register(methods.Method("eagle", priced_as="eagle", checkpoint="head"))
    errors = config.validate(compose_cell(["method=eagle", f"model.eagle={tmp_path}/none"]))
    assert len(errors) == 1 and "method=eagle (model.eagle)" in errors[0], errors
