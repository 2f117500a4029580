"""The text journal (control/requests_text.py) on its own: what it keeps, cuts and drops."""

from __future__ import annotations

from datetime import UTC, datetime

from control.requests_text import TextJournal, watched
from engine.outputs import RequestMetrics, RequestOutput


def output(
    seq_id: str, delta: str, finish: str | None = None, request_id: str = ""
) -> RequestOutput:
    """An output as the engine makes it, by hand: only the fields the journal reads matter."""
    return RequestOutput(
        request_id or seq_id,
        [1, 2],
        [],
        [3],
        delta,
        delta,
        finish,
        RequestMetrics(arrival_time=0.0),
        seq_id=seq_id,
    )


def test_a_sequence_keeps_its_prompt_and_its_streamed_output_until_it_finishes() -> None:
    journal = TextJournal()
    journal.start("r1", "r1", "Once upon")
    journal.record(output("r1", " a"))
    running = journal.get("r1")
    assert running is not None
    assert (running.state, running.prompt, running.output) == ("running", "Once upon", " a")
    assert running.finished_at is None and running.finish_reason is None
    journal.record(output("r1", " time", finish="length"))
    done = journal.get("r1")
    assert done is not None
    assert (done.state, done.output, done.finish_reason) == ("finished", " a time", "length")
    assert done.finished_at is not None and done.started_at <= done.finished_at
    assert not done.prompt_truncated and not done.output_truncated


def test_text_past_the_cap_is_cut_and_says_so() -> None:
    journal = TextJournal(max_chars=8)
    journal.start("r", "r", "0123456789ab")
    for delta in ("abcde", "fghij", "klm"):
        journal.record(output("r", delta))
    seen = journal.get("r")
    assert seen is not None
    assert (seen.prompt, seen.prompt_chars, seen.prompt_truncated) == ("01234567", 12, True)
    assert (seen.output, seen.output_chars, seen.output_truncated) == ("abcdefgh", 13, True)
    assert seen.max_chars == 8


def test_only_the_last_finished_are_kept_and_running_ones_never_dropped() -> None:
    journal = TextJournal(finished_kept=2)
    journal.start("long", "long", "p")
    for i in range(4):
        journal.start(f"r{i}", f"r{i}", "p")
        journal.record(output(f"r{i}", "x", finish="stop"))
    assert journal.get("r0") is None and journal.get("r1") is None
    assert journal.get("r2") is not None and journal.get("r3") is not None
    still = journal.get("long")
    assert still is not None and still.state == "running"


def test_a_closed_stream_ends_its_running_sequences_and_the_finished_hook_settles() -> None:
    journal = TextJournal()
    journal.start("r", "r", "p")
    journal.start("r#1", "r", "p")
    journal.record(output("r", "a", finish="stop"))
    journal.end("r", "abort")
    first, fork = journal.get("r"), journal.get("r#1")
    assert first is not None and fork is not None
    assert (first.finish_reason, fork.finish_reason, fork.state) == ("stop", "abort", "finished")
    journal.start("s", "s", "p")
    journal.settle(output("s", "", finish="length"))  # its stream is read later, if at all
    journal.record(output("s", "late"))
    settled = journal.get("s")
    assert settled is not None
    assert (settled.state, settled.finish_reason, settled.output) == ("finished", "length", "late")


def test_an_unknown_or_unstarted_id_has_nothing() -> None:
    journal = TextJournal(clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    journal.record(output("never-started", "text"))
    journal.settle(output("never-started", "", finish="stop"))
    assert journal.get("never-started") is None


def test_without_a_journal_the_stream_is_untouched_and_the_prompt_never_made() -> None:
    class Stream:  # only its identity matters: watched hands it back as it is
        request_id = "r"

    def prompt() -> str:
        raise AssertionError("the prompt was decoded without a journal")

    stream = Stream()
    assert watched(None, stream, prompt) is stream  # type: ignore[arg-type]
