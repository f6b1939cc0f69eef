"""Draft cost: what the drafter (a draft model or an EAGLE head) spends per draft step and on
the prompts; prompt lookup (ngram) pays only the host work of a speculative step, where it was timed.

Each way of drafting is a named cost model (:class:`DraftCost`) in one table,
:data:`COST_MODELS`: a method's registry entry (:mod:`specbench.methods`)
names the one it is priced with, and a method with a drafter of its own
registers its cost model here (:func:`register_cost`). Everything that prices
a drafter (:func:`draft_time`, :func:`draft_prefill_time`, the speedup, the
memory model's drafter profile) looks it up by that name.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from specbench.analytic.checks import check_int, check_real
from specbench.analytic.profiles import HardwareProfile, ModelProfile
from specbench.analytic.steps import PassWork, pass_work, prefill_steps, roofline_time


EAGLE_FC_INPUTS = {"eagle": 2, "eagle3": 3}
# Norm vectors in a head's checkpoint: EAGLE-1's layer keeps only its post-attention
# norm (vLLM drops the input norm of its first layer); EAGLE-3 adds the input,
# hidden-state and final norms.
_EAGLE_NORMS = {"eagle": 1, "eagle3": 4}


class DraftCost(Protocol):
    """How one way of drafting is priced: its drafter's profile, its draft steps, its prompt pass.

    ``draft`` is the drafter's profile (:meth:`drafter`), ``target`` the
    target's; either may be None where the caller has none, and a cost model
    that needs it raises ValueError naming it. Seconds, as everywhere here.
    """

    def drafter(self, target: ModelProfile, checkpoint: ModelProfile | None) -> ModelProfile | None:
        """The drafter's own profile, from its checkpoint's config.json (``checkpoint``, None when
        unread); None for a drafter without weights."""
        ...

    def step_time(
        self, *, hw: HardwareProfile, batch_size: int, k: int, context_len: float,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """Seconds to propose k >= 1 tokens for each of batch_size sequences."""
        ...

    def prefill_time(
        self, *, hw: HardwareProfile, batch_size: int, prompt_len: float, max_step_tokens: int,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """Seconds the drafter spends on the prompts, beside the target's own prefill."""
        ...


