"""EAGLE-1 and EAGLE-3 draft heads in plain PyTorch, computing exactly what vLLM computes.

vLLM 0.32 is the contract (``model_executor/models/llama_eagle.py``,
``llama_eagle3.py``, ``v1/spec_decode/llm_base_proposer.py``):

EAGLE-1, fed the target's post-final-norm state ``h[t]`` and the token ``t+1``::

    x   = fc([E(tok[t+1]); h[t]])              # no input_layernorm
    a   = x + Attn(x)
    out = a + MLP(RMSNorm(a))                  # no final norm
    logits = lm_head(out)                      # the target's (tied) LM head
    # `out` is fed back as h for the next draft position

EAGLE-3, fed the concatenated residual states after target layers (2, n/2, n-3)::

    g   = fc([r2; r15; r27])                   # combine_hidden_states, once per target pass
    z   = [RMSNorm_in(E(tok[t+1])); RMSNorm_hidden(g)]    # q/k/v take 2 x hidden
    a   = g + Attn(z)                          # norm_before_residual = false
    r   = a + MLP(RMSNorm(a))
    logits = lm_head_draft(RMSNorm_final(r))   # reduced vocabulary; target id = i + d2t[i]
    # the pre-norm `r` is fed back as g for the next draft position

Both heads attend, through their own KV cache, over every earlier position of
the request, whose entries vLLM computes from the target's true states; only
the current chain runs on the head's own outputs. :func:`unroll` trains and
evaluates under exactly that attention pattern ("training-time test"): draft
step ``s`` at index ``i`` sees step-0 keys at indices ``<= i`` and the keys of
steps ``1..s`` at index ``i`` itself (the chain that started at ``i``), at
position ``i + s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

EAGLE = "eagle"
EAGLE3 = "eagle3"
METHODS = (EAGLE, EAGLE3)


@dataclass(frozen=True)
class TargetShape:
    """The shapes of a Llama-style target that its head must match, from ``config.json``."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_layers: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TargetShape:
        """Read the shapes from a Hugging Face ``config.json`` dict."""
        rope = config.get("rope_parameters") or {}
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        heads = config["num_attention_heads"]
        return cls(
            hidden_size=config["hidden_size"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            num_layers=config["num_hidden_layers"],
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=float(theta),
        )

    def aux_layers(self) -> tuple[int, int, int]:
        """vLLM's default EAGLE-3 feature layers: residual states after layers 2, n/2 and n-3."""
        n = self.num_layers
        return (2, n // 2, n - 3)


class RMSNorm(nn.Module):
    """RMS normalisation as vLLM computes it (in float32, then scaled)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension."""
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class DecoderLayer(nn.Module):
    """One Llama decoder layer with vLLM's parameter names; q/k/v may take a wider input."""

    def __init__(self, shape: TargetShape, qkv_input: int, eagle3: bool) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.shape = shape
        self.q_proj = nn.Linear(qkv_input, shape.num_heads * d, bias=False)
        self.k_proj = nn.Linear(qkv_input, shape.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(qkv_input, shape.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * d, h, bias=False)
        self.gate_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, shape.rms_norm_eps)
        if eagle3:
            self.input_layernorm = RMSNorm(h, shape.rms_norm_eps)
            self.hidden_norm = RMSNorm(h, shape.rms_norm_eps)

    def qkv(self, z: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rotated queries and keys and the values of input ``z`` [B, L, in] at ``positions`` [L]."""
        b, n, _ = z.shape
        d = self.shape.head_dim
        q = self.q_proj(z).view(b, n, self.shape.num_heads, d).transpose(1, 2)
        k = self.k_proj(z).view(b, n, self.shape.num_kv_heads, d).transpose(1, 2)
        v = self.v_proj(z).view(b, n, self.shape.num_kv_heads, d).transpose(1, 2)
        cos, sin = _rotary(positions, d, self.shape.rope_theta, z.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def mlp_block(self, a: torch.Tensor) -> torch.Tensor:
        """``a + MLP(RMSNorm(a))``."""
        n = self.post_attention_layernorm(a)
        return a + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


def _rotary(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Neox-style rotary (rotate_half), as vLLM's Llama uses.
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DraftHead(nn.Module):
    """An EAGLE-1 or EAGLE-3 head. The target's embedding (and, for EAGLE-1, LM head) stay frozen outside.

    Args:
        method: ``eagle`` or ``eagle3``.
        shape: the target's shapes.
        draft_vocab: for EAGLE-3, the target token ids of the draft vocabulary
            (``d2t[i] = draft_vocab[i] - i``); ignored for EAGLE-1.
    """

    def __init__(self, method: str, shape: TargetShape, draft_vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"method={method!r} is not one of {', '.join(METHODS)}")
        self.method = method
        self.shape = shape
        h = shape.hidden_size
        if method == EAGLE:
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.layer = DecoderLayer(shape, h, eagle3=False)
        else:
            assert draft_vocab is not None, "EAGLE-3 needs a draft vocabulary"
            self.fc = nn.Linear(3 * h, h, bias=False)
            self.layer = DecoderLayer(shape, 2 * h, eagle3=True)
            self.norm = RMSNorm(h, shape.rms_norm_eps)
            self.lm_head = nn.Linear(h, len(draft_vocab), bias=False)
            self.register_buffer("draft_vocab", draft_vocab.to(torch.long), persistent=False)

    def first_hidden(self, features: torch.Tensor) -> torch.Tensor:
        """The hidden input of draft step 0 from the target's features ([B, L, h] or [B, L, 3h])."""
        return self.fc(features) if self.method == EAGLE3 else features

    def inputs(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention input and the residual of one draft step."""
        if self.method == EAGLE:
            x = self.fc(torch.cat((embeds, hidden), dim=-1))
            return x, x
        z = torch.cat((self.layer.input_layernorm(embeds), self.layer.hidden_norm(hidden)), dim=-1)
        return z, hidden

    def outputs(self, attn: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the state fed back to the next step, the state the LM head reads)."""
        r = self.layer.mlp_block(residual + self.layer.o_proj(attn))
        return r, (r if self.method == EAGLE else self.norm(r))


def unroll(
    head: DraftHead,
    embed: nn.Embedding,
    tokens: torch.Tensor,
    features: torch.Tensor,
    steps: int,
    start: int = 0,
) -> list[torch.Tensor]:
    """Run ``steps`` chained draft steps from every index ``>= start`` at once, as vLLM would draft them.

    Args:
        head: the draft head.
        embed: the target's (frozen) token embedding.
        tokens: [B, L] token ids, right-padded.
        features: [B, L, f] the target's features at each position (EAGLE-1: the
            post-norm state; EAGLE-3: the three residual states concatenated).
        steps: chain length (K).
        start: the first chain whose later steps are computed. Step 0 runs at
            every index (its keys are the head's KV cache over the whole
            request, as vLLM's prefill of the head writes them), but chains
            that start in the prompt are never drafted in serving, and with
            prompts several times longer than answers skipping their later
            steps is most of a training step's cost.

    Returns:
        For each step ``s``, the state the LM head reads: step 0 at every
        index, [B, L - 1, h], row ``j`` drafting the token at ``j + 2``; step
        ``s > 0`` from ``start`` on, [B, L - 1 - s - start, h], row ``j``
        drafting the token at ``start + j + 2 + s`` from the chain started
        after the target emitted token ``start + j + 1``.
    """
    b, n = tokens.shape
    layer = head.layer
    hidden = head.first_hidden(features[:, : n - 1])
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    heads_out: list[torch.Tensor] = []
    for s in range(steps):
        length = n - 1 - s
        rows = length - (start if s else 0)
        if rows <= 0:
            break
        # Step 0 runs over all indices; later steps over the window [start, length).
        hidden = hidden[:, start:length] if s == 1 else hidden[:, :rows]
        first = 1 + s + (start if s else 0)
        embeds = embed(tokens[:, first : first + rows])
        z, residual = head.inputs(embeds, hidden)
        positions = torch.arange(first - 1, first - 1 + rows)
        q, k, v = layer.qkv(z, positions)
        keys.append(k)
        values.append(v)
        attn = _chain_attention(q, keys, values, head.shape, start if s else 0)
        attn = attn.transpose(1, 2).reshape(b, rows, -1)
        hidden, read = head.outputs(attn, residual)
        heads_out.append(read)
    return heads_out


def chains_from(reads: list[torch.Tensor], start: int) -> list[torch.Tensor]:
    """``unroll``'s reads restricted to the chains from ``start`` on: step 0 sliced, later steps as they are."""
    return [reads[0][:, start:], *reads[1:]]


def _chain_attention(
    q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], shape: TargetShape, start: int
) -> torch.Tensor:
    """Step ``s = len(keys) - 1`` for the chains at ``start ..``: causal over step-0 keys, diagonal over each chain's own."""
    s = len(keys) - 1
    rows = q.shape[2]
    length = start + rows
    own = torch.arange(start, length)
    blocks = [torch.arange(length)[None, :] <= own[:, None]]  # step 0, truncated to this step's indices
    blocks += [torch.eye(rows, dtype=torch.bool)] * s
    mask = torch.cat(blocks, dim=1)
    k = torch.cat([keys[0][:, :, :length], *(key[:, :, :rows] for key in keys[1:])], dim=2)
    v = torch.cat([values[0][:, :, :length], *(value[:, :, :rows] for value in values[1:])], dim=2)
    group = shape.num_heads // shape.num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def head_logits(head: DraftHead, read: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """Logits over the target vocabulary ids the head can propose.

    EAGLE-1 uses the target's LM head (``lm_head_weight``, [V, h]); EAGLE-3
    its own over the draft vocabulary (column ``i`` is target id ``draft_vocab[i]``).
    """
    if head.method == EAGLE:
        return read @ lm_head_weight.T
    return head.lm_head(read)
