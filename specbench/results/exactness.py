"""Exactness that knows numerics: where two greedy outputs part, and whether a tie explains it.

Greedy speculative decoding emits the target's own argmax at every position,
so its output should equal plain decoding's token for token. In float32 it
does, and the check stays token for token. In 16-bit floats it cannot: the
verify pass scores K+1 positions at once and plain decoding at another batch
size runs kernels of other shapes, which sum in another order; where the
target's two best tokens are nearly tied, that rounding decides which one wins
(vLLM promises exactness only up to floating-point precision). So every
request that differs from its reference is classified at its first divergent
position:

- a *tie* when both tokens taken there were within the dtype's tolerance
  (:func:`tie_tolerance`) of the top token, by the reference's own
  log-probabilities (its near ties, the top one included);
- a *mismatch* otherwise: the target had a clear winner, or the token the
  other output emitted was not among the near ties, or the near ties were
  not recorded there, so nothing shows the token was a tie's.

Where plain decoding at another batch size also leaves the reference at that
position (the control), that says the position is fragile, not that the
token emitted there is right: the control excuses nothing by itself. Instead
it gives the rate at which plain decoding meets ties on these requests, and
a cell that ties on significantly more of the same requests than that
(:func:`tie_excess_p_value`, McNemar's test on the paired requests) is flagged: a decoder that goes wrong only where
the target is uncertain would otherwise read as "ties" everywhere.

Only mismatches (and a significant excess of ties) make a cell inexact for verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# A 16-bit float near 32, where the logits of the models benchmarked here peak
# (SmolLM2, Qwen2.5), is spaced 32 x its machine epsilon apart (bfloat16:
# 2^-7 x 32 = 0.25 nats; float16: 0.03), and the residual stream's roundings
# over the layers compound that: plain decoding at batch 1 against batch 8 in
# bfloat16 parted at top-two margins of 0 to 0.5 nats (SmolLM2, 12 divergences).
# The tolerance is four such spacings: 1.0 nats in bfloat16, 0.125 in float16.
# float32's spacing there (4e-6) is below any margin a real output shows: it
# keeps the token-exact check.
LOGIT_SCALE = 32.0
SPACINGS = 4
_MACHINE_EPSILON = {"bfloat16": 2.0**-7, "float16": 2.0**-10, "half": 2.0**-10}

TIE = "tie"
MISMATCH = "mismatch"


def tie_tolerance(dtype: str | None) -> float | None:
    """How close (nats) to the top token another must be for a divergence in ``dtype`` to be a numerical tie.

    None for float32 and anything not a 16-bit float: there, outputs must be
    token-exact and no divergence is a tie.
    """
    epsilon = _MACHINE_EPSILON.get(str(dtype))
    return None if epsilon is None else SPACINGS * LOGIT_SCALE * epsilon


@dataclass(frozen=True)
class Divergence:
    """Where one request's output first leaves its reference, and why.

    ``margin`` is the reference's top-1 minus top-2 log-probability at that
    position (None when not recorded); ``kind`` is :data:`TIE` or :data:`MISMATCH`.
    """

    request: int
    position: int
    kind: str
    margin: float | None

    def as_row(self) -> dict[str, object]:
        """The Parquet struct (results.schema.DIVERGENCE)."""
        return {"request": self.request, "position": self.position, "kind": self.kind, "margin": self.margin}


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """The first position where two outputs differ (one ending early counts there); None if equal."""
    for position, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return position
    return None if len(reference) == len(other) else min(len(reference), len(other))


def classify(
    reference: Sequence[Sequence[int]],
    other: Sequence[Sequence[int]],
    *,
    tolerance: float | None,
    margins: Sequence[Sequence[float]] = (),
    near_ties: Sequence[Sequence[Sequence[int]]] = (),
) -> list[Divergence]:
    """Every request whose ``other`` output differs from ``reference``, classified at its first divergence.

    ``margins`` and ``near_ties`` are the reference's per request and position
    (:class:`specbench.measure.TopTokens`). A divergence is a tie only when the
    token ``other`` emitted there and the reference's are both in the
    reference's near ties at that position. With ``tolerance`` None (float32)
    every divergence is a mismatch. A request present on one side only is a mismatch.
    """
    found: list[Divergence] = []
    for index in range(max(len(reference), len(other))):
        if index >= len(reference) or index >= len(other):
            found.append(Divergence(index, 0, MISMATCH, None))
            continue
        position = first_divergence(reference[index], other[index])
        if position is None:
            continue
        margin = _at(margins, index, position)
        kind = MISMATCH
        if tolerance is not None:
            ties = _at(near_ties, index, position)
            near_tie = (
                ties is not None and position < len(other[index]) and position < len(reference[index])
                and other[index][position] in ties and reference[index][position] in ties
            )
            kind = TIE if near_tie else MISMATCH
        found.append(Divergence(index, position, kind, margin))
    return found


def verdict(divergences: Sequence[Divergence]) -> str:
    """``exact`` (no divergence), ``ties`` (ties only) or ``mismatch`` (at least one)."""
    if not divergences:
        return "exact"
    return "mismatch" if any(d.kind == MISMATCH for d in divergences) else "ties"


def tie_excess_p_value(cell_only: int, control_only: int) -> float:
    """One-sided p-value that a cell ties on more of its requests than the control does, the two paired by request.

    The cell and the control part from the same baseline on the same
    requests, so the evidence is in the discordant requests (McNemar's exact
    test): ``cell_only`` tie in the cell and not in the control,
    ``control_only`` the other way round. If both share one tie rate, each
    discordant request is the cell's with probability 1/2, and the p-value is
    P(Bin(cell_only + control_only, 1/2) >= cell_only). Requests that tie in
    both, or in neither, say nothing about the difference. (Fisher's test on
    the two tie counts treated them as independent samples, which they are
    not.) Examples: 10 against 0 gives 2^-10 = 0.001; 3 against 2 gives 0.5;
    none discordant gives 1.

    Raises:
        ValueError: on negative counts.
    """
    if cell_only < 0 or control_only < 0:
        raise ValueError(f"discordant requests must be counts >= 0, got {cell_only} and {control_only}")
    discordant = cell_only + control_only
    tail = sum(math.comb(discordant, x) for x in range(cell_only, discordant + 1))
    return min(1.0, tail / 2**discordant)


def _at(values: Sequence[Sequence[Any]], request: int, position: int) -> Any:
    if request < len(values) and position < len(values[request]):
        return values[request][position]
    return None
