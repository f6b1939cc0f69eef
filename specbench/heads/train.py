"""Self-distil an EAGLE-1 or EAGLE-3 head from its target, on CPU, deterministically.

The recipe, scaled to a 135M target and two CPU cores:

- data: the human-written prompts of :mod:`specbench.heads.human`, answered
  by the target itself (greedy, float32, vLLM), with its states at every
  position (:mod:`specbench.heads.features`); whole source documents are held
  out, and the checkpoint kept is the epoch with the best held-out acceptance;
- objective, at every position vLLM drafts from (the target has emitted an
  answer token) and for each of ``steps`` chained draft steps run on the
  head's own outputs (training-time test, as EAGLE-3), ``steps`` at least the
  K served: cross-entropy toward the target's distribution two ahead (soft,
  as SpecForge trains; or toward its greedy token); EAGLE-1 adds EAGLE's
  smooth-L1 regression of its output onto the target's next post-norm state
  (weight 0.1), which keeps its fed-back state in the distribution the
  target's LM head reads; with ``prompt_weight``, step 0 learns the target's
  distribution in the prompts too (their states are computed anyway);
- EAGLE-3's draft vocabulary: the training answers' most frequent tokens, its
  size chosen by coverage of the held-out answers under a checkpoint size cap
  (:func:`choose_vocabulary`); EAGLE-1's cross-entropy runs over the tokens
  the corpus uses, not all 49k (a sampled softmax: it sets an epoch's cost);
- AdamW (0.9, 0.95), gradient clip 0.5, linear warm-up and decay, peak
  learning rate 2e-3 (EAGLE-1: 3e-4, see :class:`TrainSettings`);
- initialisation from the target: a decoder layer that starts as the
  identity, the feature projection as an identity on the target's state
  (EAGLE-3: on the deepest of its three), EAGLE-3's LM head from the tied
  embedding rows of its draft vocabulary; or from a trained head
  (``warm_start``);
- state written after every epoch: a stopped run resumes where it stopped.

The held-out estimate simulates chain drafting exactly as vLLM runs it and
reports the acceptance length (1 + accepted per draft) at K = ``eval_k``.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specbench.heads.features import Example, save_atomically
from specbench.heads.modules import EAGLE, EAGLE3, DraftHead, TargetShape, chains_from, head_logits, unroll


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters; every field is recorded in the head's manifest."""

    steps: int = 4            # chained draft steps trained: at least the K served, or the last position goes untrained
    eval_k: int = 4           # K of the held-out chain-drafting estimate
    epochs: int = 10
    # Peak learning rate. EAGLE-1's output goes straight into the target's
    # tied LM head, whose logits are sharp: at 2e-3 its loss diverges (25 -> 100
    # within 80 steps), at 3e-4 it falls. EAGLE-3 reads its own LM head: 2e-3.
    lr: float = 2e-3
    batch_tokens: int = 1024  # padded tokens per optimiser step: many small steps beat few large ones here
    # EAGLE-3's reduced vocabulary; None: the smallest of VOCABULARY_SIZES that covers the held-out
    # answers within VOCABULARY_TOLERANCE of the largest (choose_vocabulary).
    draft_vocab_size: int | None = None
    # EAGLE-1's smooth-L1 term: it keeps the fed-back state near the target's;
    # the cross-entropy, which acceptance depends on, leads.
    feature_weight: float = 0.1
    ce_weight: float = 1.0        # EAGLE-1 cross-entropy term (EAGLE-3 uses 1 alone)
    step_decay: float = 0.8       # weight of chained step s: step_decay ** s
    # Weight of step 0's loss in the prompt (a term of its own, beside the answer's steps): the target's
    # distribution at human-written text (the shipped corpus has 2.1 prompt tokens to every answer token)
    # whose states are computed anyway, for about 30% more time per epoch.
    # Measured (same warm start, data and seed): held-out acceptance 1.573 at 0, 1.594 at 0.5.
    prompt_weight: float = 0.5
    # soft: cross-entropy against the target's distribution over the draft vocabulary (as SpecForge
    # trains); hard: against its greedy token alone.
    loss: str = "soft"
    # EAGLE-3's checkpoint size cap (bfloat16): its LM head grows with the vocabulary, and the heads shipped
    # together stay within 30 MB (EAGLE-1's is 8.4 MB). It bounds the vocabulary sizes choose_vocabulary weighs.
    max_checkpoint_bytes: int | None = 20_000_000
    seed: int = 0

    @classmethod
    def for_method(cls, method: str, **overrides: Any) -> TrainSettings:
        """The defaults for ``method`` (EAGLE-1's lower learning rate), with ``overrides``."""
        defaults: dict[str, Any] = {"lr": 3e-4} if method == EAGLE else {}
        return cls(**(defaults | overrides))


