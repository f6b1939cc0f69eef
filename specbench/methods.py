"""The speculation methods specbench measures: the one registry a new method joins.

A method is two things: its Hydra config, ``conf/method/<name>.yaml``, which
holds the ``speculative_config`` handed to vLLM; and one :class:`Method` entry
here, which says how a cell of it is validated before any engine loads and how
the analytic model prices its drafter. Everything else (validation, the plan,
the prediction, the memory model, the report) reads this registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional

from omegaconf import MISSING

Checkpoint = Literal["head", "model"]


@dataclass(frozen=True)
class Method:
    """One speculation method.

    Attributes:
        name: the ``name`` in its ``conf/method/<name>.yaml`` (and the ``method`` column).
        priced_as: the analytic model's drafter cost for it, one of
            :data:`specbench.analytic.checks.METHODS` (``ngram``: drafting free next to a
            forward pass); None where the model cannot price it.
        checkpoint: what ``speculative_config.model`` names, checked before any
            engine loads: ``head``, an EAGLE head trained for this target (the
            model config's ``model.<name>``); ``model``, a draft model (one of
            ``model.drafts``); None, no checkpoint.
    """

    name: str
    priced_as: str | None
    checkpoint: Checkpoint | None = None


@dataclass
class MethodSchema:
    """The keys of a ``method`` config and their types, checked by Hydra when it composes.

    ``speculative_config`` is vLLM's, handed over as it is (vLLM checks its
    keys); the keys after it belong to one method each and stay null for the
    others. A method with a key of its own adds it here and in :data:`OWN_KEYS`.
    """

    name: str = MISSING
    speculative_config: Optional[Dict[str, Any]] = MISSING
    alpha: Optional[float] = None  # controlled: the per-token acceptance probability
    draft: Optional[str] = None  # draft_model: which of model.drafts drafts


# MethodSchema's method-specific keys and the method that reads each: set for
# another method, validation refuses them (they would change nothing).
OWN_KEYS = {"alpha": "controlled", "draft": "draft_model"}


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (replacing one of the same name) and return it."""
    _REGISTRY[method.name] = method
    return method


def get(name: str) -> Method | None:
    """The registered method called ``name``, or None."""
    return _REGISTRY.get(name)


def names() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    return tuple(_REGISTRY)


def priced_as(name: str) -> str | None:
    """The theory's drafter cost for method ``name``; None for an unknown or unpriced method."""
    method = _REGISTRY.get(name)
    return method.priced_as if method else None


register(Method("baseline", priced_as="baseline"))
register(Method("ngram", priced_as="ngram"))
register(Method("eagle", priced_as="eagle", checkpoint="head"))
register(Method("eagle3", priced_as="eagle3", checkpoint="head"))
register(Method("draft_model", priced_as="draft_model", checkpoint="model"))
# The target's own continuation, corrupted at a chosen rate: drafting costs
# nothing next to a forward pass, as for prompt lookup.
register(Method("controlled", priced_as="ngram"))
