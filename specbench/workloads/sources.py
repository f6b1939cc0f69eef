"""Turn a workload config into the exact token ids a cell submits.

A workload names a kind of text (the built-in ``summarize``, ``rag`` and
``creative``, or a user's own name) and a source of prompts for it:

- ``builtin``: the JSON-lines files shipped in ``specbench/workloads/data``;
- ``spec_bench``: a Spec-Bench ``question.jsonl``, filtered to the categories
  that match the workload (or to an explicit ``categories`` list);
- ``jsonl``: any JSON-lines file, the prompt read from ``prompt_field``;
- ``hf``: a Hugging Face dataset, each row's ``text_field`` after an
  ``instruction``.

:func:`load_workload` then measures every prompt with the model's tokenizer,
skips (and counts) those longer than ``max_prompt_tokens`` instead of
truncating them, because a truncated article is a different workload, and
selects ``num_prompts`` of the rest (``all`` keeps every one): by default a
draw with a seeded ``random.Random``, so that every cell of a sweep sees the
same requests in the same order; with ``selection: first``, the first ones in
the order the source lists them, so that a paper can cite exactly which
prompts (or a whole Spec-Bench category) it ran.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import os
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Protocol

from omegaconf import MISSING

from specbench.environ import patched_environ

__all__ = [
    "NAMES",
    "SELECTIONS",
    "SOURCE_KEYS",
    "SOURCES",
    "SPEC_BENCH_CATEGORIES",
    "SPEC_BENCH_WORKLOAD_CATEGORIES",
    "Prompt",
    "Tokenizer",
    "Workload",
    "WorkloadError",
    "WorkloadSchema",
    "load_prompts",
    "load_workload",
    "validate_workload_config",
]

# The built-in workloads: each has its file in data/ and its Spec-Bench categories.
NAMES = ("summarize", "rag", "creative")
# A workload's name is part of every cell's file name (Cell.cell_id).
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
SOURCES = ("builtin", "spec_bench", "jsonl", "hf")
# How num_prompts prompts are chosen: a seeded random draw, or the source's own order.
SELECTIONS = ("random", "first")
ALL_PROMPTS = "all"  # num_prompts: every prompt within max_prompt_tokens
_FILE_SOURCES = ("spec_bench", "jsonl")

# The categories of Spec-Bench's question.jsonl: MT-bench's eight, then the
# five Spec-Bench adds. Only some resemble a specbench workload; the rest can
# still be chosen through an explicit `categories` list.
SPEC_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
)

# Spec-Bench categories whose answers behave like each workload: summaries and
# RAG answers echo their input, writing and role-play produce novel text.
SPEC_BENCH_WORKLOAD_CATEGORIES: dict[str, tuple[str, ...]] = {
    "summarize": ("summarization",),
    "rag": ("rag",),
    "creative": ("writing", "roleplay"),
}

_OFFLINE_ALTERNATIVES = (
    "offline alternatives: workload.source=jsonl or workload.source=spec_bench "
    "with a local file in workload.path"
)


@dataclass
class WorkloadSchema:
    """The keys of a ``workload`` config and their types (conf/workload/*.yaml hold the values).

    Hydra checks a composed workload against it, so a misspelt key in a
    user's own workload file, or ``workload.max_tokens=many``, is refused
    with the key's full path. :func:`validate_workload_config` then checks
    what types cannot say (names, ranges, files). The keys after
    ``chat_template`` are read by one source each and stay null otherwise;
    unset, they are not part of a cell's identity (:data:`SOURCE_KEYS`).
    """

    name: str = MISSING
    source: str = MISSING
    path: Optional[str] = None
    num_prompts: Any = MISSING  # an integer, or "all"
    selection: str = MISSING
    seed: int = MISSING
    max_tokens: int = MISSING
    max_prompt_tokens: int = MISSING
    chat_template: bool = MISSING
    # jsonl and hf: which fields of a record hold the prompt and its id
    prompt_field: Optional[str] = None
    id_field: Optional[str] = None
    # spec_bench: the turn of each question, and the categories (default: the workload's own)
    turn: Optional[int] = None
    categories: Optional[List[str]] = None
    # hf: the dataset, its config and split, the text field and the instruction put before it
    dataset: Optional[str] = None
    dataset_config: Optional[str] = None
    split: Optional[str] = None
    text_field: Optional[str] = None
    instruction: Optional[str] = None


# WorkloadSchema's source-specific keys: left null, a cell's identity omits them.
SOURCE_KEYS = (
    "prompt_field", "id_field", "turn", "categories",
    "dataset", "dataset_config", "split", "text_field", "instruction",
)


class WorkloadError(ValueError):
    """A workload config or its source cannot produce the requested prompts.

    The message names the key, file and line at fault and what is allowed.
    """


@dataclass(frozen=True)
class Prompt:
    """One request's user message.

    Attributes:
        id: stable identifier from the source (file id, Spec-Bench
            ``question_id``, dataset id, or the 1-based line / 0-based row
            number when the source has none).
        text: the user message, before any chat template.
        output_tokens: the output length the record names (jsonl: its
            ``output_tokens`` field, as ``vllm bench serve``'s custom dataset);
            None where it names none. A serving cell sends it with
            ``load.output_len=dataset``.
    """

    id: str
    text: str
    output_tokens: int | None = None


@dataclass(frozen=True)
class Workload:
    """The prompts a cell submits, already tokenized.

    Attributes:
        name: workload name (``summarize``, ``rag``, ``creative`` or a user's own).
        source: where the prompts came from (``builtin``, ``spec_bench``,
            ``jsonl`` or ``hf``).
        prompts: the selected prompts, in submission order.
        token_ids: each prompt's token ids, same order, with the chat template
            applied when the config asks for it.
        skipped_too_long: prompts of the source that were dropped because
            they exceed ``max_prompt_tokens``.
        source_fingerprint: sha256 hex digest of the source file's bytes
            (the built-in file for ``builtin``), ``''`` for ``hf``.
    """

    name: str
    source: str
    prompts: tuple[Prompt, ...]
    token_ids: tuple[tuple[int, ...], ...]
    skipped_too_long: int
    source_fingerprint: str

    @property
    def output_tokens(self) -> tuple[int | None, ...]:
        """Each selected prompt's own output length from its record (None: none), in submission order."""
        return tuple(prompt.output_tokens for prompt in self.prompts)

    @property
    def prompt_ids(self) -> list[str]:
        """The selected prompts' ids, in submission order."""
        return [prompt.id for prompt in self.prompts]


class Tokenizer(Protocol):
    """The two methods of a Hugging Face tokenizer that a workload uses."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
        """Render and tokenize a conversation with the model's chat template."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Tokenize plain text."""
        ...


def validate_workload_config(cfg: Mapping[str, Any]) -> list[str]:
    """Check a workload config without a tokenizer, engine or network.

    Checks the name (one of :data:`NAMES` where it selects the prompts: the
    built-in source, or Spec-Bench without ``categories``; any file-name-safe
    name otherwise) and source, that file sources have a ``path`` that
    exists (and that other sources have none), the numeric limits, and the
    types of the optional keys. Source contents are not read.

    Args:
        cfg: the ``workload`` config group, an OmegaConf ``DictConfig`` or
            any mapping.

    Returns:
        One message per problem, e.g. ``"workload.source='foo' is not one of
        builtin, spec_bench, jsonl, hf"``; empty when the config is usable.
    """
    if not isinstance(cfg, Mapping):
        return [f"workload config must be a mapping, got {type(cfg).__name__}"]
    problems: list[str] = []

    name = cfg.get("name")
    source = cfg.get("source")
    if source == "builtin" and name not in NAMES:
        problems.append(f"workload.name={name!r} is not one of {', '.join(NAMES)} (the built-in sets)")
    elif source == "spec_bench" and cfg.get("categories") is None and name not in NAMES:
        problems.append(
            f"workload.name={name!r} is not one of {', '.join(NAMES)}, whose Spec-Bench categories "
            f"are known: set workload.categories for a workload of your own"
        )
    elif not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
        problems.append(
            f"workload.name={name!r} must be letters, digits, _ and - (it names every cell's files)"
        )
    if source not in SOURCES:
        problems.append(f"workload.source={source!r} is not one of {', '.join(SOURCES)}")

    path = cfg.get("path")
    if source in _FILE_SOURCES:
        if path is None or path == "":
            problems.append(
                f"workload.path is required for workload.source={source} (a JSON-lines file)"
            )
        elif not isinstance(path, (str, os.PathLike)):
            problems.append(f"workload.path={path!r} must be a file path")
        elif not Path(path).expanduser().is_file():
            problems.append(f"workload.path={str(path)!r} does not exist or is not a file")
    elif path is not None and source in SOURCES:
        # A path next to another source is almost always a forgotten
        # `workload.source=...` override; ignoring it would benchmark the wrong prompts.
        problems.append(
            f"workload.path={path!r} is only read for workload.source=spec_bench or jsonl, "
            f"not {source}; set workload.path=null or change workload.source"
        )

    num_prompts = cfg.get("num_prompts")
    if num_prompts != ALL_PROMPTS and (not _is_int(num_prompts) or num_prompts < 1):
        problems.append(f"workload.num_prompts={num_prompts!r} must be an integer >= 1 or {ALL_PROMPTS}")
    for key in ("max_tokens", "max_prompt_tokens"):
        value = cfg.get(key)
        if not _is_int(value) or value < 1:
            problems.append(f"workload.{key}={value!r} must be an integer >= 1")
    selection = cfg.get("selection", "random")
    if selection not in SELECTIONS:
        problems.append(
            f"workload.selection={selection!r} is not one of {', '.join(SELECTIONS)} "
            f"(random: a draw seeded by workload.seed; first: the source's own order)"
        )
    seed = cfg.get("seed")
    if not _is_int(seed):
        problems.append(f"workload.seed={seed!r} must be an integer")
    chat_template = cfg.get("chat_template")
    if not isinstance(chat_template, bool):
        problems.append(f"workload.chat_template={chat_template!r} must be true or false")

    for key in ("prompt_field", "id_field", "split", "instruction", "dataset_config"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, str):
            problems.append(f"workload.{key}={value!r} must be a string")
    turn = cfg.get("turn")
    if turn is not None and (not _is_int(turn) or turn < 0):
        problems.append(f"workload.turn={turn!r} must be an integer >= 0")
    categories = cfg.get("categories")
    if categories is not None and (
        isinstance(categories, str)
        or not isinstance(categories, Sequence)
        or not categories
        or not all(isinstance(c, str) and c for c in categories)
    ):
        problems.append(
            f"workload.categories={_plain(categories)!r} must be null or a non-empty list of "
            f"Spec-Bench category names ({', '.join(SPEC_BENCH_CATEGORIES)})"
        )
    if source == "hf":
        for key, example in (("dataset", "cnn_dailymail"), ("text_field", "article")):
            value = cfg.get(key)
            if not isinstance(value, str) or not value:
                problems.append(
                    f"workload.{key}={value!r} must be a non-empty string for workload.source=hf "
                    f"(e.g. {example})"
                )
    return problems


def load_prompts(cfg: Mapping[str, Any]) -> tuple[list[Prompt], str]:
    """Read every prompt the configured source offers for this workload.

    Args:
        cfg: the ``workload`` config group.

    Returns:
        The prompts in source order, before any length filter or selection,
        and the sha256 hex digest of the source bytes (``''`` for ``hf``).

    Raises:
        WorkloadError: the config is invalid (see
            :func:`validate_workload_config`); a line is not a JSON object
            (names the file and 1-based line); a line lacks the prompt field
            or has a non-string prompt; two prompts share an id; ``categories``
            names an unknown Spec-Bench category; ``datasets`` is missing or
            the dataset cannot be loaded; or no prompts are left.
    """
    _raise_if_invalid(cfg)
    name: str = cfg["name"]
    source: str = cfg["source"]
    if source == "builtin":
        resource = importlib.resources.files("specbench.workloads") / "data" / f"{name}.jsonl"
        data = resource.read_bytes()
        prompts = _prompts_from_jsonl(data, str(resource), "prompt", "id")
        origin = str(resource)
    elif source == "jsonl":
        file = Path(cfg["path"]).expanduser()
        data = file.read_bytes()
        prompts = _prompts_from_jsonl(
            data, str(file), cfg.get("prompt_field") or "prompt", cfg.get("id_field") or "id"
        )
        origin = str(file)
    elif source == "spec_bench":
        file = Path(cfg["path"]).expanduser()
        data = file.read_bytes()
        categories = _spec_bench_categories(cfg)
        prompts = _prompts_from_spec_bench(data, str(file), categories, cfg.get("turn") or 0)
        origin = f"{file} (categories {', '.join(categories)})"
    else:
        prompts = _prompts_from_hf(cfg)
        return _nonempty(prompts, name, _hf_label(cfg)), ""
    return _nonempty(prompts, name, origin), hashlib.sha256(data).hexdigest()


# English prose runs about 4.5 characters per token in SmolLM2's BPE (4.3-4.7
# over the three built-in sets); Qwen2.5's is close. Only the sweep's time
# estimate uses it, before any tokenizer loads.
CHARS_PER_TOKEN = 4.5


def estimated_requests(cfg: Mapping[str, Any]) -> tuple[int, float] | None:
    """How many prompts a cell submits and their mean length in tokens, from characters.

    For the sweep's plan, before any tokenizer (or torch) loads: prompts
    estimated longer than ``max_prompt_tokens`` are left out as
    :func:`load_workload` would, and ``num_prompts`` is taken as is (``all``:
    every prompt left). The chat template's few tokens are not counted.
    None for an ``hf`` source (not read before the first engine) or one that
    does not load.
    """
    if cfg.get("source") == "hf":
        return None
    try:
        prompts, _ = load_prompts(cfg)
    except WorkloadError:
        return None
    lengths = [len(p.text) / CHARS_PER_TOKEN for p in prompts]
    fitting = [n for n in lengths if n <= cfg["max_prompt_tokens"]] or lengths
    count = len(fitting) if cfg["num_prompts"] == ALL_PROMPTS else int(cfg["num_prompts"])
    return count, sum(fitting) / len(fitting)


def load_workload(cfg: Mapping[str, Any], tokenizer: Tokenizer) -> Workload:
    """Load, measure and select the prompts of a workload.

    Every prompt of the source is tokenized (through the chat template when
    ``chat_template`` is true); those longer than ``max_prompt_tokens`` are
    dropped and counted, never truncated. ``num_prompts`` of the rest (every
    one for ``all``) are chosen by ``selection``: ``random`` (the default)
    draws them with ``random.Random(seed).sample``, so the same config always
    gives the same prompts in the same order; ``first`` takes the first ones
    in the source's order.

    Args:
        cfg: the ``workload`` config group.
        tokenizer: the target model's Hugging Face tokenizer.

    Returns:
        The selected prompts with their token ids.

    Raises:
        WorkloadError: anything :func:`load_prompts` raises, or fewer prompts
            fit within ``max_prompt_tokens`` than ``num_prompts``.
    """
    prompts, fingerprint = load_prompts(cfg)
    chat_template: bool = cfg["chat_template"]
    max_prompt_tokens: int = cfg["max_prompt_tokens"]

    eligible: list[tuple[Prompt, tuple[int, ...]]] = []
    for prompt in prompts:
        ids = _token_ids(tokenizer, prompt.text, chat_template)
        if len(ids) <= max_prompt_tokens:
            eligible.append((prompt, ids))
    skipped = len(prompts) - len(eligible)
    num_prompts: int = len(eligible) if cfg["num_prompts"] == ALL_PROMPTS else cfg["num_prompts"]
    if len(eligible) < num_prompts or not eligible:
        raise WorkloadError(
            f"workload.num_prompts={cfg['num_prompts']} but only {len(eligible)} prompts of "
            f"{cfg['name']} (source={cfg['source']}) fit workload.max_prompt_tokens={max_prompt_tokens} "
            f"({skipped} of {len(prompts)} are longer with this model's tokenizer); "
            f"lower workload.num_prompts or raise workload.max_prompt_tokens (a serving cell takes a prompt "
            f"per request, raising workload.num_prompts to load.num_requests: load.cycle_prompts=true cycles fewer)"
        )
    if cfg.get("selection", "random") == "first":
        chosen = eligible[:num_prompts]
    else:
        chosen = random.Random(cfg["seed"]).sample(eligible, num_prompts)
    return Workload(
        name=cfg["name"],
        source=cfg["source"],
        prompts=tuple(prompt for prompt, _ in chosen),
        token_ids=tuple(ids for _, ids in chosen),
        skipped_too_long=skipped,
        source_fingerprint=fingerprint,
    )


def _is_int(value: object) -> bool:
    # YAML `true` is a bool, and bool is an int subclass; neither is a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _plain(value: object) -> object:
    # An OmegaConf ListConfig prints as its repr; show the plain list the user wrote.
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return value


def _raise_if_invalid(cfg: Mapping[str, Any]) -> None:
    problems = validate_workload_config(cfg)
    if problems:
        raise WorkloadError("; ".join(problems))


def _nonempty(prompts: list[Prompt], name: str, origin: str) -> list[Prompt]:
    if not prompts:
        raise WorkloadError(f"no prompts for workload {name} in {origin}")
    return prompts


def _json_lines(data: bytes, file: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for each non-blank line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    # Split on "\n" only: str.splitlines would also split on U+2028 and other
    # separators that are legal unescaped inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            # Some of json's messages end in "at" already ("Unterminated string starting at").
            raise WorkloadError(
                f"{file}:{number}: malformed JSON line ({exc.msg.removesuffix(' at')} at column {exc.colno})"
            ) from exc
        if not isinstance(record, dict):
            raise WorkloadError(f"{file}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def _prompt_text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise WorkloadError(
            f"{where}: field {field!r} must be a non-empty string, got {str(value)[:60]!r}"
        )
    return value


def _add_unique(
    prompts: list[Prompt], seen: dict[str, str], prompt: Prompt, where: str, file: str
) -> None:
    # Results are keyed by prompt id; two prompts under one id would be merged.
    if prompt.id in seen:
        raise WorkloadError(
            f"{file}: duplicate prompt id {prompt.id!r} at {seen[prompt.id]} and {where}; "
            f"ids must be unique (for jsonl and hf, workload.id_field picks the id field; "
            f"a field the records lack numbers them instead)"
        )
    seen[prompt.id] = where
    prompts.append(prompt)


def _prompts_from_jsonl(data: bytes, file: str, prompt_field: str, id_field: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for number, record in _json_lines(data, file):
        if prompt_field not in record:
            raise WorkloadError(
                f"{file}:{number}: missing prompt field {prompt_field!r} "
                f"(keys: {', '.join(record) or 'none'}; set workload.prompt_field)"
            )
        text = _prompt_text(record[prompt_field], f"{file}:{number}", prompt_field)
        prompt_id = str(record[id_field]) if id_field in record else str(number)
        output_tokens = _output_tokens(record, f"{file}:{number}")
        _add_unique(prompts, seen, Prompt(prompt_id, text, output_tokens), f"line {number}", file)
    return prompts


# The field of a jsonl record that names its output length, as vllm bench serve's custom dataset names it.
OUTPUT_TOKENS_FIELD = "output_tokens"


def _output_tokens(record: Mapping[str, Any], where: str) -> int | None:
    """A record's own output length (:data:`OUTPUT_TOKENS_FIELD`); None where it has none."""
    value = record.get(OUTPUT_TOKENS_FIELD)
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise WorkloadError(f"{where}: field {OUTPUT_TOKENS_FIELD!r} must be an integer >= 1 (the request's "
                            f"output length), got {str(value)[:60]!r}")
    return value


def _spec_bench_categories(cfg: Mapping[str, Any]) -> list[str]:
    explicit = cfg.get("categories")
    if explicit is not None:
        return [str(category) for category in explicit]
    return list(SPEC_BENCH_WORKLOAD_CATEGORIES[cfg["name"]])


def _prompts_from_spec_bench(data: bytes, file: str, categories: list[str], turn: int) -> list[Prompt]:
    records = list(_json_lines(data, file))
    for number, record in records:
        for field in ("question_id", "category", "turns"):
            if field not in record:
                raise WorkloadError(f"{file}:{number}: missing Spec-Bench field {field!r}")
    # A custom file in Spec-Bench format may add its own categories.
    known = set(SPEC_BENCH_CATEGORIES) | {str(record["category"]) for _, record in records}
    unknown = [category for category in categories if category not in known]
    if unknown:
        raise WorkloadError(
            f"workload.categories has unknown Spec-Bench categories {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )

    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for number, record in records:
        if record["category"] not in categories:
            continue
        turns = record["turns"]
        if not isinstance(turns, list) or turn >= len(turns):
            raise WorkloadError(
                f"{file}:{number}: workload.turn={turn} but 'turns' has "
                f"{len(turns) if isinstance(turns, list) else 'no list of'} turns"
            )
        text = _prompt_text(turns[turn], f"{file}:{number}", f"turns[{turn}]")
        _add_unique(prompts, seen, Prompt(str(record["question_id"]), text), f"line {number}", file)
    return prompts


def _hf_label(cfg: Mapping[str, Any]) -> str:
    config = cfg.get("dataset_config")
    split = cfg.get("split") or "test"
    return f"dataset {cfg['dataset']}" + (f" ({config})" if config else "") + f" split {split}"


@contextmanager
def _offline_env_if_requested() -> Iterator[None]:
    """Force both offline switches for the call when HF_HUB_OFFLINE=1.

    Without HF_DATASETS_OFFLINE, `datasets` still tries the network and waits
    for its timeouts and retries instead of failing at once.
    """
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        yield
        return
    with patched_environ({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}):
        yield


def hf_problem(cfg: Mapping[str, Any]) -> str | None:
    """Why an ``hf`` source cannot load whatever the dataset: the ``datasets`` package is not installed.

    Found without importing it (which takes seconds), so that a sweep refuses the
    workload once, before any engine, rather than in every cell. None where it is installed.
    """
    if importlib.util.find_spec("datasets") is not None:
        return None
    return (f"workload.source=hf needs the datasets package (pip install datasets) to read "
            f"{_hf_label(cfg)}; {_OFFLINE_ALTERNATIVES}")


def _prompts_from_hf(cfg: Mapping[str, Any]) -> list[Prompt]:
    label = _hf_label(cfg)
    text_field: str = cfg["text_field"]
    id_field: str = cfg.get("id_field") or "id"
    instruction: str = cfg.get("instruction") or ""
    # Environment first: `datasets` reads its offline switches when imported.
    with _offline_env_if_requested():
        try:
            import datasets
        except ImportError as exc:
            raise WorkloadError(hf_problem(cfg) or f"cannot import datasets ({exc})") from exc
        try:
            rows = datasets.load_dataset(
                cfg["dataset"], cfg.get("dataset_config"), split=cfg.get("split") or "test"
            )
        except Exception as exc:
            # Offline, missing, gated or misnamed datasets all raise different
            # types from deep inside `datasets`; the user needs one actionable line.
            raise WorkloadError(
                f"cannot load {label} ({type(exc).__name__}: {exc}); {_OFFLINE_ALTERNATIVES}"
            ) from exc

    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for index, row in enumerate(rows):
        if text_field not in row:
            raise WorkloadError(
                f"{label}, row {index}: no field {text_field!r} (fields: {', '.join(row)}; "
                f"set workload.text_field)"
            )
        text = _prompt_text(row[text_field], f"{label}, row {index}", text_field)
        if instruction:
            text = f"{instruction}\n\n{text}"
        prompt_id = str(row[id_field]) if id_field in row else str(index)
        _add_unique(prompts, seen, Prompt(prompt_id, text), f"row {index}", label)
    return prompts


def _token_ids(tokenizer: Tokenizer, text: str, chat_template: bool) -> tuple[int, ...]:
    if not chat_template:
        return tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=True))
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    # transformers 5 returns a BatchEncoding when return_dict is left at its
    # default, and some tokenizer wrappers ignore the argument.
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return tuple(int(t) for t in ids)
