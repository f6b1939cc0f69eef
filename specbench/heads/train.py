"""Self-distil an EAGLE-1 or EAGLE-3 head from its target, on CPU, deterministically.

The recipe, scaled to a 135M target and two CPU cores:

- data: the corpus prompts of :mod:`specbench.heads.corpus`, answered by the
  target itself (greedy, float32), with its states at every position
  (:mod:`specbench.heads.features`); a seeded tenth is held out;
- objective, at every answer position and for each of ``steps`` chained draft
  steps run on the head's own outputs (training-time test, as EAGLE-3):
  cross-entropy toward the target's token two ahead; EAGLE-1 adds EAGLE's
  smooth-L1 regression of its output onto the target's next post-norm state
  (weight 0.1, cross-entropy 1), which keeps its fed-back state in the
  distribution the target's LM head reads;
- EAGLE-1's cross-entropy runs over the tokens the corpus uses, not all
  49k (a sampled softmax: it sets the cost of an epoch);
- AdamW (0.9, 0.95), gradient clip 0.5, linear warm-up and decay, peak
  learning rate 2e-3 (EAGLE-1: 3e-4, see :class:`TrainSettings`), 10 epochs;
- initialisation from the target: a decoder layer that starts as the
  identity, the feature projection as an identity on the target's state
  (EAGLE-3: on the deepest of its three), EAGLE-3's LM head from the tied
  embedding rows of its draft vocabulary; the untrained head so predicts
  what the target's own state predicts.

The held-out estimate simulates chain drafting exactly as vLLM runs it and
reports the acceptance length (1 + accepted per draft) at K = ``eval_k``.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specbench.heads.features import Example
from specbench.heads.modules import EAGLE, EAGLE3, DraftHead, TargetShape, head_logits, unroll


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters; every field is recorded in the head's manifest."""

    steps: int = 3            # chained draft steps trained
    eval_k: int = 4           # K of the held-out chain-drafting estimate
    epochs: int = 10
    # Peak learning rate. EAGLE-1's output goes straight into the target's
    # tied LM head, whose logits are sharp: at 2e-3 its loss diverges (25 -> 100
    # within 80 steps), at 3e-4 it falls. EAGLE-3 reads its own LM head: 2e-3.
    lr: float = 2e-3
    batch_tokens: int = 1024  # padded tokens per optimiser step: many small steps beat few large ones here
    draft_vocab_size: int = 4096  # EAGLE-3's reduced vocabulary
    # EAGLE-1's smooth-L1 term: it keeps the fed-back state near the target's;
    # the cross-entropy, which acceptance depends on, leads.
    feature_weight: float = 0.1
    ce_weight: float = 1.0        # EAGLE-1 cross-entropy term (EAGLE-3 uses 1 alone)
    step_decay: float = 0.8       # weight of chained step s: step_decay ** s
    seed: int = 0

    @classmethod
    def for_method(cls, method: str, **overrides: Any) -> TrainSettings:
        """The defaults for ``method`` (EAGLE-1's lower learning rate), with ``overrides``."""
        defaults: dict[str, Any] = {"lr": 3e-4} if method == EAGLE else {}
        return cls(**(defaults | overrides))


