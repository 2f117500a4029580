"""The tokenizer and chat template a GGUF file carries, built with ``tokenizers`` alone.

A GGUF has no ``tokenizer.json``: llama.cpp stores the vocabulary (``tokenizer.ggml.tokens``),
the merges, the token types and the special ids as metadata. This builds the same tokenizer
transformers builds from them (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), so the
two agree token for token (``tests/engine/test_gguf_tokenizer.py``):

- ``tokenizer.ggml.model`` ``gpt2``: byte-level BPE; a token written outside the byte alphabet
  is respelled in it; the split before the byte mapping is chosen by ``tokenizer.ggml.pre``
  (``PRE_TOKENIZER_SPLITS``; any other, ``smollm`` and ``default`` included, is GPT-2's).
- ``llama``: SentencePiece-style BPE (``▁`` for spaces, byte fallback); merges from the file, or
  rebuilt from the scores when absent (``merges_from_scores``).
- Control tokens (type 3) are special and matched whole; user-defined ones (type 4) are matched
  whole but not special; BOS/EOS are added as ``add_bos_token``/``add_eos_token`` say
  (``llama`` files without the flag get BOS, as llama.cpp and transformers do).

``tokenizer.chat_template`` and the named special tokens are ``GGUFTokenizer.chat_template`` and
``special_tokens``; ``control/chat/template.py`` reads them for a GGUF checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from engine.errors import CheckpointError
from engine.model.gguf_file import GGUFCheckpoint, open_checkpoint

CONTROL, USER_DEFINED = 3, 4
"""llama.cpp's token types (``tokenizer.ggml.token_type``) that are matched whole."""
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "llama-bpe": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "dbrx": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
}
"""``tokenizer.ggml.pre`` → the regex llama.cpp splits with before the byte mapping."""


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    chat_template: str | None
    special_tokens: dict[str, str] = field(default_factory=dict)
    """``bos_token``, ``eos_token``, ``unk_token``, ``pad_token`` as text, where present."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map (the byte-level alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a token into two tokens,
    best-scored merged token first (ties: shorter left part, then shorter right part)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    found: list[tuple[str, str, float]] = []
    for token, score in zip(tokens, scores, strict=True):
        local = [
            (token[:i], token[i:], score)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _byte_level(tokens: list[str], merges: list[tuple[str, str]], pre: str | None) -> Tokenizer:
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    tokenizer = Tokenizer(
        models.BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="")
    )
    split = PRE_TOKENIZER_SPLITS.get(pre or "")
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _sentencepiece(tokens: list[str], merges: list[tuple[str, str]]) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=True, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1),
        ]
    )
    return tokenizer


def build_tokenizer(ckpt: GGUFCheckpoint) -> GGUFTokenizer:
    """The file's tokenizer; ``CheckpointError`` for a tokenizer model it does not describe
    fully or that is not supported."""
    kind = ckpt.get("tokenizer.ggml.model")
    tokens = ckpt.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise CheckpointError(
            f"{ckpt.path.name} has no tokenizer (tokenizer.ggml.model/tokens): pass --tokenizer",
            ckpt.path,
        )
    raw_merges = ckpt.get("tokenizer.ggml.merges")
    if raw_merges is not None:
        merges = [tuple(m.split(" ", 1)) for m in raw_merges]
    elif kind == "llama" and ckpt.has("tokenizer.ggml.scores"):
        merges = merges_from_scores(tokens, ckpt.get("tokenizer.ggml.scores"))
    else:
        raise CheckpointError(f"{ckpt.path.name} lacks tokenizer.ggml.merges", ckpt.path)
    if kind == "gpt2":
        tokenizer = _byte_level(tokens, merges, ckpt.get("tokenizer.ggml.pre"))
    elif kind == "llama":
        tokenizer = _sentencepiece(tokens, merges)
    else:
        raise CheckpointError(
            f"tokenizer.ggml.model={kind!r} is not supported (gpt2, llama): pass --tokenizer",
            ckpt.path,
        )
    types = ckpt.get("tokenizer.ggml.token_type") or []
    alphabet = set(bytes_to_unicode().values()) if kind == "gpt2" else None
    special = {
        name: tokens[i]
        for name, key in (
            ("bos_token", "bos_token_id"),
            ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"),
            ("pad_token", "padding_token_id"),
        )
        if (i := ckpt.get(f"tokenizer.ggml.{key}")) is not None and 0 <= i < len(tokens)
    }
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind_ in zip(tokens, types, strict=False)
        if kind_ == CONTROL and (alphabet is None or set(t) <= alphabet)
    ]
    named = {t.content for t in control}
    control += [
        AddedToken(t, normalized=False, special=True)
        for t in dict.fromkeys(special.values())
        if t not in named and kind == "llama"
    ]
    tokenizer.add_special_tokens(control)
    vocab = tokenizer.get_vocab()
    user = [
        AddedToken(t, normalized=False, special=False)
        for t, kind_ in zip(tokens, types, strict=False)
        if kind_ == USER_DEFINED and t in vocab
    ]
    tokenizer.add_tokens(user)
    add_bos = ckpt.get("tokenizer.ggml.add_bos_token", kind == "llama")
    add_eos = ckpt.get("tokenizer.ggml.add_eos_token", False)
    tokenizer.post_processor = _post_processor(special, tokenizer, add_bos, add_eos)
    return GGUFTokenizer(tokenizer, ckpt.get("tokenizer.chat_template"), special)


def _post_processor(
    special: dict[str, str], tokenizer: Tokenizer, add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    bos = special.get("bos_token") if add_bos else None
    eos = special.get("eos_token") if add_eos else None
    head = [bos] if bos else []
    tail = [eos] if eos else []
    single = [*head, "$A:0", *tail]
    pair = [*single, *head, "$B:1", *tail]
    ids = [(t, tokenizer.token_to_id(t)) for t in dict.fromkeys([*head, *tail])]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)


@lru_cache(maxsize=2)
def gguf_tokenizer(path: Path) -> GGUFTokenizer:
    """The tokenizer of the GGUF checkpoint at ``path``, built once per process."""
    return build_tokenizer(open_checkpoint(path))