@dataclass(frozen=True)
class FreeDraft:
    """No draft at all (plain decoding): no weights, no passes, no host work."""

    def drafter(self, target: ModelProfile, checkpoint: ModelProfile | None) -> ModelProfile | None:
        """No weights."""
        return None

    def step_time(
        self, *, hw: HardwareProfile, batch_size: int, k: int, context_len: float,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """0: nothing is drafted."""
        return 0.0

    def prefill_time(
        self, *, hw: HardwareProfile, batch_size: int, prompt_len: float, max_step_tokens: int,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """0: nothing reads the prompts but the target."""
        return 0.0


@dataclass(frozen=True)
class LookupDraft(FreeDraft):
    """Prompt lookup (ngram): no weights and no draft passes, but host work on every speculative step.

    The engine runs the lookup (vLLM's numba kernel, in the engine's own
    process), builds the verification's metadata and runs the rejection
    sampler on the host, once per step whatever K or the batch: a cost that
    plain decoding does not pay and that no forward pass prices. It is the
    figure calibrate timed on an engine of this method (``kind``) where the
    profile has one (:attr:`HardwareProfile.head_overheads`, the profile's
    ``head_draft_overhead_ms``), else 0 (a profile that never timed it, or a
    GPU step whose host work overlaps the device's). Negative figures (a timed
    step below its priced verification) are floored at 0: a lookup saves no
    verification work.
    """

    kind: str

    def step_time(
        self, *, hw: HardwareProfile, batch_size: int, k: int, context_len: float,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """The step's timed host work for this method: one per step, not per drafted token."""
        return max(dict(hw.head_overheads).get(self.kind, 0.0), 0.0)


@dataclass(frozen=True)
class DraftModelCost:
    """A separate, smaller model: k sequential passes of its own, and its own prefill."""

    def drafter(self, target: ModelProfile, checkpoint: ModelProfile | None) -> ModelProfile | None:
        """The draft model's own config.json; ValueError without it."""
        if checkpoint is None:
            raise ValueError("method.speculative_config.model is not set")
        return checkpoint

    def step_time(
        self, *, hw: HardwareProfile, batch_size: int, k: int, context_len: float,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """k passes of ``draft``, each the work of step_time(draft, num_tokens=num_seqs=batch_size)."""
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        return k * roofline_time(hw, pass_work(draft, batch_size, batch_size, context_len), draft=True)

    def prefill_time(
        self, *, hw: HardwareProfile, batch_size: int, prompt_len: float, max_step_tokens: int,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """The draft prefills every prompt as the target does (the work of ``prefill_time(draft)``)."""
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        steps, num_tokens = prefill_steps(batch_size, prompt_len, max_step_tokens)
        work = pass_work(draft, num_tokens, batch_size, prompt_len / 2.0, logits=batch_size / steps)
        return steps * roofline_time(hw, work, draft=True)


@dataclass(frozen=True)
class EagleHeadCost:
    """An EAGLE head (``kind``: eagle or eagle3) on the target's hidden states.

    A draft step is one pass of the head (:func:`eagle_head_matmul_params`:
    one decoder layer with its own one-layer KV cache, the fc layer, and the
    LM head the head reads: the target's full vocabulary for EAGLE-1, the
    head's own reduced one for EAGLE-3). Without the head's profile the head
    is assumed to have the target's shapes and full vocabulary. Each pass
    pays the fixed cost timed on a head of this kind where the profile has
    one (:meth:`HardwareProfile.for_drafter`), else the profile's draft
    overhead, whichever head it was timed on. A negative one is the head's
    correction to its roofline (its passes measured cheaper than their
    priced work): it comes off each pass, which is never priced below 0.
    A draft step also pays, once whatever K, the cost timed per step on a
    head of this kind (:attr:`HardwareProfile.head_step_overheads`; 0 where
    the profile has none): the proposer's set-up and the first pass over the
    accepted positions, which a per-pass figure fitted at one K spread over
    its passes and multiplied at larger K.
    """

    kind: str

    def drafter(self, target: ModelProfile, checkpoint: ModelProfile | None) -> ModelProfile | None:
        """:func:`eagle_head_profile` from the head's shapes; the target's where they are unread (an upper bound)."""
        return eagle_head_profile(target, self.kind, checkpoint)

    def step_time(
        self, *, hw: HardwareProfile, batch_size: int, k: int, context_len: float,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """k passes of the head over one token per sequence, and the head's cost per step; never below 0."""
        if target is None:
            raise ValueError(f"target must be given for method {self.kind!r}")
        work = eagle_head_work(
            self.kind, draft or target, target, num_tokens=batch_size, num_seqs=batch_size,
            context_len=context_len, logits=batch_size,
        )
        per_step = dict(hw.head_step_overheads).get(self.kind, 0.0)
        return max(k * self._pass_time(hw, work) + per_step, 0.0)

    def prefill_time(
        self, *, hw: HardwareProfile, batch_size: int, prompt_len: float, max_step_tokens: int,
        draft: ModelProfile | None, target: ModelProfile | None,
    ) -> float:
        """The head's layer and fc over every prompt token (it needs their hidden states before it
        can propose), its LM head at each prompt's last position."""
        if target is None:
            raise ValueError(f"target must be given for method {self.kind!r}")
        steps, num_tokens = prefill_steps(batch_size, prompt_len, max_step_tokens)
        work = eagle_head_work(
            self.kind, draft or target, target, num_tokens=num_tokens, num_seqs=batch_size,
            context_len=prompt_len / 2.0, logits=batch_size / steps,
        )
        return steps * self._pass_time(hw, work)

    def _pass_time(self, hw: HardwareProfile, work: PassWork) -> float:
        """One pass of the head: its roofline and the overhead timed on a head of this kind, less that
        head's correction where it is negative; never below 0."""
        correction = min(dict(hw.head_overheads).get(self.kind, 0.0), 0.0)
        return max(roofline_time(hw.for_drafter(self.kind), work, draft=True) + correction, 0.0)


COST_MODELS: dict[str, DraftCost] = {
    "baseline": FreeDraft(),
    "ngram": LookupDraft("ngram"),
    "draft_model": DraftModelCost(),
    "eagle": EagleHeadCost("eagle"),
    "eagle3": EagleHeadCost("eagle3"),
}
"""The named cost models, in the order error messages list them; :func:`register_cost` adds one."""


def register_cost(name: str, cost: DraftCost) -> DraftCost:
    """Add ``cost`` to :data:`COST_MODELS` as ``name`` (replacing one of that name) and return it."""
    COST_MODELS[name] = cost
    return cost


def cost_model(method: str) -> DraftCost:
    """The cost model named ``method``; ValueError listing the known ones otherwise."""
    cost = COST_MODELS.get(method) if isinstance(method, str) else None
    if cost is None:
        raise ValueError(f"method must be one of {', '.join(COST_MODELS)}; got {method!r}")
    return cost


def draft_prefill_time(
    method: str,
    *,
    hw: HardwareProfile,
    batch_size: int,
    prompt_len: float,
    max_step_tokens: int,
    draft: ModelProfile | None = None,
    target: ModelProfile | None = None,
) -> float:
    """Seconds the drafter of cost model ``method`` spends on the prompts, beside the target's own prefill.

    :meth:`DraftCost.prefill_time`. A draft model prefills every prompt as
    the target does (the work of :func:`prefill_time` of ``draft``); an EAGLE
    head runs its layer and fc over every prompt token and its LM head read
    at each prompt's last position, priced from the head's own shapes
    (``draft``, its profile; the target's shapes when absent) as
    :func:`draft_time` prices a draft step. Either runs in the same engine
    steps as the target, so each of its passes pays
    ``hw.draft_pass_overhead_s``, not a step's fixed overhead. ngram and
    plain decoding: 0.
    """
    return cost_model(method).prefill_time(
        hw=hw, batch_size=batch_size, prompt_len=prompt_len, max_step_tokens=max_step_tokens,
        draft=draft, target=target,
    )


def draft_time(
    method: str,
    *,
    hw: HardwareProfile,
    batch_size: int,
    k: int,
    context_len: float,
    draft: ModelProfile | None = None,
    target: ModelProfile | None = None,
) -> float:
    """Seconds the drafter of cost model ``method`` spends proposing k tokens for each of batch_size sequences.

    :meth:`DraftCost.step_time`; 0 for k = 0. baseline: 0. ngram: the host
    work of a speculative step where the profile timed it (:class:`LookupDraft`),
    else 0. draft_model: k sequential passes of `draft`, each the work of
    step_time(draft, num_tokens=num_seqs=batch_size). eagle / eagle3: k
    passes of the head and its cost per step, once (:class:`EagleHeadCost`). `draft` is the head's
    profile (its config.json: the target's shapes with one layer, plus
    draft_vocab_size); without it the head is assumed to have the target's
    shapes and full vocabulary. Head weights cost the dtype width
    kv_bytes_per_element, not the target's bytes_per_weight, because heads
    ship unquantized. Every draft pass pays ``hw.draft_pass_overhead_s`` (a
    pass inside the engine step, which has already paid the scheduler and
    sampler once).
    """
    cost = cost_model(method)
    batch_size = check_int("batch_size", batch_size, 1)
    k = check_int("k", k, 0)
    context_len = check_real("context_len", context_len, 0.0)
    if k == 0:
        return 0.0
    return cost.step_time(hw=hw, batch_size=batch_size, k=k, context_len=context_len, draft=draft, target=target)


def verified_draft_tokens(k: int, drafted: float | None, *, padded: bool) -> float:
    """Draft tokens per sequence the target verifies on one decode pass.

    ``drafted``: what the drafter proposed per sequence and pass, in [0, k]
    (None: a full draft, k); a lookup drafter that finds no match proposes
    nothing, and vLLM's V1 model runner verifies only what was proposed.
    ``padded``: the engine fills the slots the drafter left empty and
    verifies k on every pass (vLLM 0.32's Model Runner V2 for n-gram lookup,
    :attr:`specbench.methods.Method.pads_drafts`), so a miss costs a full
    verification, and more so at large batch, where verification is
    compute-bound.
    """
    k = check_int("k", k, 0)
    if padded or drafted is None:
        return float(k)
    return check_real("drafted", drafted, 0.0, k)


def eagle_head_profile(target: ModelProfile, method: str, head: ModelProfile | None = None) -> ModelProfile:
    """The EAGLE head as a one-layer profile of its own, for pricing and the memory model.

    Its weights are those of :func:`eagle_head_matmul_params` read from the
    head's own shapes (``head``: its config.json; the target's shapes when
    absent) plus its norm vectors, less the LM head EAGLE-1 shares with the
    target (EAGLE-3 brings its own, over draft_vocab_size tokens, and its
    int64 ``d2t`` map; without the head's config, the full vocabulary: an
    upper bound). The embeddings are the target's (vLLM shares them).
    Weights and its one layer of KV cache are at the dtype width
    kv_bytes_per_element: heads ship unquantized.
    """
    if method not in EAGLE_FC_INPUTS:
        raise ValueError(f"method must be one of {', '.join(EAGLE_FC_INPUTS)}; got {method!r}")
    shapes = head or target
    params = eagle_head_matmul_params(method, shapes) + _EAGLE_NORMS[method] * shapes.hidden_size
    if method == "eagle":
        params -= eagle_head_lm_params(method, shapes)
    elif shapes.draft_vocab_size:
        # d2t: one int64 offset per draft token, counted in units of the weight width.
        params += round(shapes.draft_vocab_size * 8 / target.kv_bytes_per_element)
    return replace(
        shapes,
        name=f"{method} head for {target.name}",
        num_params=params,
        num_layers=1,
        bytes_per_weight=target.kv_bytes_per_element,
        kv_bytes_per_element=target.kv_bytes_per_element,
    )


def eagle_head_lm_params(method: str, head: ModelProfile) -> int:
    """Weights of the LM head an EAGLE draft step reads: the full vocabulary, or EAGLE-3's own."""
    vocab = (head.draft_vocab_size or head.vocab_size) if method == "eagle3" else head.vocab_size
    return vocab * head.hidden_size


def eagle_head_work(
    method: str,
    head: ModelProfile,
    target: ModelProfile,
    *,
    num_tokens: float,
    num_seqs: int,
    context_len: float,
    logits: float,
) -> PassWork:
    """What one head pass over num_tokens tokens moves and computes, logits read at ``logits`` of them.

    Weights at the dtype width kv_bytes_per_element (heads ship unquantized),
    plus the head's one layer of KV cache per sequence.
    """
    matmul_params = eagle_head_matmul_params(method, head)
    lm_params = eagle_head_lm_params(method, head)
    return PassWork(
        weight_bytes=matmul_params * target.kv_bytes_per_element,
        kv_bytes=num_seqs * context_len * target.kv_bytes_per_token / target.num_layers,
        # fc and the layer run on every token; the LM head only where logits are read.
        linear_flops=num_tokens * 2.0 * (matmul_params - lm_params) + logits * 2.0 * lm_params,
        attention_flops=num_tokens * 4.0 * context_len * head.num_attention_heads * head.head_dim,
        num_seqs=num_seqs,
        num_layers=1,
    )


def eagle_head_matmul_params(method: str, head: ModelProfile) -> int:
    """Weights one EAGLE draft step multiplies by, from the head's shapes.

    eagle: fc over [embedding; state] (2 * hidden^2), one decoder layer
    (layer_matmul_params), and the target's full LM head (vocab * hidden:
    for SmolLM2-135M about a fifth of the target's parameters). eagle3: fc
    over three target states (3 * hidden^2), a decoder layer whose q/k/v read
    [embedding; state] (q/k/v weights doubled), and the head's own LM head
    over draft_vocab_size tokens.
    """
    hidden = head.hidden_size
    layer = head.layer_matmul_params
    if method == "eagle3":
        layer += hidden * (head.num_attention_heads + 2 * head.num_kv_heads) * head.head_dim
    return EAGLE_FC_INPUTS[method] * hidden * hidden + layer + eagle_head_lm_params(method, head)
