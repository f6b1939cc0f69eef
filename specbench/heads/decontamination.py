"""Keeping the heads' training text apart from every evaluation set, by hashed 8-word shingles.

A head trained on text that an evaluation prompt also contains drafts that
prompt from memory, and its measured acceptance flatters it. The evaluation
sets are the built-in workloads (``specbench/workloads/data``, hashed when
asked) and Spec-Bench's ``question.jsonl``, which is not ours to ship: only
the hashes of its shingles are (:data:`SPEC_BENCH_FILE`, written by
``python -m specbench.heads shingles``), so the check needs no network.

A shingle is 8 consecutive words, lower-cased, of ``[a-z0-9']+``: long enough
that common phrasing ("at the end of the day, it is") rarely repeats by chance,
short enough that a quoted sentence is caught. Its hash is the first 8 bytes
of its BLAKE2b digest; with some 10^5 evaluation shingles a chance collision
hits one training shingle in about 10^14.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

SHINGLE_WORDS = 8
# Sorted unsigned 64-bit hashes, little-endian, of the shingles of every turn of Spec-Bench's
# question.jsonl (hemingkx/Spec-Bench, data/spec_bench/question.jsonl, Apache-2.0; commit fd2c1cd).
SPEC_BENCH_FILE = "data/spec_bench_shingles.u64"
SPEC_BENCH_SOURCE = "hemingkx/Spec-Bench@fd2c1cd data/spec_bench/question.jsonl (Apache-2.0)"
_WORD = re.compile(r"[a-z0-9']+")


def shingles(text: str) -> set[int]:
    """The hashes of ``text``'s 8-word shingles (none for text of fewer than 8 words)."""
    words = _WORD.findall(text.lower())
    return {
        int.from_bytes(hashlib.blake2b(" ".join(words[i : i + SHINGLE_WORDS]).encode(), digest_size=8).digest(),
                       "little")
        for i in range(len(words) - SHINGLE_WORDS + 1)
    }


def built_in_shingles() -> frozenset[int]:
    """The shingles of every text field of the built-in workloads' prompt files."""
    data = importlib.resources.files("specbench.workloads") / "data"
    found: set[int] = set()
    for entry in data.iterdir():
        if entry.name.endswith(".jsonl"):
            for line in entry.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    found.update(*(shingles(v) for v in json.loads(line).values() if isinstance(v, str)))
    return frozenset(found)


def spec_bench_shingles() -> frozenset[int]:
    """The committed shingle hashes of Spec-Bench's questions (:data:`SPEC_BENCH_FILE`)."""
    raw = (importlib.resources.files("specbench.heads") / SPEC_BENCH_FILE).read_bytes()
    return frozenset(np.frombuffer(raw, dtype="<u8").tolist())


@lru_cache(maxsize=1)
def evaluation_shingles() -> frozenset[int]:
    """Every evaluation set's shingles: the built-in workloads and Spec-Bench."""
    return built_in_shingles() | spec_bench_shingles()


@dataclass(frozen=True)
class Overlap:
    """What a decontamination check compared and found."""

    texts: int  # training texts checked
    shingles: int  # distinct training shingles compared
    evaluation_shingles: int
    hits: dict[int, int]  # index of a text -> its shingles found in an evaluation set


def overlap(texts: Iterable[str]) -> Overlap:
    """Compare every text's shingles with :func:`evaluation_shingles`."""
    evaluation = evaluation_shingles()
    compared: set[int] = set()
    hits = {}
    count = 0
    for count, text in enumerate(texts, start=1):
        own = shingles(text)
        compared |= own
        if found := len(own & evaluation):
            hits[count - 1] = found
    return Overlap(texts=count, shingles=len(compared), evaluation_shingles=len(evaluation), hits=hits)


def write_spec_bench(question_jsonl: Path, out: Path) -> int:
    """Hash the shingles of every turn of a Spec-Bench ``question.jsonl`` into ``out``; returns their number."""
    found: set[int] = set()
    for line in question_jsonl.read_text(encoding="utf-8").splitlines():
        if line.strip():
            for turn in json.loads(line).get("turns", []):
                found |= shingles(turn)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(np.array(sorted(found), dtype="<u8").tobytes())
    return len(found)
