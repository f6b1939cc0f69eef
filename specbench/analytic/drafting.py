"""Draft cost: what the drafter (a draft model or an EAGLE head) spends per draft step and on
the prompts; prompt lookup (ngram) drafts for free.

Units throughout: seconds, bytes, FLOPs, tokens. Standard library only: the model runs and is
tested without vLLM, torch or a GPU.
"""

from __future__ import annotations


from specbench.analytic.checks import check_int, check_method, check_real
from specbench.analytic.profiles import HardwareProfile, ModelProfile
from specbench.analytic.steps import PassWork, pass_work, prefill_steps, roofline_time


EAGLE_FC_INPUTS = {"eagle": 2, "eagle3": 3}


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
    """Seconds the drafter spends on the prompts, beside the target's own prefill.

    A draft model prefills every prompt as the target does (the work of
    :func:`prefill_time` of ``draft``); an EAGLE head runs its layer and fc
    over every prompt token (it needs their hidden states before it can
    propose) and its LM head read at each prompt's last position, priced
    from the head's own shapes (``draft``, its profile; the target's shapes
    when absent) as :func:`draft_time` prices a draft step. Either runs in
    the same engine steps as the target, so each of its passes pays
    ``hw.draft_pass_overhead_s``, not a step's fixed overhead. ngram and
    plain decoding: 0.
    """
    check_method(method)
    if method in ("baseline", "ngram"):
        return 0.0
    steps, num_tokens = prefill_steps(batch_size, prompt_len, max_step_tokens)
    if method == "draft_model":
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        work = pass_work(draft, num_tokens, batch_size, prompt_len / 2.0, logits=batch_size / steps)
    elif target is None:
        raise ValueError(f"target must be given for method {method!r}")
    else:
        work = eagle_head_work(
            method, draft or target, target, num_tokens=num_tokens, num_seqs=batch_size,
            context_len=prompt_len / 2.0, logits=batch_size / steps,
        )
    return steps * roofline_time(hw, work, draft=True)




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
    """Seconds the draft spends proposing k tokens for each of batch_size sequences.

    baseline: 0. ngram: 0, assuming the CPU-side prompt lookup is negligible
    next to a GPU forward pass. draft_model: k sequential passes of `draft`,
    each the work of step_time(draft, num_tokens=num_seqs=batch_size). eagle / eagle3: k
    passes of the head (see :func:`eagle_head_matmul_params`: one decoder
    layer with its own one-layer KV cache, the fc layer, and the LM head the
    head reads: the target's full vocabulary for EAGLE-1, the head's own
    reduced one for EAGLE-3). `draft` is the head's profile (its config.json:
    the target's shapes with one layer, plus draft_vocab_size); without it
    the head is assumed to have the target's shapes and full vocabulary.
    Head weights cost the dtype width kv_bytes_per_element, not the target's
    bytes_per_weight, because heads ship unquantized. Every draft pass pays
    ``hw.draft_pass_overhead_s`` (a pass inside the engine step, which has
    already paid the scheduler and sampler once).
    """
    check_method(method)
    batch_size = check_int("batch_size", batch_size, 1)
    k = check_int("k", k, 0)
    context_len = check_real("context_len", context_len, 0.0)
    if method in ("baseline", "ngram") or k == 0:
        return 0.0
    if method == "draft_model":
        if draft is None:
            raise ValueError("draft must be given for method 'draft_model'")
        work = pass_work(draft, batch_size, batch_size, context_len)
    elif target is None:
        raise ValueError(f"target must be given for method {method!r}")
    else:
        work = eagle_head_work(
            method, draft or target, target, num_tokens=batch_size, num_seqs=batch_size,
            context_len=context_len, logits=batch_size,
        )
    return k * roofline_time(hw, work, draft=True)


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
