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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional

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
    """

    name: str
    cost: str | None
    checkpoint: Checkpoint | None = None
    keys: tuple[Key, ...] = ()
    check: Callable[[Mapping[str, Any]], list[str]] | None = None
    reference_pass: bool = False
    worker_env: Callable[[Mapping[str, Any]], dict[str, str]] | None = None

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
    ``draft_model/small K=2``); ``baseline`` for plain decoding, which has no K."""
    name = variant(config)
    return name if config.get("name") == BASELINE else f"{name} K={k}"


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
register(Method("ngram", cost="ngram"))
register(Method("eagle", cost="eagle", checkpoint="head"))
register(Method("eagle3", cost="eagle3", checkpoint="head"))
register(Method("draft_model", cost="draft_model", checkpoint="model",
                keys=(Key("draft", "/{}", identity=False),)))
# The target's own continuation, corrupted at a chosen rate: drafting costs
# nothing next to a forward pass, as for prompt lookup.
register(Method("controlled", cost="ngram", keys=(Key("alpha", " alpha={:g}", float),), check=_check_controlled,
                reference_pass=True, worker_env=_controlled_env))
