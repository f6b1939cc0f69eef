"""The speculation methods specbench measures: the one registry a new method joins.

A method is three things at most:

- its Hydra config, ``conf/method/<name>.yaml``, which holds the
  ``speculative_config`` handed to vLLM and the method's own keys;
- one :class:`Method` entry here: how a cell of it is validated before any
  engine loads, which of its keys make a cell a variant of its own (and so
  its ``method_label``), and which cost model the analytic model prices its
  drafter with;
- where no existing cost model fits, its cost model
  (:class:`specbench.analytic.drafting.DraftCost`), registered by name with
  :func:`specbench.analytic.drafting.register_cost`.

Everything else (validation, the row's label, the plan, the prediction, the
memory model, the report, the K schedule) reads this registry. It imports
nothing of the analytic model, so the analytic layer may read it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Sequence

from omegaconf import MISSING

from specbench import controlled

Checkpoint = Literal["head", "model"]


@dataclass(frozen=True)
class Key:
    """A key of a method's config beside ``speculative_config``, read by that method only.

    Attributes:
        name: the key under ``method`` (``method.alpha``); typed in :class:`MethodSchema`.
        label: how its value shows in the method's label, ``{}`` standing for the value
            (``" alpha={:g}"``: ``controlled alpha=0.6 K=4``; ``"/{}"``: ``draft_model/small K=2``).
        kind: its type (:class:`MethodSchema`'s), applied to the value in the identity and the label.
        identity: whether the value joins the cell's identity. False where
            ``speculative_config`` already carries what it decides (``method.draft``
            picks ``speculative_config.model``), so identities stay as they were.
    """

    name: str
    label: str
    kind: Callable[[Any], Any] = str
    identity: bool = True

    def value(self, config: Mapping[str, Any]) -> Any:
        """The key's value in a method config, as its type; None when unset."""
        value = config.get(self.name)
        return None if value is None else self.kind(value)


@dataclass(frozen=True)
class Method:
    """One speculation method.

    Attributes:
        name: the ``name`` in its ``conf/method/<name>.yaml`` (and the ``method`` column).
        cost: the analytic model's cost model for its drafter, a name in
            :data:`specbench.analytic.drafting.COST_MODELS` (``ngram``: drafting
            free next to a forward pass); None where the model cannot price it.
        checkpoint: what ``speculative_config.model`` names, checked before any
            engine loads: ``head``, an EAGLE head trained for this target (the
            model config's ``model.<name>``); ``model``, a draft model (one of
            ``model.drafts``); None, no checkpoint.
        keys: its own keys (:class:`Key`): set for another method, validation refuses them.
        check: problems with its config that only it can know (messages naming the key), or None.
        reference_pass: whether each batch is first decoded plainly, untimed, for the drafter to read.
        worker_env: environment variables the engine worker needs from its config, or None.
        schedules: whether vLLM honours a per-batch-size K schedule (``method.k_schedule``) for it:
            its model runner passes the scheduler's K to this method's proposer. vLLM 0.32's
            ``custom_class`` proposers are called without it and draft ``num_speculative_tokens``
            at every batch size, so a schedule there would be recorded but not run.
        pads_drafts: the model runners (``V1``, ``V2``) on which vLLM verifies K drafts on every
            step for this method, whatever its drafter found: a lookup drafter that finds no match
            drafts nothing on V1 (the CPU build's runner), but Model Runner V2's n-gram kernel
            fills the unmatched slots. Methods that always draft K need not say so: the analytic
            model prices them at K anyway.
    """

    name: str
    cost: str | None
    checkpoint: Checkpoint | None = None
    keys: tuple[Key, ...] = ()
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    reference_pass: bool = False
    worker_env: Callable[[Mapping[str, Any]], dict[str, str]] | None = None
    schedules: bool = False
    pads_drafts: tuple[str, ...] = ()

    def identity(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """What of a method config decides the measurement: name, speculative_config, identity keys."""
        return {
            "name": self.name,
            "speculative_config": config.get("speculative_config"),
            **{key.name: key.value(config) for key in self.keys if key.identity},
        }

    def variant(self, config: Mapping[str, Any]) -> str:
        """The method and its own keys' values, without K: ``controlled alpha=0.6``, ``draft_model/small``,
        and vLLM's sampling knobs where set (``eagle3 draft=probabilistic``)."""
        speculative = config.get("speculative_config") or {}
        knobs = "".join(f" {short}={speculative[key]}" for key, short in SAMPLING_KNOBS.items()
                        if speculative.get(key) is not None)
        return self.name + "".join(
            key.label.format(key.value(config)) for key in self.keys if config.get(key.name) is not None) + knobs

    def overrides(self, config: Mapping[str, Any]) -> list[str]:
        """The Hydra overrides that choose this variant: ``method=controlled method.alpha=0.6``."""
        return [f"method={self.name}"] + [
            f"method.{key.name}={config[key.name]}" for key in self.keys if config.get(key.name) is not None]


# vLLM's speculative sampling knobs (in speculative_config, checked against the installed vLLM by
# specbench.config) and how a method label names them.
SAMPLING_KNOBS = {"draft_sample_method": "draft", "rejection_sample_method": "rejection"}


@dataclass
class MethodSchema:
    """The keys of a ``method`` config and their types, checked by Hydra when it composes.

    ``speculative_config`` is vLLM's, handed over as it is (vLLM checks its
    keys); the keys after it belong to one method each (its :attr:`Method.keys`)
    and stay null for the others.
    """

    name: str = MISSING
    speculative_config: Optional[Dict[str, Any]] = MISSING
    alpha: Optional[float] = None  # controlled: the per-token acceptance probability
    draft: Optional[str] = None  # draft_model: which of model.drafts drafts
    # [[first batch size, last batch size, K], ...]: vLLM's num_speculative_tokens_per_batch_size
    # (see SCHEDULE_KEY). Typed Any so that a malformed one reaches check_schedule's own message.
    k_schedule: Optional[Any] = None


SCHEDULE = "k_schedule"
"""The method key of a per-batch-size K schedule (``method.k_schedule=[[1,4,4],[5,64,2]]``)."""

SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
"""Where vLLM reads the schedule: a key of ``speculative_config`` (vLLM 0.32)."""


BASELINE = "baseline"
"""Plain decoding: the method every speedup is measured against."""

_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (replacing one of the same name) and return it."""
    _REGISTRY[method.name] = method
    return method


def get(name: str) -> Method | None:
    """The registered method called ``name``, or None."""
    return _REGISTRY.get(name)


def entry(name: str) -> Method:
    """The registered method called ``name``; ValueError naming the registered ones otherwise."""
    method = _REGISTRY.get(name)
    if method is None:
        raise ValueError(f"method={name!r} is not one of {', '.join(_REGISTRY)}")
    return method


def names() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    return tuple(_REGISTRY)


def own_keys() -> dict[str, str]:
    """Each method-specific key (:attr:`Method.keys`) and the method that reads it."""
    return {key.name: method.name for method in _REGISTRY.values() for key in method.keys}


def pads_drafts(name: str, model_runner: str) -> bool:
    """Whether vLLM verifies K drafts on every step of method ``name`` on ``model_runner`` (V1 or V2)."""
    method = _REGISTRY.get(name)
    return method is not None and model_runner in method.pads_drafts


V1_ONLY_METHODS = ("suffix", "medusa", "mlp_speculator", "custom_class")
"""Speculative methods vLLM 0.32's Model Runner V2 does not run, so CUDA falls back to V1 for them."""


def model_runner(device_runner: str, speculative: Mapping[str, Any] | None) -> str:
    """The model runner vLLM 0.32 gives an engine with this ``speculative_config`` (None: plain decoding) on a
    device whose runner is ``device_runner`` (:func:`specbench.analytic.profiles.device_model_runner`).

    Where the device runs V2, vLLM falls back to V1 for the features V2 lacks
    (config/vllm.py, ``VllmConfig._get_v2_model_runner_unsupported_features``, which
    ``tests/test_vllm_config.py`` checks this against for every shipped GPU engine): the methods of
    :data:`V1_ONLY_METHODS` (``controlled`` is a ``custom_class``), EAGLE parallel drafting, and a
    heterogeneous-vocabulary draft model (``use_heterogeneous_vocab``: V2 has no vocabulary mapping).
    """
    if device_runner != "V2" or not speculative:
        return device_runner
    method = speculative.get("method")
    if (method in V1_ONLY_METHODS or speculative.get("use_heterogeneous_vocab")
            or (speculative.get("parallel_drafting") and method not in ("dflash", "dspark"))):
        return "V1"
    return "V2"


def cost(name: str) -> str | None:
    """The cost model of method ``name``; None for an unknown or unpriced method."""
    method = _REGISTRY.get(name)
    return method.cost if method else None


def variant(config: Mapping[str, Any]) -> str:
    """A method config's :meth:`Method.variant`; the bare name for a method not registered here."""
    name = str(config.get("name"))
    method = _REGISTRY.get(name)
    return method.variant(config) if method else name


def label(config: Mapping[str, Any], k: int) -> str:
    """The ``method_label`` of a cell: its variant and K (``ngram K=4``, ``controlled alpha=0.6 K=4``,
    ``draft_model/small K=2``); ``baseline`` for plain decoding, which has no K. A cell with a K
    schedule shows it in place of K (``ngram K=[1-4:4, 5-64:2]``), so it never shares a fixed K's label."""
    name = variant(config)
    if config.get("name") == BASELINE:
        return name
    schedule = config.get(SCHEDULE)
    return f"{name} K=[{schedule_text(schedule)}]" if schedule else f"{name} K={k}"


def schedule_text(schedule: Sequence[Sequence[int]]) -> str:
    """A schedule as its label shows it: ``1-4:4, 5-64:2`` (a one-size range as ``8:2``)."""
    return ", ".join(f"{a}:{k}" if a == b else f"{a}-{b}:{k}" for a, b, k in schedule)


def schedule_max_k(schedule: Sequence[Sequence[int]]) -> int:
    """The largest K of a schedule: the cell's ``num_speculative_tokens`` (vLLM caps every entry at it)."""
    return max(int(entry[2]) for entry in schedule)


def check_schedule(name: Any, schedule: Any, max_k: int) -> list[str]:
    """Problems with ``method.k_schedule`` for method ``name``: one message per problem, naming the key.

    Stricter than vLLM, which sorts the ranges and carries a K forward over a
    gap: a schedule here must be what runs, so its ranges are listed in order,
    start at batch size 1 and follow each other without gap or overlap. Past the
    last range vLLM keeps its K (the rule the label and the analytic model follow).
    """
    if schedule is None:
        return []
    try:
        key = f"method.{SCHEDULE}={json.dumps(schedule, separators=(',', ':'))}"
    except TypeError:
        key = f"method.{SCHEDULE}={schedule!r}"
    method = _REGISTRY.get(name) if isinstance(name, str) else None
    if method is None or not method.schedules:
        honoured = ", ".join(m.name for m in _REGISTRY.values() if m.schedules)
        why = ("it does not speculate" if method is None or method.name == BASELINE
               else _UNSCHEDULED.get(method.name, "its custom_class proposer is called without the scheduled K and "
                                                  "drafts num_speculative_tokens at every batch size"))
        return [f"{key}: vLLM 0.32 does not schedule K for method={name} ({why}); a K schedule is allowed "
                f"for method={honoured}"]
    form = "a list of [first batch size, last batch size, K] integer triples, e.g. [[1,4,4],[5,64,2]]"
    if not isinstance(schedule, (list, tuple)) or not schedule or not all(
            isinstance(e, (list, tuple)) and len(e) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in e) for e in schedule):
        return [f"{key} must be {form}"]
    errors = []
    if schedule[0][0] != 1:
        errors.append(f"{key}: the first range must start at batch size 1 (it starts at {schedule[0][0]}), "
                      "so every batch size has a K")
    for start, end, _ in schedule:
        if start > end:
            errors.append(f"{key}: range [{start}, {end}] ends before it starts; each range is "
                          "[first batch size, last batch size, K] with first <= last")
    for (_, end, _), (start, _, _) in zip(schedule, schedule[1:]):
        if start <= end:
            errors.append(f"{key}: ranges overlap or are out of order at batch size {start} (the range before "
                          f"ends at {end}); list them in order, each starting right after the one before")
        elif start > end + 1:
            errors.append(f"{key}: batch sizes {end + 1}..{start - 1} are in no range (a gap, which vLLM "
                          f"would silently fill with the K before it); each range must start at the last "
                          f"one's end + 1")
    ks = [k for _, _, k in schedule]
    if any(not 0 <= k <= max_k for k in ks):
        errors.append(f"{key}: every K must be an integer in 0..{max_k} (0: no speculation in that range)")
    elif max(ks) == 0:
        errors.append(f"{key}: every K is 0; plain decoding is method=baseline")
    return errors


# Why vLLM 0.32 cannot run a K schedule for a method that does not honour one (custom_class's otherwise).
_UNSCHEDULED = {"suffix": "its proposer asserts that the scheduled K is num_speculative_tokens "
                          "(v1/spec_decode/suffix_decoding.py), so the first step off it would fail"}

SUFFIX_PACKAGE = "arctic_inference"
"""The module vLLM 0.32's suffix decoding imports (``arctic_inference.suffix_decoding``)."""

SUFFIX_INSTALL = "pip install arctic-inference==0.1.1"
"""How vLLM 0.32 says to install it (config/speculative.py, ``_validate_suffix_decoding``)."""


def _check_suffix(config: Mapping[str, Any]) -> list[str]:
    """method=suffix: refused where ``arctic_inference`` cannot be imported, which vLLM would only say at
    engine start. Imported, not only found, as vLLM's own check does: its native kernels may fail to load."""
    try:
        if importlib.util.find_spec(SUFFIX_PACKAGE) is None:
            raise ImportError(f"No module named {SUFFIX_PACKAGE!r}")
        importlib.import_module(SUFFIX_PACKAGE)
    except Exception as exc:  # a broken install (missing CUDA libraries) is as unusable as a missing one
        return [f"method=suffix needs the arctic-inference package, which vLLM 0.32's suffix decoding imports "
                f"({SUFFIX_PACKAGE}: {exc}); install it with `{SUFFIX_INSTALL}` (it builds CUDA kernels)"]
    return []


def _check_controlled(config: Mapping[str, Any]) -> list[str]:
    errors = []
    try:
        controlled.check_alpha(config.get("alpha"))
    except ValueError:
        errors.append(f"method.alpha={config.get('alpha')!r} must be a number in [0, 1]")
    spec = config.get("speculative_config") or {}
    if spec.get("method") != "custom_class" or spec.get("model") != controlled.PROPOSER_CLASS:
        errors.append(
            "method=controlled needs speculative_config.method=custom_class and "
            f"speculative_config.model={controlled.PROPOSER_CLASS}"
        )
    return errors


def _controlled_env(config: Mapping[str, Any]) -> dict[str, str]:
    # vLLM's speculative_config forbids unknown keys, so the proposer's alpha travels by environment.
    return {controlled.ALPHA_ENV: repr(float(config["alpha"]))}


register(Method(BASELINE, cost="baseline"))
# vLLM 0.32's model runner (the CPU one inherits it) hands the scheduler's K to
# these methods' proposers (gpu_model_runner.propose_draft_token_ids): they honour a K schedule.
# Model Runner V2 (vLLM 0.32's on CUDA) runs both n-gram methods with one kernel, which fills the slots it
# found no match for (v1/worker/gpu/spec_decode/ngram/speculator.py): every step verifies K drafts.
# V1 verifies only what matched: ngram's proposer drafts nothing there, and ngram_gpu's scheduled
# drafts are trimmed to the valid ones (gpu_model_runner: update_scheduler_for_invalid_drafts).
register(Method("ngram", cost="ngram", schedules=True, pads_drafts=("V2",)))
register(Method("eagle", cost="eagle", checkpoint="head", schedules=True))
register(Method("eagle3", cost="eagle3", checkpoint="head", schedules=True))
register(Method("draft_model", cost="draft_model", checkpoint="model",
                keys=(Key("draft", "/{}", identity=False),), schedules=True))
# Prompt lookup in a GPU kernel: free as ngram, and run with async scheduling (ngram is not); GPU only.
register(Method("ngram_gpu", cost="ngram", schedules=True, pads_drafts=("V2",)))
# Suffix decoding (Arctic Inference): suffix trees over the prompt and earlier responses, model-free, so
# drafting is as free as prompt lookup. vLLM 0.32 runs it on V1 on every device
# (config/vllm.py, _get_v2_model_runner_unsupported_features), where only the drafts it found are verified.
register(Method("suffix", cost="ngram", check=_check_suffix))
# The target's own continuation, corrupted at a chosen rate: drafting costs
# nothing next to a forward pass, as for prompt lookup.
register(Method("controlled", cost="ngram", keys=(Key("alpha", " alpha={:g}", float),), check=_check_controlled,
                reference_pass=True, worker_env=_controlled_env))
