"""The target's own greedy answers and hidden states: what a head is trained on.

The target runs in Hugging Face transformers (float32, greedy), which gives
the states vLLM hands to a head: ``hidden_states[-1]`` is the post-final-norm
state (EAGLE-1), and ``hidden_states[l]`` the residual stream after ``l``
layers (EAGLE-3's auxiliary states, vLLM's ``aux_hidden_state_layers``). One
generation pass captures them at every position, prompt and answer alike,
since the head attends over the whole request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

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
def generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int,
    aux_layers: Sequence[int],
    batch_size: int = 32,
    desc: str = "target answers",
) -> list[Example]:
    """Greedy answers of ``model`` to each prompt, with the states at every position.

    Prompts are batched by length (left-padded) and returned in input order.
    An answer ends at EOS (kept) or after ``max_new_tokens``.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    examples: dict[int, Example] = {}
    with tqdm(total=len(prompts), desc=desc, unit="prompt") as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            for i, example in zip(batch, _generate_batch(
                model, [prompts[i] for i in batch], max_new_tokens, eos_token_id, aux_layers
            )):
                examples[i] = example
            bar.update(len(batch))
    return [examples[i] for i in range(len(prompts))]


def _generate_batch(
    model: Any, prompts: list[Sequence[int]], max_new_tokens: int, eos: int, aux_layers: Sequence[int]
) -> list[Example]:
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), eos, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    answers: list[list[int]] = [[] for _ in range(b)]
    finals: list[list[torch.Tensor]] = [[] for _ in range(b)]
    auxes: list[list[torch.Tensor]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    past = None
    step_ids, step_mask = ids, mask
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1] :]
        out = model(
            input_ids=step_ids, attention_mask=mask, position_ids=positions, past_key_values=past,
            use_cache=True, output_hidden_states=True, logits_to_keep=1,
        )
        past = out.past_key_values
        states = out.hidden_states
        aux = torch.cat([states[layer] for layer in aux_layers], dim=-1)
        for row in range(b):
            if done[row]:
                continue
            keep = step_mask[row].bool()
            finals[row].append(states[-1][row, keep])
            auxes[row].append(aux[row, keep])
        next_ids = out.logits[:, -1].argmax(-1)
        for row in range(b):
            if not done[row]:
                answers[row].append(int(next_ids[row]))
                done[row] = bool(next_ids[row] == eos)
        if bool(done.all()):
            break
        step_ids = next_ids[:, None]
        step_mask = (~done).long()[:, None]
        # A finished row keeps attending (its results are ignored) so the cache stays rectangular.
        mask = torch.cat((mask, torch.ones((b, 1), dtype=torch.long)), dim=1)
    examples = []
    for row, prompt in enumerate(prompts):
        tokens = torch.tensor(list(prompt) + answers[row], dtype=torch.long)
        final = torch.cat(finals[row])[: len(tokens) - 1]
        aux = torch.cat(auxes[row])[: len(tokens) - 1]
        examples.append(Example(tokens=tokens, prompt_len=len(prompt), final=final.clone(), aux=aux.clone()))
    return examples
