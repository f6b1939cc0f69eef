"""The token lengths of the prompts a cell sends, known before any engine or torch loads.

Validation prices a cell's memory with them and refuses a workload that cannot
supply ``num_prompts`` prompts within ``max_prompt_tokens``. The run tokenizes
with transformers' ``AutoTokenizer``, which imports torch (about 10 s on this
project's 2-core machine): too slow for a check that every sweep and the plan
command make. :class:`FileTokenizer` reads the same ``tokenizer.json`` with
the ``tokenizers`` library and renders the chat template with transformers'
own renderer, which imports no torch (about 1 s), and gives the run's token
ids (a test compares them on every built-in prompt).

Only a tokenizer already on disk is read (a local or prepared checkpoint
folder, or the Hugging Face cache): validation never downloads. Without one,
each prompt is bounded from its characters instead (:func:`token_bound`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from specbench import models
from specbench.workloads.sources import (
    ALL_PROMPTS,
    WorkloadError,
    hf_problem,
    load_prompts,
    load_workload,
    validate_workload_config,
)

__all__ = [
    "CHAT_TEMPLATE_TOKENS",
    "FileTokenizer",
    "PromptLengths",
    "check_source",
    "local_tokenizer",
    "prompt_lengths",
    "token_bound",
]

# Named special tokens a chat template may refer to (transformers passes
# these, as strings, to every template it renders).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Tokens a chat template adds around one user message, for the bound without
# a tokenizer: SmolLM2's adds 30 (most of them its default system prompt);
# room for a longer one.
CHAT_TEMPLATE_TOKENS = 64


class FileTokenizer:
    """A model's tokenizer read from its files: ``tokenizer.json``, ``tokenizer_config.json``, the chat template.

    Implements the two methods of :class:`specbench.workloads.Tokenizer` the
    way a transformers fast tokenizer does: ``encode`` through the same
    ``tokenizers`` pipeline, ``apply_chat_template`` by rendering with
    transformers' renderer (with the named special tokens, as transformers
    passes them) and encoding the text without adding special tokens.
    """

    def __init__(self, folder: Path) -> None:
        import tokenizers

        self.folder = folder
        self._tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self._special_tokens = {
            name: value["content"] if isinstance(value, Mapping) else str(value)
            for name in _SPECIAL_TOKENS if (value := config.get(name)) is not None
        }
        self.chat_template = _chat_template(folder, config)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize plain text."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> list[int]:
        """Render ``conversation`` with the model's chat template and tokenize it (``tokenize=True`` only)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        if self.chat_template is None:
            raise ValueError(f"{self.folder} has no chat template")
        if not kwargs.pop("tokenize", True):
            raise ValueError("FileTokenizer.apply_chat_template only tokenizes")
        kwargs.pop("return_dict", None)
        rendered, _ = render_jinja_template(
            conversations=[conversation], chat_template=self.chat_template, **{**self._special_tokens, **kwargs}
        )
        return self.encode(rendered[0], add_special_tokens=False)


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: ``chat_template.jinja`` (transformers' own file), else tokenizer_config's."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


@lru_cache(maxsize=8)
def local_tokenizer(model_path: str) -> FileTokenizer | None:
    """The model's tokenizer if its files are on disk already; None otherwise (or if they do not read).

    ``model_path`` is a model reference (:func:`specbench.models.resolve`): a
    local or embedded checkpoint folder, or a hub id found in the Hugging
    Face cache. An embedded checkpoint not yet prepared is not prepared here.
    """
    try:
        folder = Path(models.resolve(model_path, prepare=False)).expanduser()
        if not (folder / "tokenizer.json").is_file():
            cached = _hub_cache_folder(model_path)
            if cached is None:
                return None
            folder = cached
        return FileTokenizer(folder)
    except Exception:  # noqa: BLE001 - files the tokenizers library cannot read, a missing package, ...
        # The run reads (or reports) such a tokenizer with transformers;
        # validation bounds the prompts from their characters instead.
        return None


def _hub_cache_folder(reference: str) -> Path | None:
    """The cached snapshot folder holding a hub model's tokenizer.json, without any network access."""
    if reference.startswith((".", "/", "~")) or reference.count("/") != 1 or os.path.exists(reference):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(reference, "tokenizer.json")
    return Path(found).parent if isinstance(found, str) else None


def token_bound(text: str, chat_template: bool) -> int:
    """At most how many tokens ``text`` becomes, from its characters alone.

    Byte-level BPE (and byte-fallback SentencePiece) tokenizers make at most
    one token per UTF-8 byte; add the few special tokens of plain encoding,
    or :data:`CHAT_TEMPLATE_TOKENS` for a chat template.
    """
    return len(text.encode("utf-8")) + (CHAT_TEMPLATE_TOKENS if chat_template else 4)


@dataclass(frozen=True)
class PromptLengths:
    """The token lengths of the prompts a cell sends.

    Attributes:
        tokens: one per prompt the cell submits (before cycling to whole
            batches): measured, in submission order, when ``exact``; else an
            upper bound of each of the longest prompts the selection could
            draw, capped at ``max_prompt_tokens`` (longer ones are skipped).
        exact: measured with the model's tokenizer, as the run will.
    """

    tokens: tuple[int, ...]
    exact: bool


def check_source(cfg: Mapping[str, Any], model_path: str) -> list[str]:
    """Read a local source's prompts now and report what would stop a cell sending them.

    Lets a sweep refuse, before any engine loads, what would otherwise fail
    every cell of the workload: a malformed file, or (where the model's
    tokenizer is on disk, see :func:`prompt_lengths`) fewer than
    ``num_prompts`` prompts within ``max_prompt_tokens``, with the counts.
    ``hf`` datasets are not read here (that may mean a download), only checked
    for the package that reads them (:func:`hf_problem`); a config
    that :func:`validate_workload_config` refuses is left to it.

    Returns:
        The :class:`WorkloadError` message, or nothing when the prompts load.
    """
    if not isinstance(cfg, Mapping) or validate_workload_config(cfg):
        return []
    if cfg.get("source") == "hf":
        problem = hf_problem(cfg)
        return [problem] if problem else []
    try:
        prompt_lengths(cfg, model_path)
    except WorkloadError as exc:
        return [str(exc)]
    return []


def prompt_lengths(cfg: Mapping[str, Any], model_path: str) -> PromptLengths | None:
    """The token lengths of the prompts a cell of this workload and model sends.

    Measured with :func:`local_tokenizer` and the run's own selection
    (:func:`specbench.workloads.load_workload`) where the tokenizer is on disk,
    else bounded with :func:`token_bound`. None for an ``hf`` source (not
    read before the first engine: that may mean a download).

    Raises:
        WorkloadError: the prompts do not load, or (measured) fewer than
            ``num_prompts`` of them fit ``max_prompt_tokens``.
    """
    if cfg.get("source") == "hf":
        return None
    found = _lengths(json.dumps(dict(cfg), sort_keys=True, default=str), _on_disk(model_path))
    if isinstance(found, str):
        raise WorkloadError(found)
    return found


def _on_disk(model_path: str) -> str:
    """The folder a model reference stands for where it is on disk, else the reference: the answers
    cached per model change once a checkpoint is downloaded (:mod:`specbench.hub`) or prepared."""
    try:
        return models.resolve(model_path, prepare=False)
    except ValueError:  # an unknown embedded or shipped name: validation names it
        return model_path


@lru_cache(maxsize=16)
def _lengths(workload_json: str, model_path: str) -> PromptLengths | str:
    """prompt_lengths' answer, or its refusal's message.

    Cached: validation asks once per cell of a sweep, and the answer (a
    refusal included) is the same for every cell of a workload and model.
    """
    cfg = json.loads(workload_json)
    try:
        measured = _measure(cfg, local_tokenizer(model_path))
        if measured is not None:
            return measured
        prompts, _ = load_prompts(cfg)
    except WorkloadError as exc:
        return str(exc)
    bounds = sorted((min(token_bound(p.text, cfg["chat_template"]), cfg["max_prompt_tokens"]) for p in prompts),
                    reverse=True)
    count = len(bounds) if cfg["num_prompts"] == ALL_PROMPTS else min(int(cfg["num_prompts"]), len(bounds))
    return PromptLengths(tuple(bounds[:count]), exact=False)


def _measure(cfg: Mapping[str, Any], tokenizer: FileTokenizer | None) -> PromptLengths | None:
    """The selected prompts' token lengths, as the run will select and tokenize them; None if not measurable here."""
    if tokenizer is None or (cfg["chat_template"] and tokenizer.chat_template is None):
        return None
    try:
        workload = load_workload(cfg, tokenizer)
    except WorkloadError:
        raise
    except Exception:  # noqa: BLE001 - a chat template that needs more than transformers' renderer gives it
        return None
    return PromptLengths(tuple(len(ids) for ids in workload.token_ids), exact=True)
