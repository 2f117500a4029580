"""Seeded request lists: the same seed gives the same list, lengths follow the preset scale."""

from __future__ import annotations

import pytest

from bench import workloads as wl
from bench.presets import PRESETS
from bench.recording import EntryShape
from bench.replay import build_batch


def test_same_seed_same_requests():
    a = wl.burst(50, variable_output=True, scale=10, vocab_size=8192, seed=3)
    b = wl.burst(50, variable_output=True, scale=10, vocab_size=8192, seed=3)
    assert a == b
    assert a != wl.burst(50, variable_output=True, scale=10, vocab_size=8192, seed=4)


def test_burst_lengths_are_the_article_divided_by_the_scale():
    fixed = wl.burst(200, variable_output=False, scale=10, vocab_size=8192, seed=0)
    variable = wl.burst(200, variable_output=True, scale=10, vocab_size=8192, seed=0)
    assert all(50 <= len(r.prompt) <= 200 for r in fixed.requests)
    assert {r.max_tokens for r in fixed.requests} == {20}
    assert all(4 <= r.max_tokens <= 36 for r in variable.requests)
    assert len({r.max_tokens for r in variable.requests}) > 10
    assert all(r.arrival == 0.0 for r in fixed.requests)
    assert all(2 <= t < 8192 for r in fixed.requests for t in r.prompt)


def test_poisson_arrivals_are_seeded_and_keep_the_requests():
    base = wl.burst(400, variable_output=True, scale=10, vocab_size=8192, seed=0)
    a = base.with_poisson_arrivals(rate=5.0, seed=1)
    assert a == base.with_poisson_arrivals(rate=5.0, seed=1)
    arrivals = [r.arrival for r in a.requests]
    assert arrivals == sorted(arrivals)
    assert 400 / arrivals[-1] == pytest.approx(5.0, rel=0.2)
    assert [r.prompt for r in a.requests] == [r.prompt for r in base.requests]


def test_short_long_has_a_few_long_prompts():
    w = wl.short_long(100, 0.05, scale=10, vocab_size=8192, seed=0)
    long = [r for r in w.requests if r.tag == "long"]
    assert len(long) == 5
    assert min(len(r.prompt) for r in long) > max(
        len(r.prompt) for r in w.requests if r.tag == "short"
    )


def test_issue_two_workload_on_the_cpu_preset_is_unscaled():
    p = PRESETS["cpu"]
    w = wl.mixed(p.mixed_requests, p.mixed_inputs, p.mixed_output, 8192, 0)
    assert len(w.requests) == 64
    assert all(32 <= len(r.prompt) <= 512 for r in w.requests)
    assert {r.max_tokens for r in w.requests} == {64}


def test_closed_loop_takes_the_head_of_the_list():
    base = wl.burst(20, variable_output=False, scale=10, vocab_size=8192, seed=0)
    loop = base.closed_loop(clients=4, num_requests=8)
    assert loop.clients == 4 and loop.concurrency == 4
    assert loop.requests == base.requests[:8]


def test_replay_rebuilds_each_entry_kind():
    shapes = [
        EntryShape(computed=40, new=1, pads=0, sample=True),  # decode
        EntryShape(computed=0, new=30, pads=10, sample=True),  # padded prefill
        EntryShape(computed=16, new=16, pads=0, sample=False),  # chunk short of the end
        EntryShape(computed=25, new=0, pads=1, sample=False),  # finished row, recomputed
    ]
    batch = build_batch(shapes, num_blocks=64, block_size=16)
    kinds = [(e.kind, e.sample, e.num_new_tokens, e.num_pad_tokens) for e in batch.entries]
    assert kinds == [
        ("decode", True, 1, 0),
        ("prefill", True, 30, 10),
        ("prefill", False, 16, 0),
        ("pad", False, 0, 1),
    ]
    assert [e.seq.num_computed_tokens for e in batch.entries] == [40, 0, 16, 25]
    assert len(batch.entries[1].seq.block_table) * 16 >= 40
