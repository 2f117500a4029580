"""Structured output: a request's grammar constrains its tokens, step by step (llguidance).

The grammar library is llguidance: CPU wheels, no Python dependency (xgrammar imports
transformers when it loads, which would make transformers a run-time dependency), a JSON
Schema compiler that refuses the keywords it does not enforce by name (``Unimplemented keys:
["uniqueItems"]``), and parser limits that bound the work a grammar can cost.

The public API is small:

- ``json_schema_grammar(schema)`` / ``json_object_grammar()`` / ``regex_grammar(regex)`` /
  ``choice_grammar(choices)`` / ``lark_grammar(lark, source)`` (``json_rule(schema)`` writes
  its JSON parts: a forced tool call's arguments): a ``GrammarConstraint`` (the grammar
  text, engine/sampling_params.py) for ``SamplingParams.constraint``;
- ``Grammars`` (one per ``EngineFront``: the tokenizer as llguidance sees it, built once on
  first use, and the compiled grammars, a bounded LRU by the grammar's hash): ``compile``
  refuses a grammar with ``GrammarError``; ``state`` gives a sequence its own matcher;
- ``GrammarState`` (``Sequence.grammar``): ``advance(token)`` after each appended token says
  whether the grammar has ended (the row then finishes with ``stop``); ``sync`` re-feeds it
  after anything that changed the output behind its back;
- ``engine/grammar_mask.py`` ``mask_logits(logits, rows, seqs)``: the sampler's step: the
  constrained rows' allowed-token bitmasks computed and applied, disallowed -> ``-inf`` (apart,
  so that this module, which the tokenizer-only ``EngineFront`` imports, imports no torch).

A sequence's matcher has consumed exactly its output tokens: preemption by recompute keeps the
tokens (and so the state); a fork (``n`` > 1) starts its own matcher at the prompt's end.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
from tokenizers import Tokenizer

from engine.grammar_check import CompileTimeout, GrammarChecker
from engine.sampling_params import GrammarConstraint, GrammarSource

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

MAX_CACHED_GRAMMARS = 128
"""Compiled grammars kept (each a template matcher; a request's is a deep copy)."""
COMPACT_JSON: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
}
"""JSON on one line, spaced as Python's ``json.dumps`` writes it (``{"a": 1, "b": [2, 3]}``:
no other whitespace, so its length is bounded by the schema; the spaces, which models have
seen everywhere, made SmolLM2's answers better than ``{"a":1}``), and no keyword silently
ignored (``lenient`` off: an unimplemented keyword is a refusal)."""


def grammar_limits() -> llguidance.LLParserLimits:
    """The bounds on what compiling and running one grammar may cost: llguidance counts its
    work in "fuel" and stops a grammar that runs out (a refusal, never a hang). Tighter than
    llguidance's defaults, which are sized for hand-written grammars, not for schemas anyone
    may send: lexer fuel ~4 ms to build, ~10 ms a step; 20k Earley items a step; 50k grammar
    symbols; 50k lexer states."""
    return llguidance.LLParserLimits(
        initial_lexer_fuel=200_000,
        step_lexer_fuel=150_000,
        step_max_items=20_000,
        max_lexer_states=50_000,
        max_grammar_size=50_000,
        verbose_errors=False,
    )


class GrammarError(ValueError):
    """A grammar llguidance refuses (a keyword it does not enforce, an unsatisfiable or
    malformed schema, a limit passed); the message says why."""


