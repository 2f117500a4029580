"""A deterministic text corpus for training the local tokenizer: no download needed.

English-like sentences over a fixed word list, invented words built from syllables (so BPE
finds enough merges for an 8k vocabulary), numbers, punctuation and code-like lines.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_WORD_TEXT = """
the of and to in is that it for was on are as with by be this at from or have an they which one
you had not but what all were when we there can more if no out so said who each she do how
their will up other about many then them these some her would make like him into time has look
two go see way could people my than first water been call its now find long down day did get
come made may part over new sound take only little work know place year live me back give most
very after thing our just name good sentence man think say great where help through much before
line right too mean old any same tell boy follow came want show also around form three small
set put end does another well large must big even such because turn here why ask went men read
need land different home us move try kind hand picture again change off play spell air away
animal house point page letter mother answer found study still learn should world high every
near add food between own below country plant last school father keep tree never start city
earth eye light thought head under story saw left few while along might close something seem
next hard open example begin life always those both paper together got group often run
important until children side feet car mile night walk white sea began grow took river four
carry state once book hear stop without second late miss idea enough eat face watch far really
almost let above girl sometimes mountain cut young talk soon list song being leave family it's
server request batch token queue policy memory block cache engine model latency throughput
schedule schedule dynamic static continuous hybrid prefill decode kernel tensor operator
console metric sweep reserve version history rollback window length padding budget sequence
prompt
"""
WORDS = _WORD_TEXT.split()

CONSONANTS = (*"bcdfghjklmnprstvwz", "ch", "sh", "th", "st", "tr", "pl", "gr", "br")
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
PUNCTUATION = [".", ".", ".", "!", "?", ";", ","]
CODE_TEMPLATES = [
    "def {a}({b}, {c}):\n    return {b} + {c} * {n}",
    "for {a} in range({n}):\n    {b}.append({a})",
    "if {a} > {n}:\n    {b} = {c}[{a}]",
    "{a} = {{'{b}': {n}, '{c}': {m}}}",
    "class {A}:\n    {b}: int = {n}",
]


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(1, 4)))


def _sentence(rng: random.Random, invented: list[str]) -> str:
    words = []
    for _ in range(rng.randint(4, 18)):
        roll = rng.random()
        if roll < 0.7:
            words.append(rng.choice(WORDS))
        elif roll < 0.9:
            words.append(rng.choice(invented))
        else:
            words.append(str(rng.randint(0, 10_000)))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(PUNCTUATION)


def _code(rng: random.Random, invented: list[str]) -> str:
    a, b, c = (rng.choice(invented + WORDS) for _ in range(3))
    return rng.choice(CODE_TEMPLATES).format(
        a=a, b=b, c=c, A=a.capitalize(), n=rng.randint(0, 999), m=rng.randint(0, 999)
    )


def corpus_lines(seed: int = 0, num_lines: int = 30_000) -> Iterator[str]:
    rng = random.Random(seed)
    invented = [_pseudo_word(rng) for _ in range(6000)]
    for _ in range(num_lines):
        if rng.random() < 0.1:
            yield _code(rng, invented)
        else:
            yield " ".join(_sentence(rng, invented) for _ in range(rng.randint(1, 4)))
