"""How a cell samples: temperature, top_p, top_k, and the seed of every request.

Temperature 0 is greedy decoding, today's path: outputs are compared token
for token (:mod:`specbench.results.exactness`). Above 0 each request draws
with its own seed (:func:`request_seed`), so a cell is reproducible, and
exactness is a matter of distribution (:mod:`specbench.results.distribution`).
The keys are top-level in conf/config.yaml; a key left at its greedy default
stays out of a cell's identity, so every greedy cell keeps its config hash.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

# The greedy defaults (vLLM's SamplingParams: top_p 1.0 and top_k 0 disable those filters;
# top_k -1 disables it too, and is accepted as vLLM accepts it).
DEFAULTS: dict[str, float | int] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
KEYS = tuple(DEFAULTS)

# Request seeds: the cell's seed times this stride plus the request's index. The untimed
# distribution check draws with hashed 60-bit seeds of its own (:func:`distribution_seed`).
SEED_STRIDE = 1_000_000
SEED_RULE = f"seed * {SEED_STRIDE} + request index"
# The distribution check compares output positions from this one on. Position 0 is the prefill's
# token: both engines draw it from the prompt's logits with the target's own sampler, before any
# draft, so its counts are noise to the comparison. (On 2026-12-02 one prompt's first token was 3.3
# standard errors apart between a baseline and an ngram engine drawing from the same logits.)
FIRST_CHECKED_POSITION = 1


@dataclass(frozen=True)
class Sampling:
    """One cell's sampling settings (what vLLM's SamplingParams gets besides max_tokens and the seed)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # vLLM's min_tokens: no stop token before this many output tokens (0: none). Set for timed sampled
    # requests only (:meth:`timed`).
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        """Temperature 0: the target's argmax, whatever top_p and top_k say."""
        return self.temperature == 0.0

    def params(self) -> dict[str, Any]:
        """Keyword arguments for vLLM's SamplingParams (greedy: temperature 0 alone)."""
        if self.greedy:
            return {"temperature": 0.0}
        found: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return found | ({"min_tokens": self.min_tokens} if self.min_tokens else {})

    def timed(self, max_tokens: int) -> Sampling:
        """The settings of a timed request: a sampled one runs to ``max_tokens`` (min_tokens = max_tokens).

        One generate() call serves a batch, and its wall time is set by the
        longest request: sampled requests that stop where their draws happen to
        end give a cell and its baseline batches of unequal work, and since each
        request's seed repeats in every engine run the bias is the same in each
        and invisible to the interval (at batch 8, one request stopping at token
        20 of 128 read as 0.89x at equal speed). vLLM 0.32 masks the stop tokens
        until min_tokens, in the rejection sampler's draft positions as well
        (``MinTokensLogitsProcessor.apply_with_spec_decode``). Greedy requests
        still stop at EOS: their exactness check compares tokens.
        """
        return self if self.greedy else replace(self, min_tokens=max_tokens)


GREEDY = Sampling()


def from_config(plain: Mapping[str, Any]) -> Sampling:
    """The sampling settings of a resolved cell config (or of its identity); missing keys are defaults."""
    return Sampling(
        temperature=float(plain.get("temperature", DEFAULTS["temperature"])),
        top_p=float(plain.get("top_p", DEFAULTS["top_p"])),
        top_k=int(plain.get("top_k", DEFAULTS["top_k"])),
    )


def identity_keys(plain: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling keys that join a cell's identity: those away from their greedy defaults.

    At temperature 0 top_p and top_k change nothing (vLLM takes the argmax),
    so they stay out too: a greedy cell has the identity it had before these
    keys existed.
    """
    sampling = from_config(plain)
    if sampling.greedy:
        return {}
    found: dict[str, Any] = {"temperature": sampling.temperature}
    if sampling.top_p != DEFAULTS["top_p"]:
        found["top_p"] = sampling.top_p
    if sampling.top_k not in (0, -1):
        found["top_k"] = sampling.top_k
    return found


def validate(plain: Mapping[str, Any]) -> list[str]:
    """Problems with the sampling keys, one line each naming the key and what is allowed."""
    errors = []
    temperature = plain.get("temperature", DEFAULTS["temperature"])
    if not (_number(temperature) and temperature >= 0):
        errors.append(f"temperature={temperature!r} must be a number >= 0 (0: greedy decoding)")
    top_p = plain.get("top_p", DEFAULTS["top_p"])
    if not (_number(top_p) and 0 < top_p <= 1):
        errors.append(f"top_p={top_p!r} must be a number in (0, 1] (1: no nucleus filter)")
    top_k = plain.get("top_k", DEFAULTS["top_k"])
    if not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= -1):
        errors.append(f"top_k={top_k!r} must be 0 or -1 (no top-k filter) or an integer >= 1")
    for key, value in (plain.get("distribution_check") or {}).items():
        # tokens: the check compares positions FIRST_CHECKED_POSITION onwards.
        least = FIRST_CHECKED_POSITION + 1 if key == "tokens" else 1
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            errors.append(f"distribution_check.{key}={value!r} must be an integer >= {least}")
    return errors


def request_seed(seed: int, index: int) -> int:
    """The seed of a cell's timed request ``index`` (its position in submission order; every
    repetition reuses it, so repetitions draw the same tokens and a baseline the same as itself)."""
    return seed * SEED_STRIDE + index


def distribution_seed(seed: int, stream: str, sample: int) -> int:
    """The seed of sample ``sample`` of the untimed distribution check of the cell whose stream
    (config hash and engine run) is ``stream``: 60 bits of sha256("seed/stream/sample").

    Every cell draws with seeds of its own, so a baseline's draws are
    independent of every speculative cell's and of a baseline at another
    temperature (shared seeds would couple them: two temperatures with the
    same random numbers mostly draw the same tokens), which the permutation
    test's exchangeability needs (see :mod:`specbench.results.distribution`).
    """
    digest = hashlib.sha256(f"{seed}/{stream}/{sample}".encode()).hexdigest()
    return int(digest[:15], 16)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