VOCABULARY_SIZES = (4096, 8192, 12288, 16384, 24576)
VOCABULARY_TOLERANCE = 0.01  # of held-out answer tokens: a bigger head costs every draft step more


@dataclass
class TrainResult:
    """What training reached: the curve, the held-out estimate of the epoch kept, the settings it ran with."""

    acceptance_length: float
    accepted_per_position: list[float]
    settings: TrainSettings
    curve: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    best_epoch: int = 0
    vocabulary: dict[str, Any] = field(default_factory=dict)


def draft_vocabulary(examples: list[Example], size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` answer tokens the target emits most often (ties by id), sorted by id."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for example in examples:
        counts += torch.bincount(example.answer, minlength=vocab_size)
    # Stable order: descending count, then ascending id.
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def coverage(vocab: torch.Tensor, examples: list[Example], vocab_size: int) -> dict[str, float]:
    """Shares of ``examples``' answer tokens that ``vocab`` holds: all of them, and those the answer copies from its prompt.

    A head can draft only tokens of its vocabulary, so this bounds its
    acceptance at every position; copied tokens (names, figures) are where a
    small vocabulary fails first.
    """
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[vocab] = True
    total = held = copied = copied_held = 0
    for example in examples:
        answer = example.answer
        in_prompt = torch.zeros(vocab_size, dtype=torch.bool)
        in_prompt[example.tokens[: example.prompt_len]] = True
        is_copy = in_prompt[answer]
        total += len(answer)
        held += int(inside[answer].sum())
        copied += int(is_copy.sum())
        copied_held += int((inside[answer] & is_copy).sum())
    return {"answers": held / max(1, total), "copied": copied_held / max(1, copied)}


def choose_vocabulary(
    train_set: list[Example], held_out: list[Example], vocab_size: int, size: int | None = None,
    largest: int | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """EAGLE-3's draft vocabulary from the training answers, at ``size`` or by held-out coverage.

    Each size of :data:`VOCABULARY_SIZES` keeps the training answers' most
    frequent tokens and is measured on the held-out answers (never on an
    evaluation prompt); without ``size``, the smallest within
    :data:`VOCABULARY_TOLERANCE` of the best coverage among sizes up to
    ``largest`` (the checkpoint's size cap) is chosen.
    """
    sizes = sorted({*VOCABULARY_SIZES, *([size] if size else [])})
    measured = {n: coverage(draft_vocabulary(train_set, n, vocab_size), held_out, vocab_size) for n in sizes}
    allowed = [n for n in sizes if largest is None or n <= largest] or sizes[:1]
    best = measured[allowed[-1]]["answers"]
    chosen = size or next(n for n in allowed if measured[n]["answers"] >= best - VOCABULARY_TOLERANCE)
    cap = f" up to {largest} (the checkpoint's size cap)" if largest is not None else ""
    record = {
        "size": chosen,
        "rule": "given" if size else f"smallest of {allowed}{cap} within {VOCABULARY_TOLERANCE:.0%} of the best "
                                     "coverage of the held-out answers",
        "held_out_coverage": {str(n): {k: round(v, 4) for k, v in c.items()} for n, c in measured.items()},
    }
    return draft_vocabulary(train_set, chosen, vocab_size), record


def largest_vocabulary(shape: TargetShape, max_bytes: int | None) -> int | None:
    """The most draft-vocabulary rows an EAGLE-3 checkpoint (bfloat16, with ``d2t``) holds within ``max_bytes``."""
    if max_bytes is None:
        return None
    fixed = sum(p.numel() for name, p in DraftHead(EAGLE3, shape, torch.arange(1)).named_parameters()
                if not name.startswith("lm_head"))
    per_row = 2 * shape.hidden_size + 8  # a bfloat16 LM-head row and its int64 d2t entry
    return max(0, (max_bytes - 2 * fixed) // per_row)


def build_head(
    method: str, shape: TargetShape, target_state: dict[str, torch.Tensor], draft_vocab: torch.Tensor | None,
    warm_start: dict[str, torch.Tensor] | None = None,
) -> DraftHead:
    """A head initialised from its target's weights (see the module docstring), or from another head's.

    The decoder layer starts as the identity (its output projections at zero)
    with the target's middle-layer q/k/v and MLP inputs, so the untrained head
    reads the target's own prediction for the next token: a sane first loss.
    ``warm_start`` (a head's tensors under vLLM's names) replaces that with a
    trained head's weights; EAGLE-3 LM-head rows of tokens the earlier head's
    vocabulary lacks keep the target's embedding rows.
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
        if warm_start is not None:
            _warm_start(head, warm_start)
    return head


def _warm_start(head: DraftHead, tensors: dict[str, torch.Tensor]) -> None:
    for name, parameter in checkpoint_tensors_of(head).items():
        if name == "lm_head.weight":
            earlier = torch.arange(len(tensors["d2t"])) + tensors["d2t"]
            row_of = _index_map(earlier, head.shape.vocab_size)
            rows = row_of[head.draft_vocab]
            kept = rows >= 0
            parameter[kept] = tensors[name][rows[kept]].to(parameter.dtype)
        else:
            parameter.copy_(tensors[name].to(parameter.dtype))


def train(
    method: str,
    shape: TargetShape,
    target_state: dict[str, torch.Tensor],
    train_set: list[Example],
    held_out: list[Example],
    settings: TrainSettings,
    log: Callable[[str], None] = print,
    warm_start: dict[str, torch.Tensor] | None = None,
    state_dir: Path | None = None,
) -> tuple[DraftHead, TrainResult]:
    """Train a head; returns the epoch with the best held-out acceptance, with the curve.

    With ``state_dir``, the run's state (weights, optimiser, schedule, random
    generators, curve, the best epoch so far) is written there after every
    epoch, atomically, and a rerun with the same data and settings resumes
    after the last epoch written: a stopped run loses at most one epoch.
    """
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    embed = torch.nn.Embedding.from_pretrained(target_state["model.embed_tokens.weight"], freeze=True)
    lm_head_weight = target_state.get("lm_head.weight", target_state["model.embed_tokens.weight"])
    vocabulary: dict[str, Any] = {}
    draft_vocab = None
    if method == EAGLE3:
        draft_vocab, vocabulary = choose_vocabulary(train_set, held_out, shape.vocab_size, settings.draft_vocab_size,
                                                    largest_vocabulary(shape, settings.max_checkpoint_bytes))
        settings = replace(settings, draft_vocab_size=len(draft_vocab))
        log(f"draft vocabulary: {len(draft_vocab)} tokens ({vocabulary['rule']}); held-out coverage "
            + ", ".join(f"{n}: {c['answers']:.1%} (copied {c['copied']:.1%})"
                        for n, c in vocabulary["held_out_coverage"].items()))
    head = build_head(method, shape, target_state, draft_vocab, warm_start)
    # The tokens a head's loss ranks: EAGLE-3's vocabulary, or (EAGLE-1's sampled softmax) those the corpus uses.
    ranked = draft_vocab if draft_vocab is not None else torch.unique(torch.cat([e.tokens for e in train_set]))
    to_index = _index_map(ranked, shape.vocab_size)
    ranked_weight = lm_head_weight[ranked]

    prompt_from = shared_prefix_length(train_set)
    batches = _batches(train_set, settings.batch_tokens)
    total = settings.epochs * len(batches)
    optimiser = torch.optim.AdamW(head.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, total // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda i: min((i + 1) / warmup, max(0.0, (total - i) / max(1, total - warmup)))
    )
    result = TrainResult(acceptance_length=0.0, accepted_per_position=[], settings=settings, vocabulary=vocabulary)
    best_state: dict[str, torch.Tensor] = {}
    first_epoch, seconds_before = 0, 0.0
    state_file = state_dir / "state.pt" if state_dir else None
    if state_file is not None and state_file.is_file():
        saved = torch.load(state_file, weights_only=False)
        head.load_state_dict(saved["head"])
        optimiser.load_state_dict(saved["optimiser"])
        scheduler.load_state_dict(saved["scheduler"])
        rng.setstate(saved["rng"])
        torch.set_rng_state(saved["torch_rng"])
        batches = [[train_set[i] for i in batch] for batch in saved["batches"]]
        result.curve, best_state, seconds_before = saved["curve"], saved["best"], saved["seconds"]
        first_epoch = saved["epoch"]
        log(f"resuming after epoch {first_epoch} from {state_file}")
    position = {id(e): i for i, e in enumerate(train_set)}
    started = time.perf_counter()
    with tqdm(total=total, initial=first_epoch * len(batches), desc=f"train {method}", unit="batch") as bar:
        for epoch in range(first_epoch, settings.epochs):
            rng.shuffle(batches)
            running = 0.0
            for batch in batches:
                tokens, features, targets, prompt_lens, lengths = _collate(batch, method)
                start = max(0, int(prompt_lens.min()) - 1)
                reads = unroll(head, embed, tokens, features, settings.steps, start)
                loss = _loss(head, reads, tokens, targets, prompt_lens, lengths, start, settings, to_index,
                             ranked_weight, prompt_from)
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
                optimiser.step()
                scheduler.step()
                running += loss.item()
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
            al, per_pos = estimate_acceptance(head, embed, lm_head_weight, held_out, settings.eval_k)
            point = {"epoch": epoch + 1, "loss": running / len(batches), "held_out_acceptance_length": al,
                     **{f"held_out_position_{i + 1}": p for i, p in enumerate(per_pos)}}
            result.curve.append(point)
            if not best_state or al > max(p["held_out_acceptance_length"] for p in result.curve[:-1]):
                best_state = {k: v.clone() for k, v in head.state_dict().items()}
            if state_file is not None:
                save_atomically({
                    "epoch": epoch + 1, "head": head.state_dict(), "optimiser": optimiser.state_dict(),
                    "scheduler": scheduler.state_dict(), "rng": rng.getstate(), "torch_rng": torch.get_rng_state(),
                    "batches": [[position[id(e)] for e in batch] for batch in batches], "curve": result.curve,
                    "best": best_state, "seconds": seconds_before + time.perf_counter() - started,
                }, state_file)
            log(f"epoch {epoch + 1}: loss {point['loss']:.4f}, held-out acceptance length {al:.3f} (K={settings.eval_k})")
    # Checkpoint selection: the epoch with the best held-out acceptance (held out by document).
    best = max(result.curve, key=lambda p: p["held_out_acceptance_length"])
    head.load_state_dict(best_state)
    result.best_epoch = int(best["epoch"])
    result.acceptance_length = best["held_out_acceptance_length"]
    result.accepted_per_position = [best[f"held_out_position_{i + 1}"] for i in range(settings.eval_k)]
    result.seconds = seconds_before + time.perf_counter() - started
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
        tokens, features, *_ = _collate([example], head.method)
        n = tokens.shape[1]
        # chain from index i drafts positions i+2 .. i+1+k; the target emitted i+1 inside the answer.
        first = max(0, example.prompt_len - 1)
        last = n - 2 - k
        if last < first:
            continue
        reads = unroll(head, embed, tokens, features, k, first)
        alive = torch.ones(last - first + 1, dtype=torch.bool)
        accepted = torch.zeros_like(alive, dtype=torch.long)
        for s, read in enumerate(chains_from(reads, first)):
            logits = head_logits(head, read[0, : last - first + 1], lm_head_weight)
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
    """Right-padded tokens [B, L], features [B, L, f], target states [B, L, h], prompt lengths [B], lengths [B]."""
    n = max(len(e.tokens) for e in batch)
    b = len(batch)
    source = [e.final if method == EAGLE else e.aux for e in batch]
    tokens = torch.zeros((b, n), dtype=torch.long)
    features = torch.zeros((b, n, source[0].shape[-1]))
    targets = torch.zeros((b, n, batch[0].final.shape[-1]))
    for row, (example, feats) in enumerate(zip(batch, source)):
        length = len(example.tokens)
        tokens[row, :length] = example.tokens
        features[row, : length - 1] = feats
        targets[row, : length - 1] = example.final
    prompt_lens = torch.tensor([e.prompt_len for e in batch])
    lengths = torch.tensor([len(e.tokens) for e in batch])
    return tokens, features, targets, prompt_lens, lengths


def _loss(
    head: DraftHead,
    reads: list[torch.Tensor],
    tokens: torch.Tensor,
    targets: torch.Tensor,
    prompt_lens: torch.Tensor,
    lengths: torch.Tensor,
    start: int,
    settings: TrainSettings,
    to_index: torch.Tensor,
    ranked_weight: torch.Tensor,
    prompt_from: int = 0,
) -> torch.Tensor:
    """The chained steps' loss, weighted ``step_decay ** s``, over the chains vLLM drafts.

    A chain at index ``i`` starts once the target has emitted token ``i + 1``
    of the answer (``i >= prompt_len - 1``, as in serving); its step ``s``
    drafts token ``i + 2 + s``, which must lie inside the sequence. Soft loss:
    cross-entropy against the target's own distribution over the ranked
    tokens, read from its post-norm state at ``i + 1 + s`` through its LM head.
    With ``settings.prompt_weight``, step 0 is also trained in the prompt, from
    index ``prompt_from`` (past the chat template every request shares) to
    the prompt's end, as one more term of that weight (see
    :attr:`TrainSettings.prompt_weight`).
    """
    # (the step's reads, the index of their first row, the step, whether the term is the prompt's, its weight)
    terms = [(read, start, s, False, settings.step_decay**s) for s, read in enumerate(chains_from(reads, start))]
    if settings.prompt_weight > 0:
        terms.append((reads[0][:, prompt_from:], prompt_from, 0, True, settings.prompt_weight))
    total = torch.zeros(())
    weights = 0.0
    for read, offset, s, in_prompt, w in terms:
        rows = read.shape[1] - 1  # the last index has no token two ahead
        chain = offset + torch.arange(rows)
        first, last = 2 + s + offset, 2 + s + offset + rows
        labels = tokens[:, first:last]
        index = to_index[labels]
        answered = chain[None, :] >= prompt_lens[:, None] - 1
        valid = (~answered if in_prompt else answered) & (chain[None, :] + 2 + s < lengths[:, None])
        if settings.loss == "hard":
            valid &= index >= 0
        if not bool(valid.any()):
            continue
        chosen = read[:, :rows][valid]
        logits = chosen @ ranked_weight.T if head.method == EAGLE else head.lm_head(chosen)
        state = targets[:, first - 1 : last - 1][valid]
        if settings.loss == "soft":
            with torch.no_grad():
                wanted = torch.softmax(state @ ranked_weight.T, dim=-1)
            ce = -(wanted * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        else:
            ce = F.cross_entropy(logits, index[valid])
        if head.method == EAGLE:
            step_loss = settings.feature_weight * F.smooth_l1_loss(chosen, state) + settings.ce_weight * ce
        else:
            step_loss = ce
        total = total + w * step_loss
        weights += w
    return total / max(weights, 1e-9)


def shared_prefix_length(examples: list[Example]) -> int:
    """How many leading tokens every example shares (the chat template's preamble): nothing to learn there."""
    first = examples[0].tokens
    length = min(len(e.tokens) for e in examples)
    for example in examples[1:]:
        differs = (example.tokens[:length] != first[:length]).nonzero()
        if len(differs):
            length = int(differs[0])
    return length


def checkpoint_tensors(head: DraftHead) -> dict[str, torch.Tensor]:
    """The head's tensors under the names vLLM 0.32 loads (``layers.0.*``, ``fc``, ...)."""
    return {name: t.detach().contiguous() for name, t in checkpoint_tensors_of(head).items()}


def checkpoint_tensors_of(head: DraftHead) -> dict[str, torch.nn.Parameter]:
    """The head's parameters under the names vLLM 0.32 loads."""
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
    return tensors


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
