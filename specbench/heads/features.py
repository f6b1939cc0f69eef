"""The target's own greedy answers and hidden states: what a head is trained on.

The answers come from the target in vLLM (greedy, float32: the decoding a
head's drafts are verified against; the caller passes that generator in, since
only the engine layer imports vLLM). The states come from one
teacher-forced pass of the target in Hugging Face transformers over prompt and
answer: ``hidden_states[-1]`` is the post-final-norm state vLLM hands an
EAGLE-1 head, and ``hidden_states[l]`` the residual stream after ``l`` layers
(EAGLE-3's auxiliary states, vLLM's ``aux_hidden_state_layers``), at every
position, prompt and answer alike, since the head attends over the whole
request. vLLM decodes the answers about three times as fast as transformers
did here (its cache was copied at every step); reading the states in a
separate pass costs back much of that on long prompts (measured: 29 minutes
for the 920 human-written prompts, 106k answer tokens, on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm


@dataclass
class Example:
    """One prompt with the target's greedy answer and its states at each position but the last.

    Attributes:
        tokens: [L] prompt and answer token ids.
        prompt_len: how many of them are the prompt.
        final: [L - 1, h] post-final-norm states (EAGLE-1's input).
        aux: [L - 1, 3h] residual states after the EAGLE-3 layers, concatenated.
    """

    tokens: torch.Tensor
    prompt_len: int
    final: torch.Tensor
    aux: torch.Tensor

    @property
    def answer(self) -> torch.Tensor:
        """The answer's token ids."""
        return self.tokens[self.prompt_len :]


def encode(tokenizer: Any, text: str) -> list[int]:
    """A user message through the chat template, as specbench's workloads submit it."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


@torch.no_grad()
def states(
    model: Any,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    *,
    aux_layers: Sequence[int],
    batch_tokens: int = 4096,
    desc: str = "target states",
) -> list[Example]:
    """The target's states at every position of each prompt followed by its answer.

    Sequences are batched by length (right-padded, so a row's positions and
    causal attention are those of its own unpadded pass) and returned in
    input order.
    """
    sequences = [list(p) + list(a) for p, a in zip(prompts, answers)]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    batches: list[list[int]] = [[]]
    for i in order:
        if batches[-1] and len(sequences[i]) * (len(batches[-1]) + 1) > batch_tokens:
            batches.append([])
        batches[-1].append(i)
    examples: dict[int, Example] = {}
    with tqdm(total=len(sequences), desc=desc, unit="prompt") as bar:
        for batch in batches:
            width = max(len(sequences[i]) for i in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[row, : len(sequences[i])] = 1
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
            final = out.hidden_states[-1]
            aux = torch.cat([out.hidden_states[layer] for layer in aux_layers], dim=-1)
            for row, i in enumerate(batch):
                n = len(sequences[i])
                examples[i] = Example(
                    tokens=torch.tensor(sequences[i], dtype=torch.long), prompt_len=len(prompts[i]),
                    final=final[row, : n - 1].clone(), aux=aux[row, : n - 1].clone(),
                )
            bar.update(len(batch))
    return [examples[i] for i in range(len(sequences))]


def cached_examples(
    prompts: Sequence[Sequence[int]],
    generate: Callable[[list[list[int]]], list[list[int]]],
    model: Any,
    *,
    aux_layers: Sequence[int],
    cache: Path,
    identity: str,
    groups: Sequence[str] | None = None,
    chunk: int = 64,
) -> list[Example]:
    """:func:`states` of the target's answers to ``prompts``, computed and cached a chunk at a time.

    Answers and states are the slow part of training (tens of minutes on CPU),
    and a long job here can be stopped at any moment: each chunk of ``chunk``
    prompts is written, atomically, as soon as it is done, under a name hashed
    from ``identity`` (the target and decoding settings) and the chunk's
    token ids, so a rerun of the same command computes only what is missing.
    A chunk never spans two ``groups`` (labels of consecutive prompts, e.g. the
    corpus's kinds), so a corpus that grows one group at its end reuses every
    chunk of the others. States are stored in float16 (half the memory; they
    are read back as float32).
    """
    cache.mkdir(parents=True, exist_ok=True)
    labels = list(groups) if groups is not None else [""] * len(prompts)
    starts = [i for i in range(len(prompts)) if i == 0 or labels[i] != labels[i - 1]]
    bounds: list[tuple[int, int]] = []
    for first, end in zip(starts, [*starts[1:], len(prompts)]):
        bounds += [(i, min(i + chunk, end)) for i in range(first, end, chunk)]
    examples: list[Example] = []
    for number, (start, stop) in enumerate(bounds, start=1):
        part = [list(p) for p in prompts[start:stop]]
        key = hashlib.sha256(json.dumps([identity, part]).encode()).hexdigest()[:20]
        path = cache / f"chunk-{key}.pt"
        if path.is_file():
            examples += torch.load(path, weights_only=False)
            continue
        desc = f"chunk {number}/{len(bounds)}"
        answers = generate(part)
        done = [_half(e) for e in states(model, part, answers, aux_layers=aux_layers, desc=desc)]
        save_atomically(done, path)
        examples += done
    return examples


def save_atomically(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file: a job stopped mid-write leaves the last whole file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    torch.save(obj, partial)
    os.replace(partial, path)


def _half(example: Example) -> Example:
    return Example(example.tokens, example.prompt_len, example.final.half(), example.aux.half())


def fingerprint(records: list[dict[str, object]]) -> str:
    """sha256 of the corpus as canonical JSON lines: the manifest's data fingerprint."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return digest.hexdigest()
