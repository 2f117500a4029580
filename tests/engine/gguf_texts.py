"""A few hundred varied strings for tokenizer equality: prose, unicode (accents, CJK, emoji,
combining marks, RTL), whitespace runs (spaces, tabs, newlines, CRLF, leading and trailing),
digits and numbers, code, contractions, and special tokens inside text."""

from __future__ import annotations

import random

from engine.corpus import corpus_lines

PIECES = [
    "Hello, world!",
    "héllo wörld café naïve",
    "日本語のテキスト",
    "中文字符和标点。",
    "emoji 🙂🚀👩‍💻 mixed",
    "e\u0301 combining",
    "مرحبا بالعالم",
    "Привет, мир",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\t\tinside\t",
    "new\nlines\n\n\nand\r\nCRLF",
    "1234567890",
    "3.14159 and 2,718 and -42",
    "year 2024, 10:30am",
    "def f(x):\n    return x**2  # square",
    "{'key': [1, 2, 3]}",
    "it's we're they've I'm you'll he'd",
    "ALL CAPS and MiXeD cAsE",
    "http://example.com/path?q=1&r=2",
    "<|im_start|>user\nhi<|im_end|>",
    "<s> inside </s> text",
    "<|user|>\nquestion<|end|>\n<|assistant|>\n",
    "<|endoftext|>after",
    "",
    " ",
    "\n",
    "a",
    "    ",
    "!!!???...",
]


def varied_texts(count: int = 320, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [line for line in corpus_lines() if line.strip()][:400]
    texts = list(PIECES)
    while len(texts) < count:
        parts = [*rng.sample(PIECES, 2), rng.choice(lines)[:80]]
        glue = rng.choice([" ", "", "\n", "  ", "\t", " \n "])
        rng.shuffle(parts)
        texts.append(glue.join(parts))
    return texts
