"""Sampling is numerically safe for every accepted value, and a row that still fails ends only
its own request (issue 11, defect 1): the neighbours' tokens equal their solo greedy runs."""

from __future__ import annotations

import math

import pytest
import torch

from engine.batch import FAILED_TOKEN
from engine.sampler import Sampler
from engine.sampling_params import SEED_MAX, SEED_MIN, SamplingParams
from engine.sequence import Sequence
from serving.llm import LLM

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
NEIGHBOUR = [11, 12, 13, 14, 15, 16, 17]


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLM:
    return LLM(tiny_model_dir, max_model_len=256)


@pytest.fixture(scope="module")
def solo(llm) -> list[int]:
    return llm.generate([NEIGHBOUR], GREEDY)[0].token_ids


class RowSampler(Sampler):
    """The real sampler with one request's row tampered with: NaN logits, or an exception."""

    def __init__(self, inner: Sampler, target: str, fault: str) -> None:
        super().__init__(inner.generator)
        self.target, self.fault = target, fault

    def __call__(self, logits, seqs):
        rows = [i for i, s in enumerate(seqs) if s.seq_id == self.target]
        if rows and self.fault == "nan":
            logits = logits.clone()
            logits[rows[0]] = float("nan")
        return super().__call__(logits, seqs)

    def sample_row(self, logits, seq):
        if seq.seq_id == self.target and self.fault == "raise":
            raise RuntimeError("row exploded")
        return super().sample_row(logits, seq)


@pytest.fixture
def tampered(llm):
    runner = llm.engine.runner
    inner = runner.sampler

    def install(target: str, fault: str) -> None:
        runner.sampler = RowSampler(inner, target, fault)

    yield install
    runner.sampler = inner


def _run_beside_neighbour(llm, prompt: list[int], params: SamplingParams, request_id: str):
    engine = llm.engine
    engine.add_request(prompt, params, request_id)
    neighbour = engine.add_request(NEIGHBOUR, GREEDY)
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.kv_stats().used == 0, "the failed request's blocks were freed"
    return final[request_id], final[neighbour]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=4, temperature=1e-45),
        SamplingParams(max_tokens=4, temperature=1e-300),
        SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-300),
        SamplingParams(max_tokens=4, temperature=1e-6, top_p=1e-45, top_k=1),
        SamplingParams(max_tokens=4, temperature=2.0, top_p=5e-324, seed=SEED_MAX),
    ],
    ids=["temp-1e-45", "temp-1e-300", "top_p-1e-300", "tiny-everything", "top_p-denormal"],
)
def test_extreme_params_sample_and_leave_the_neighbour_alone(llm, solo, params):
    out, neighbour = _run_beside_neighbour(llm, [5, 6, 7], params, f"x-{params.top_p}")
    assert out.finish_reason == "length" and len(out.token_ids) == 4 and out.error is None
    assert neighbour.token_ids == solo


def test_tiny_temperature_and_top_p_are_greedy(llm):
    greedy = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0))[0]
    tiny_t = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=1e-45))[0]
    tiny_p = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, top_p=1e-300, seed=3))[0]
    assert tiny_t.token_ids == greedy.token_ids == tiny_p.token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_nan_logits_fail_only_their_request(llm, solo, tampered, temperature):
    tampered("nan-row", "nan")
    params = SamplingParams(max_tokens=6, temperature=temperature)
    out, neighbour = _run_beside_neighbour(llm, [5, 6, 7], params, "nan-row")
    assert out.finish_reason == "error" and "no finite logit" in out.error
    assert neighbour.token_ids == solo and neighbour.finish_reason == "length"


def test_a_raising_sampler_row_fails_only_its_request(llm, solo, tampered):
    tampered("bad-row", "raise")
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=1)
    out, neighbour = _run_beside_neighbour(llm, [5] * 40, params, "bad-row")
    assert out.finish_reason == "error" and "row exploded" in out.error
    assert out.token_ids == [] and out.metrics.finish_time is not None
    assert neighbour.token_ids == solo
    assert llm.engine.stats.requests_finished >= 2


def test_a_failed_row_in_a_padded_group_frees_it_and_the_group_goes_on(llm, solo, tampered):
    llm.set_policy("dynamic", max_batch_size=4, length_window=4096)
    try:
        tampered("grouped-bad", "raise")
        params = SamplingParams(max_tokens=6, temperature=0.8)
        out, neighbour = _run_beside_neighbour(llm, [9] * 30, params, "grouped-bad")
    finally:
        llm.set_policy("continuous")
    assert out.finish_reason == "error"
    assert neighbour.token_ids == solo


def _seq(params: SamplingParams, name: str = "s") -> Sequence:
    return Sequence(name, [1, 2], params, 0.0)


def test_sampler_handles_inf_and_nan_rows_without_an_invalid_distribution():
    sampler = Sampler(torch.Generator().manual_seed(0))
    logits = torch.tensor(
        [
            [1.0, float("inf"), 2.0, float("nan")],
            [float("nan"), 0.5, float("-inf"), 0.1],
            [float("nan")] * 4,
            [float("-inf")] * 4,
            [3.0, 1.0, float("inf"), float("inf")],
        ]
    )
    hot = SamplingParams(temperature=1.0, top_p=0.5)
    seqs = [_seq(hot, "a"), _seq(hot, "b"), _seq(hot, "c"), _seq(GREEDY, "d"), _seq(hot, "e")]
    result = sampler(logits, seqs)
    assert result.token_ids[:2] == [1, 1]
    assert result.token_ids[2] == result.token_ids[3] == FAILED_TOKEN
    assert set(result.failed) == {"c", "d"}
    assert result.token_ids[4] in (2, 3)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("temperature", {"temperature": math.nan}),
        ("temperature", {"temperature": math.inf}),
        ("top_p", {"top_p": math.nan}),
        ("top_p", {"top_p": -math.inf}),
        ("seed", {"seed": SEED_MAX + 1}),
        ("seed", {"seed": SEED_MIN - 1}),
    ],
)
def test_non_finite_values_and_seeds_out_of_range_are_refused(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("seed", [SEED_MIN, -1, 0, SEED_MAX])
def test_every_accepted_seed_seeds_a_generator(llm, seed):
    params = SamplingParams(max_tokens=2, temperature=1.0, top_k=-1, seed=seed)
    assert len(llm.generate([[5, 6]], params)[0].token_ids) == 2