@dataclass
class TrainResult:
    """What training reached: the curve and the held-out estimate."""

    acceptance_length: float
    accepted_per_position: list[float]
    curve: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def draft_vocabulary(examples: list[Example], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` answer tokens the target emits most often (ties by id), sorted by id."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for example in examples:
        counts += torch.bincount(example.answer, minlength=vocab_size)
    # Stable order: descending count, then ascending id.
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def build_head(
    method: str, shape: TargetShape, target_state: dict[str, torch.Tensor], draft_vocab: torch.Tensor | None
) -> DraftHead:
    """A head initialised from its target's weights (see the module docstring).

    The decoder layer starts as the identity (its output projections at zero)
    with the target's middle-layer q/k/v and MLP inputs, so the untrained head
    reads the target's own prediction for the next token: a sane first loss.
    """
    head = DraftHead(method, shape, draft_vocab)
    h = shape.hidden_size
    middle = f"model.layers.{shape.num_layers // 2}."
    with torch.no_grad():
        layer = head.layer
        for name in ("gate_proj", "up_proj"):
            getattr(layer, name).weight.copy_(target_state[f"{middle}mlp.{name}.weight"])
        layer.o_proj.weight.zero_()
        layer.down_proj.weight.zero_()
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(layer, name)
            proj.weight.zero_()
            # The state half of the input; EAGLE-3's embedding half starts at 0.
            proj.weight[:, -h:].copy_(target_state[f"{middle}self_attn.{name}.weight"])
        layer.post_attention_layernorm.weight.copy_(target_state[f"{middle}post_attention_layernorm.weight"])
        head.fc.weight.zero_()
        head.fc.weight[:, -h:].copy_(torch.eye(h))
        if method == EAGLE3:
            assert draft_vocab is not None
            layer.input_layernorm.weight.copy_(target_state[f"{middle}input_layernorm.weight"])
            layer.hidden_norm.weight.copy_(target_state[f"{middle}input_layernorm.weight"])
            head.norm.weight.copy_(target_state["model.norm.weight"])
            head.lm_head.weight.copy_(target_state["model.embed_tokens.weight"][draft_vocab])
    return head


def train(
    method: str,
    shape: TargetShape,
    target_state: dict[str, torch.Tensor],
    train_set: list[Example],
    held_out: list[Example],
    settings: TrainSettings,
    log: Callable[[str], None] = print,
) -> tuple[DraftHead, TrainResult]:
    """Train a head; returns it with its training curve and held-out acceptance."""
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    embed = torch.nn.Embedding.from_pretrained(target_state["model.embed_tokens.weight"], freeze=True)
    lm_head_weight = target_state.get("lm_head.weight", target_state["model.embed_tokens.weight"])
    draft_vocab = (
        draft_vocabulary(train_set, settings.draft_vocab_size, shape.vocab_size) if method == EAGLE3 else None
    )
    head = build_head(method, shape, target_state, draft_vocab)
    # EAGLE-1's sampled softmax: the tokens the corpus uses.
    used = torch.unique(torch.cat([e.tokens for e in train_set]))
    to_draft = _index_map(draft_vocab if draft_vocab is not None else used, shape.vocab_size)
    out_weight = lm_head_weight[used] if method == EAGLE else None

    batches = _batches(train_set, settings.batch_tokens)
    total = settings.epochs * len(batches)
    optimiser = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, total // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda i: min((i + 1) / warmup, max(0.0, (total - i) / max(1, total - warmup)))
    )
    result = TrainResult(acceptance_length=0.0, accepted_per_position=[])
    started = time.perf_counter()
    with tqdm(total=total, desc=f"train {method}", unit="batch") as bar:
        for epoch in range(settings.epochs):
            rng.shuffle(batches)
            running = 0.0
            for batch in batches:
                tokens, features, targets, answer = _collate(batch, method)
                reads = unroll(head, embed, tokens, features, settings.steps)
                loss = _loss(head, reads, tokens, targets, answer, settings, to_draft, out_weight)
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
                optimiser.step()
                scheduler.step()
                running += loss.item()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            al, per_pos = estimate_acceptance(head, embed, lm_head_weight, held_out, settings.eval_k)
            point = {"epoch": epoch + 1, "loss": running / len(batches), "held_out_acceptance_length": al}
            result.curve.append(point)
            log(f"epoch {epoch + 1}: loss {point['loss']:.4f}, held-out acceptance length {al:.3f} (K={settings.eval_k})")
    result.acceptance_length, result.accepted_per_position = al, per_pos
    result.seconds = time.perf_counter() - started
    return head, result


@torch.no_grad()
def estimate_acceptance(
    head: DraftHead, embed: torch.nn.Embedding, lm_head_weight: torch.Tensor, examples: list[Example], k: int
) -> tuple[float, list[float]]:
    """Offline chain drafting on ``examples``: acceptance length at K=``k`` and per-position rates.

    From every answer position where the target has just emitted a token, the
    head drafts ``k`` tokens on its own outputs; the draft is accepted up to
    the first token that differs from the target's greedy answer. Acceptance
    length = 1 + mean accepted, over chains with all ``k`` positions inside
    the answer, as vLLM counts it over steps that carried a draft.
    """
    head.eval()
    accepted_total = 0
    chains = 0
    per_position = [0] * k
    for example in examples:
        tokens, features, _, _ = _collate([example], head.method)
        reads = unroll(head, embed, tokens, features, k)
        n = tokens.shape[1]
        # chain from index i drafts positions i+2 .. i+1+k; the target emitted i+1 inside the answer.
        first = max(0, example.prompt_len - 1)
        last = n - 2 - k
        if last < first:
            continue
        alive = torch.ones(last - first + 1, dtype=torch.bool)
        accepted = torch.zeros_like(alive, dtype=torch.long)
        for s, read in enumerate(reads):
            logits = head_logits(head, read[0, first : last + 1], lm_head_weight)
            guess = logits.argmax(-1)
            if head.method == EAGLE3:
                guess = head.draft_vocab[guess]
            right = guess == tokens[0, first + 2 + s : last + 3 + s]
            alive &= right
            accepted += alive.long()
            per_position[s] += int(alive.sum())
        accepted_total += int(accepted.sum())
        chains += last - first + 1
    head.train()
    if chains == 0:
        return 1.0, [0.0] * k
    return 1.0 + accepted_total / chains, [p / chains for p in per_position]


def _index_map(vocab: torch.Tensor, size: int) -> torch.Tensor:
    """Target id -> index in ``vocab``, -1 where absent."""
    mapping = torch.full((size,), -1, dtype=torch.long)
    mapping[vocab] = torch.arange(len(vocab))
    return mapping


def _batches(examples: list[Example], batch_tokens: int) -> list[list[Example]]:
    ordered = sorted(examples, key=lambda e: len(e.tokens))
    batches: list[list[Example]] = []
    current: list[Example] = []
    for example in ordered:
        width = max([len(e.tokens) for e in current] + [len(example.tokens)])
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(example)
    if current:
        batches.append(current)
    return batches


def _collate(batch: list[Example], method: str) -> tuple[torch.Tensor, ...]:
    """Right-padded tokens [B, L], features [B, L, f], regression targets [B, L, h], answer mask [B, L]."""
    n = max(len(e.tokens) for e in batch)
    b = len(batch)
    source = [e.final if method == EAGLE else e.aux for e in batch]
    tokens = torch.zeros((b, n), dtype=torch.long)
    features = torch.zeros((b, n, source[0].shape[-1]))
    targets = torch.zeros((b, n, batch[0].final.shape[-1]))
    answer = torch.zeros((b, n), dtype=torch.bool)
    for row, (example, feats) in enumerate(zip(batch, source)):
        length = len(example.tokens)
        tokens[row, :length] = example.tokens
        features[row, : length - 1] = feats
        targets[row, : length - 1] = example.final
        answer[row, example.prompt_len : length] = True
    return tokens, features, targets, answer


def _loss(
    head: DraftHead,
    reads: list[torch.Tensor],
    tokens: torch.Tensor,
    targets: torch.Tensor,
    answer: torch.Tensor,
    settings: TrainSettings,
    to_index: torch.Tensor,
    out_weight: torch.Tensor | None,
) -> torch.Tensor:
    total = torch.zeros(())
    weights = 0.0
    for s, read in enumerate(reads):
        length = read.shape[1] - 1  # the last index has no token two ahead
        labels = tokens[:, 2 + s : 2 + s + length]
        index = to_index[labels]
        valid = answer[:, 2 + s : 2 + s + length] & (index >= 0)
        if not bool(valid.any()):
            continue
        chosen = read[:, :length][valid]
        if head.method == EAGLE:
            logits = chosen @ out_weight.T
            ce = F.cross_entropy(logits, index[valid])
            feature = F.smooth_l1_loss(chosen, targets[:, 1 + s : 1 + s + length][valid])
            step_loss = settings.feature_weight * feature + settings.ce_weight * ce
        else:
            step_loss = F.cross_entropy(head.lm_head(chosen), index[valid])
        w = settings.step_decay**s
        total = total + w * step_loss
        weights += w
    return total / max(weights, 1e-9)


def checkpoint_tensors(head: DraftHead) -> dict[str, torch.Tensor]:
    """The head's tensors under the names vLLM 0.32 loads (``layers.0.*``, ``fc``, ...)."""
    layer = head.layer
    tensors = {"fc.weight": head.fc.weight}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors[f"layers.0.self_attn.{name}.weight"] = getattr(layer, name).weight
    for name in ("gate_proj", "up_proj", "down_proj"):
        tensors[f"layers.0.mlp.{name}.weight"] = getattr(layer, name).weight
    tensors["layers.0.post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    if head.method == EAGLE3:
        tensors["layers.0.input_layernorm.weight"] = layer.input_layernorm.weight
        tensors["layers.0.hidden_norm.weight"] = layer.hidden_norm.weight
        tensors["norm.weight"] = head.norm.weight
        tensors["lm_head.weight"] = head.lm_head.weight
    return {name: t.detach().contiguous() for name, t in tensors.items()}


def head_config(method: str, target_config: dict[str, Any], shape: TargetShape, draft_vocab_size: int | None) -> dict[str, Any]:
    """The head's ``config.json``: the target's, one layer, plus EAGLE-3's keys."""
    config = {k: v for k, v in target_config.items() if not k.startswith("_")}
    config.update(architectures=["LlamaForCausalLM"], num_hidden_layers=1)
    if method == EAGLE3:
        config.update(
            draft_vocab_size=draft_vocab_size,
            tie_word_embeddings=False,
            eagle_aux_hidden_state_layer_ids=list(shape.aux_layers()),
            norm_before_residual=False,
            target_hidden_size=shape.hidden_size,
        )
    return config


def save(
    folder: Path,
    head: DraftHead,
    config: dict[str, Any],
    manifest: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """Write ``config.json``, ``model.safetensors`` (in ``dtype``, plus ``d2t``) and ``manifest.json``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.to(dtype) for name, t in checkpoint_tensors(head).items()}
    if head.method == EAGLE3:
        vocab = head.draft_vocab
        tensors["d2t"] = (vocab - torch.arange(len(vocab))).to(torch.long)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def split_held_out(examples: list[Example], share: float, seed: int) -> tuple[list[Example], list[Example]]:
    """A seeded (train, held-out) split."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    cut = max(1, math.floor(len(examples) * share))
    held = set(order[:cut])
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def compare_with_file(loaded: dict[str, torch.Tensor], folder: Path) -> list[str]:
    """Problems between a head as vLLM loaded it and its ``model.safetensors``; empty when identical.

    ``loaded`` maps vLLM's parameter names (``model.layers.0.self_attn.qkv_proj.weight``,
    ``draft_id_to_target_id``, ...) to tensors; vLLM stacks q/k/v and gate/up,
    so those are compared with the file's tensors concatenated. Every loaded
    tensor must equal the file's (cast to its dtype) and every file tensor
    must have been used.
    """
    from safetensors.torch import load_file

    stored = load_file(str(Path(folder) / "model.safetensors"))
    stacked = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    used: set[str] = set()
    problems = []
    for name, tensor in sorted(loaded.items()):
        if name == "draft_id_to_target_id":
            sources = ["d2t"]
        else:
            bare = name.removeprefix("model.")
            parent, _, leaf = bare.rpartition(".")
            module = parent.rpartition(".")[2]
            prefix = parent.rpartition(".")[0]
            sources = ([f"{prefix}.{part}.{leaf}" for part in stacked[module]] if module in stacked else [bare])
        missing = [s for s in sources if s not in stored]
        if missing:
            problems.append(f"{name}: not in the file (looked for {', '.join(missing)})")
            continue
        used.update(sources)
        expected = torch.cat([stored[s] for s in sources]).to(tensor.dtype)
        if expected.shape != tensor.shape or not torch.equal(expected, tensor):
            problems.append(f"{name}: differs from the file ({tuple(tensor.shape)} loaded, {tuple(expected.shape)} stored)")
    problems += [f"{name}: in the file but not loaded" for name in sorted(set(stored) - used)]
    return problems
