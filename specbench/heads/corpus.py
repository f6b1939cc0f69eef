"""The training prompts of specbench's draft heads: written for this purpose only.

A head learns what its target says, so the prompts only need to make the
target talk the way the evaluation workloads do: tell stories, write poems
and posts, explain, stay in character, condense a text and answer from
passages. None of them may come from an evaluation set (the built-in
summarize/rag/creative files, Spec-Bench), or a measured acceptance would
flatter the head; ``tests/test_heads.py`` checks the built-in sets against
every prompt built here.

Prompts are built from the templates and word lists below with a seeded
generator, in two stages:

1. *Direct* prompts: the target answers them as they are.
2. *Source* prompts ask the target for a report or a notice; their answers
   become the documents that condense and passage-question prompts quote
   (:func:`reading_prompts`). The documents are the target's own words, so
   nothing of an evaluation article can leak in.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

# Subjects, places and roles of this corpus. Keep them clear of the topics of
# specbench/workloads/data/*.jsonl (checked by the tests through the prompts).
PEOPLE = (
    "a retired tram driver", "a young beekeeper", "an apprentice glassblower",
    "a night-shift nurse", "a travelling puppeteer", "a cartographer who cannot swim",
    "a stubborn goat farmer", "a piano tuner", "a lonely radio operator",
    "a twelve-year-old chess champion", "a lighthouse cat", "an elderly ferry captain",
    "a street musician", "a museum night guard", "a shy robot gardener",
    "a desert botanist", "a clockmaker's daughter", "a snow plough operator",
    "a retired astronaut who runs a bakery", "a nervous substitute teacher", "a river ferry mechanic",
    "a beekeeping grandmother", "an ambitious young reporter", "a forgetful inventor",
    "a mountain postwoman", "a bored palace guard", "a circus acrobat with a fear of heights",
    "a village blacksmith", "a deep-sea diver", "an amateur astronomer", "a hotel night porter",
    "a pastry chef who hates sugar", "a lost tourist", "a marathon runner with a sprained ankle",
)
EVENTS = (
    "finds a map drawn on the back of a receipt", "loses the key to the only bridge in town",
    "receives a parcel addressed to someone who died a century ago",
    "wakes up to find every clock in the village stopped",
    "is asked to judge a pie contest between two rival sisters",
    "hears a song that nobody else can hear", "discovers a staircase behind the pantry",
    "must deliver a message across a frozen lake", "adopts a crow that can count",
    "wins a prize they never entered", "tries to teach a parrot to stay quiet",
    "is snowed in with a stranger for three days",
    "opens a shop that only sells left shoes", "finds a letter hidden inside a library book",
    "must cook dinner for a visiting queen", "builds a raft to cross a flooded valley",
    "gets stuck in a lift with their childhood rival", "inherits a house full of mechanical birds",
    "sees the same stranger in every photograph", "tries to win back a stolen recipe",
    "has to guide a lost herd of sheep home", "forgets their own name for one afternoon",
)
SETTINGS = (
    "in a harbour town", "on a night train", "in a mountain village", "on a houseboat",
    "in a crowded market", "during a summer storm", "on the last day of winter",
    "in a city of bridges", "at a roadside diner", "in an abandoned observatory",
    "in a desert town", "at a busy airport", "in a snowed-in hotel", "aboard a research ship",
    "in a floating city", "at a country fair", "in a deserted theme park", "on a remote island",
    "in a noisy factory", "at a seaside campsite",
)
THINGS = (
    "tides", "rainbows", "vaccines", "compost", "suspension bridges", "bread yeast",
    "solar panels", "migrating birds", "volcanoes", "the water cycle", "magnets",
    "honeybees", "glaciers", "sourdough starters", "bicycle gears", "thunderstorms",
    "coral reefs", "recycling plants", "the human heart", "wind turbines", "fossils",
    "paper making", "tea plants", "satellites", "earthquakes", "mushrooms",
    "black holes", "antibiotics", "bread ovens", "electric cars", "the moon's phases",
    "penguins", "hydroelectric dams", "photosynthesis", "the printing press", "octopuses",
    "rain forests", "sleep", "clouds", "batteries", "the immune system", "bridges made of rope",
    "lighthouses", "elephants", "the internet", "maple syrup", "bicycles", "deserts",
)
FEELINGS = (
    "homesickness", "a first snowfall", "an old pair of boots", "the sound of rain on a tin roof",
    "a grandmother's garden", "the last bus home", "a forgotten birthday",
    "the smell of oranges", "a quiet library", "a broken umbrella", "the first day of school",
    "moving to a new city", "a kitchen at midnight", "waiting for a letter", "a long train journey",
    "an empty playground", "the end of summer holidays", "a friendship that faded",
    "learning to swim", "a lighthouse beam at sea", "a rainy Sunday",
)
ROLES = (
    ("a cheerful pirate cook", "a sailor complains that the soup tastes of seawater"),
    ("a fussy royal tailor", "the king wants a coat made of feathers by tomorrow"),
    ("a tired dragon", "a knight arrives and politely asks for a rematch"),
    ("a sarcastic ship's computer", "the crew asks whether they are lost again"),
    ("an overly polite ghost", "a family moves into your house and ignores you"),
    ("a proud village baker", "a tourist asks if the bread is really fresh"),
    ("a nervous wizard's apprentice", "you have turned the teacher's cat into a teapot"),
    ("a grumpy museum statue", "a child asks why you never smile"),
    ("a weather forecaster on a planet with three suns", "viewers ask what to wear"),
)
AUDIENCES = ("a ten-year-old", "a busy parent", "a new employee", "a curious grandparent", "a high-school class")
REPORT_SUBJECTS = (
    "a village that opened its first public library", "a school that planted an orchard",
    "a town repairing its old stone bridge", "a community swimming pool reopening after repairs",
    "a farmers' cooperative buying a shared tractor", "a city testing night buses for students",
    "a festival of kites on a windy beach", "a volunteer group cleaning a river",
    "a small airport adding a weather station", "a zoo welcoming two baby otters",
    "a hospital opening a rooftop garden", "a football club building a new clubhouse",
    "a bakery donating bread to a shelter", "a ferry service adding a winter timetable",
    "a retired engineer", "a group of tourists", "a first-year student", "a small business owner",
    "a regional airline cutting two routes", "a technology firm opening a new office",
    "a coastal town building a sea wall", "a university winning a research grant",
    "a chess tournament won by a teenager", "a heat record broken in a mountain town",
    "a factory closing after sixty years", "a charity run raising money for a clinic",
    "a council debating higher parking charges", "a new cycle lane on the main road",
    "a science museum unveiling a dinosaur skeleton", "a storm damaging a fishing harbour",
    "an election for a new town mayor", "a hospital trial of a faster blood test",
    "a rugby team reaching the national final", "a supermarket chain reporting higher profits",
    "a wildfire near a holiday resort", "a school choir winning a national prize",
    "a startup launching a cheaper water filter", "archaeologists finding old coins under a car park",
)
NOTICE_SUBJECTS = (
    "how to care for a potted lemon tree", "the rules of a neighbourhood tool library",
    "how to prepare a bicycle for winter", "the opening hours and services of a repair café",
    "how to set up a home aquarium", "safety advice for a hiking trail",
    "how a community fridge works", "instructions for a shared laundry room",
    "how to store fresh herbs", "the steps of planting a hedge",
    "how to reset a home wireless router", "the return policy of an online bookshop",
    "the rules for residents of a student hall", "how to descale an electric kettle",
    "the check-in steps for a small hotel", "the safety rules of a climbing wall",
    "how to apply for a library reading room pass", "what to do when a smoke alarm beeps",
    "how to book a table tennis court", "the warranty terms of a vacuum cleaner",
    "how to change the cartridge in a water jug filter", "the rules of a community garden plot",
    "the baggage rules of a coach company", "how to pay a water bill online",
)

DIRECT_TEMPLATES = (
    "Tell me a story about {person} who {event} {setting}.",
    "Write a short tale in which {person} {event}. Keep it hopeful.",
    "Compose a few verses about {feeling}.",
    "Write a rhyming poem about {thing}.",
    "Pretend to be {role}. The situation: {situation}. Answer in that voice.",
    "Write an upbeat article for a hobby website about {thing}.",
    "Explain {thing} to {audience} in plain words.",
    "Give me five practical tips about {thing}, with one sentence each.",
    "Describe a day in the life of {person} {setting}.",
    "Write a letter from {person} to an old friend about {feeling}.",
    "Write a short dialogue between {person} and {audience} about {thing}.",
    "Write a diary entry by {person} on a day when they {event}.",
    "Write a limerick about {person}.",
    "Write a short essay on why {thing} matter to everyday life.",
    "Review an imaginary café {setting} as a grumpy critic would.",
    "Write the opening paragraph of a mystery novel set {setting}.",
)
SOURCE_TEMPLATES = (
    "Write a local news report about {subject}. Include names, numbers and a quote.",
    "Write an informative notice explaining {notice}.",
)
SOURCE_ANGLES = (
    " Focus on the people.", " Focus on the practical details.", " Keep it short.",
    " Mention dates and amounts.", " Write it as a numbered list.", " Include a warning.",
)
CONDENSE_TEMPLATES = (
    "Give a brief summary of this text.\n\n{doc}",
    "Condense the report below into three sentences.\n\n{doc}",
    "Read the text and write its main points as a short paragraph.\n\n{doc}",
    "In two or three sentences, what does this text say?\n\n{doc}",
    "{doc}\n\nWrite a one-paragraph digest of the text above for a busy reader.",
)
QUESTION_TEMPLATES = (
    "Use the sources to reply. Cite the source that supports your reply.\n\n{passages}\n\nQuery: {question}",
    "Here are some reference notes.\n\n{passages}\n\nBased only on these notes, {question}",
)
QUESTIONS = (
    "what happened and who was involved?", "what are the main steps or facts described?",
    "what numbers are mentioned, and what do they refer to?", "why does this matter to the people involved?",
    "what should a reader do first?", "when and where did it take place?",
    "which rule or step is easiest to forget?", "who said what, according to the notes?",
)


@dataclass(frozen=True)
class TrainingPrompt:
    """One user message of the training corpus; ``kind`` names its template family."""

    id: str
    kind: str
    text: str


def direct_prompts(count: int, seed: int) -> list[TrainingPrompt]:
    """``count`` distinct direct prompts, drawn with ``random.Random(seed)``."""
    rng = random.Random(seed)
    prompts: dict[str, TrainingPrompt] = {}
    while len(prompts) < count:
        template = rng.choice(DIRECT_TEMPLATES)
        role, situation = rng.choice(ROLES)
        text = template.format(
            person=rng.choice(PEOPLE), event=rng.choice(EVENTS), setting=rng.choice(SETTINGS),
            feeling=rng.choice(FEELINGS), thing=rng.choice(THINGS), role=role,
            situation=situation, audience=rng.choice(AUDIENCES),
        )
        prompts.setdefault(text, TrainingPrompt(f"direct-{len(prompts):04d}", "direct", text))
    return list(prompts.values())


def source_prompts(count: int, seed: int) -> list[TrainingPrompt]:
    """``count`` prompts whose answers serve as documents for :func:`reading_prompts`."""
    rng = random.Random(seed + 1)
    subjects = [("report", s) for s in REPORT_SUBJECTS] + [("notice", n) for n in NOTICE_SUBJECTS]
    prompts = []
    for i in range(count):
        kind, subject = subjects[i % len(subjects)]
        template = SOURCE_TEMPLATES[0] if kind == "report" else SOURCE_TEMPLATES[1]
        text = template.format(subject=subject, notice=subject)
        if i >= len(subjects):  # a second round asks for another angle on the same subject
            text += rng.choice(SOURCE_ANGLES)
        prompts.append(TrainingPrompt(f"source-{i:04d}", "source", text))
    return prompts


def reading_prompts(documents: list[str], count: int, seed: int) -> list[TrainingPrompt]:
    """Condense and passage-question prompts that quote the target's own documents."""
    rng = random.Random(seed + 2)
    prompts = []
    for i in range(count):
        if i % 2 == 0:
            text = rng.choice(CONDENSE_TEMPLATES).format(doc=rng.choice(documents))
            kind = "condense"
        else:
            picked = rng.sample(documents, k=min(2, len(documents)))
            passages = "\n\n".join(f"[Source {j + 1}] {doc}" for j, doc in enumerate(picked))
            text = rng.choice(QUESTION_TEMPLATES).format(passages=passages, question=rng.choice(QUESTIONS))
            kind = "passages"
        prompts.append(TrainingPrompt(f"reading-{i:04d}", kind, text))
    return prompts


def template_texts() -> list[str]:
    """Every literal text a training prompt can contain apart from generated documents."""
    words = [*PEOPLE, *EVENTS, *SETTINGS, *THINGS, *FEELINGS, *AUDIENCES, *REPORT_SUBJECTS,
             *NOTICE_SUBJECTS, *QUESTIONS, *(r for pair in ROLES for r in pair)]
    return [*DIRECT_TEMPLATES, *SOURCE_TEMPLATES, *SOURCE_ANGLES, *CONDENSE_TEMPLATES, *QUESTION_TEMPLATES, *words]


def fingerprint(records: list[dict[str, object]]) -> str:
    """sha256 of the corpus as canonical JSON lines: the manifest's data fingerprint."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return digest.hexdigest()
