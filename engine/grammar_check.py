"""A grammar's first compile, where it can be stopped: one spawned worker process that
compiles grammars sent through its pipe with the engine's tokenizer, answering each with
llguidance's refusal or none.

llguidance's parser limits (``engine.grammar.grammar_limits``) bound a compile's work, but a
Python thread cannot be stopped if they ever do not: so a grammar nobody has compiled yet is
compiled here first, under a deadline, and a compile past it kills the worker (the next check
starts a new one) and is refused. Only then does the server compile it itself (bounded: it
just compiled within the deadline). The worker needs llguidance only (no torch); it exits when
its server does.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import llguidance

WORKER_START_TIMEOUT_S = 60.0
"""A new worker: the interpreter, llguidance, and the tokenizer's vocabulary read (~1 s)."""
PARENT_CHECK_S = 0.5


class CompileTimeout(Exception):
    """The grammar did not compile within the deadline: its worker was killed."""


class GrammarChecker:
    """The worker and its pipe; ``check`` is called from worker threads, one at a time."""

    def __init__(self, tokenizer_json: str, vocab_size: int | None, eos: list[int]) -> None:
        self._setup = (tokenizer_json, vocab_size, eos)
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    def check(self, grammar: str, timeout_s: float) -> str:
        """llguidance's refusal of ``grammar`` ("" when it compiles); ``CompileTimeout`` when
        it takes longer than ``timeout_s`` (the worker is then killed)."""
        with self._lock:
            conn = self._conn if self._alive() and self._conn is not None else self._start()
            try:
                conn.send(grammar)
                if not conn.poll(timeout_s):
                    self._stop()
                    raise CompileTimeout(
                        f"the grammar took longer than {timeout_s:g} s to compile and was stopped"
                    )
                reply = conn.recv()
            except (EOFError, OSError) as exc:
                self._stop()
                raise CompileTimeout(f"the grammar's compile worker died: {exc}") from None
        assert isinstance(reply, str)
        return reply

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def _start(self) -> Connection:
        self._stop()
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=serve_worker,
            args=(theirs, *self._setup, os.getpid()),
            name="servedeck-grammar-check",
            daemon=True,
        )
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        if not (ours.poll(WORKER_START_TIMEOUT_S) and ours.recv() == "ready"):
            self._stop()
            raise CompileTimeout("the grammar's compile worker did not start")
        return ours

    def _stop(self) -> None:
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=5.0)
        if conn is not None:
            conn.close()


def serve_worker(
    conn: Connection,
    tokenizer_json: str,
    vocab_size: int | None,
    eos: list[int],
    parent_pid: int,
) -> None:
    """Compile each grammar from ``conn`` until the server closes its end."""
    from engine.grammar import grammar_limits

    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos or None)
    conn.send("ready")
    while True:
        try:
            grammar = conn.recv()
        except (EOFError, OSError):
            return
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=grammar_limits())
        conn.send(matcher.get_error() if matcher.is_error() else "")


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)