def json_schema_grammar(schema: dict[str, Any]) -> GrammarConstraint:
    """The constraint that the output is JSON valid against ``schema`` (a JSON Schema
    object). Raises ``GrammarError`` where it is not an object llguidance takes."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), overrides=COMPACT_JSON
        )
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    return GrammarConstraint(grammar, "json_schema")


def json_object_grammar() -> GrammarConstraint:
    """Any JSON object (OpenAI's ``json_object``)."""
    return GrammarConstraint(
        llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', overrides=COMPACT_JSON),
        "json_object",
    )


def regex_grammar(regex: str) -> GrammarConstraint:
    """The whole output matches ``regex`` (Rust's regex syntax: no lookaround, no
    backreferences); whether it compiles is ``Grammars.compile``'s to say."""
    return GrammarConstraint(llguidance.LLMatcher.grammar_from_regex(regex), "regex")


def json_rule(schema: dict[str, Any]) -> str:
    """A lark rule's body (llguidance's ``%json``) for JSON valid against ``schema``, spaced
    as ``COMPACT_JSON`` (the same JSON ``json_schema_grammar`` allows), to embed in a larger
    grammar (``lark_grammar``)."""
    return "%json " + json.dumps({**schema, "x-guidance": COMPACT_JSON})


def lark_grammar(lark: str, source: GrammarSource) -> GrammarConstraint:
    """The output matches ``lark`` (llguidance's lark dialect, ``%json`` rules included);
    whether it compiles is ``Grammars.compile``'s to say."""
    return GrammarConstraint(llguidance.LLMatcher.grammar_from_lark(lark), source)


def choice_grammar(choices: Sequence[str]) -> GrammarConstraint:
    """The output is one of ``choices`` exactly (non-empty strings)."""
    lark = "start: " + " | ".join(json.dumps(choice) for choice in choices)
    return GrammarConstraint(llguidance.LLMatcher.grammar_from_lark(lark), "choice")


class Grammars:
    """One engine's grammars: the llguidance tokenizer (its vocabulary read from the engine's
    ``tokenizers.Tokenizer``, ~0.5 s, built on first use) and the compiled grammars by key.
    Thread-safe: the server compiles on a worker thread, the engine makes states on its own."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int | None, eos_token_ids: Iterable[int]
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._checker: GrammarChecker | None = None

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llguidance.LLTokenizer(
                    self._tokenizer.to_str(),
                    n_vocab=self._vocab_size,
                    eos_token=self._eos or None,
                )
            return self._lltokenizer

    def compile(self, constraint: GrammarConstraint, timeout_s: float | None = None) -> None:
        """Compile ``constraint`` (or find it compiled); ``GrammarError`` says why it cannot
        be. Compiling drops the GIL and is bounded by ``grammar_limits``; with ``timeout_s``,
        a grammar not compiled yet is first compiled in a worker process that is killed past
        the deadline (engine/grammar_check.py), and refused then."""
        if timeout_s is not None and not self.is_compiled(constraint):
            try:
                refusal = self.checker.check(constraint.grammar, timeout_s)
            except CompileTimeout as exc:
                raise GrammarError(str(exc)) from None
            if refusal:
                raise GrammarError(refusal)
        self._template(constraint)

    @property
    def checker(self) -> GrammarChecker:
        """The compile worker (started on the first check)."""
        with self._lock:
            if self._checker is None:
                self._checker = GrammarChecker(
                    self._tokenizer.to_str(), self._vocab_size, self._eos
                )
            return self._checker

    def state(self, constraint: GrammarConstraint) -> GrammarState:
        """A new sequence's own matcher, at the grammar's start."""
        template = self._template(constraint)
        with self._lock:
            matcher = template.deep_copy()
        return GrammarState(matcher, self)

    @property
    def vocab_size(self) -> int:
        """The masks' width: the model's vocabulary (the tokenizer's, where not given)."""
        return self.lltokenizer.vocab_size

    def is_compiled(self, constraint: GrammarConstraint) -> bool:
        """Whether ``constraint`` is compiled already (``compile`` is then a lookup)."""
        with self._lock:
            return constraint.key in self._compiled

    def cached(self) -> int:
        with self._lock:
            return len(self._compiled)

    def _template(self, constraint: GrammarConstraint) -> llguidance.LLMatcher:
        key = constraint.key
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                self._compiled.move_to_end(key)
                return found
        tokenizer = self.lltokenizer
        matcher = llguidance.LLMatcher(
            tokenizer, constraint.grammar, log_level=0, limits=grammar_limits()
        )
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        with self._lock:
            self._compiled[key] = matcher
            while len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher


class GrammarState:
    """One sequence's place in its grammar: the matcher has consumed ``consumed`` tokens,
    which are the sequence's output tokens (``sync`` restores that after a change)."""

    __slots__ = ("consumed", "matcher", "owner")

    def __init__(self, matcher: llguidance.LLMatcher, owner: Grammars) -> None:
        self.matcher = matcher
        self.owner = owner
        self.consumed = 0

    def advance(self, token: int) -> bool:
        """``token`` was appended to the output: consume it. Returns whether the grammar has
        ended (nothing but EOS may follow). A token the grammar refuses leaves the matcher in
        its error state, which fails the row at its next step (``mask_logits``)."""
        self.consumed += 1
        self.matcher.consume_token(token)
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def sync(self, output_token_ids: Sequence[int]) -> None:
        """Reset and re-feed the output so far (the matcher's count and the output's differ)."""
        self.matcher.reset()
        self.matcher.consume_tokens(list(output_token_ids))
        self.consumed = len(output_token_ids)

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None
