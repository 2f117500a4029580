"""Log-probabilities (``SamplingParams.logprobs``) are those of transformers' logits for the
same checkpoint: a log-softmax of the raw logits (before temperature, top-k, top-p), for
greedy and sampled rows, the top-N most likely first, under every policy; nothing is computed
for a row that does not ask.

Tolerances: the chosen tokens' logprobs agree with transformers' within 1e-4 (measured: 5e-5).
The top-N alternatives' within 5e-4 (measured: 2.5e-4): this random-weight checkpoint's logits
reach 60-75, and at that scale two float32 forwards of the same model disagree that much on
unlikely tokens — transformers' own float32 forward differs from its float64 forward by up to
8e-4 there, its sdpa and eager attention by 1.5e-4. ``test_logprobs_are_the_log_softmax_of_the_
engine_logits`` pins the computation itself (1e-6 against the logits the engine sampled from).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.batch import StepResult
from engine.outputs import RequestOutput, TokenLogprob
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from serving.engine import LLMEngine
from serving.llm import LLM
from tests.reference import HFReference

TOLERANCE = 1e-4
TOP_TOLERANCE = 5e-4
RELATIVE = 1e-5
"""Added per unit of the logprob's size: the weight products run on oneDNN's packed weights
(engine.model.products) sum in another order than transformers' ``F.linear`` (a logprob of
-63.356 differed by 1.6e-4, 2.5e-6 of it)."""
PROMPTS = [[5, 17, 300, 42, 7, 1999, 64], list(range(100, 140))]
POLICIES = ["continuous", "static", "dynamic", "hybrid"]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> HFReference:
    return HFReference(tiny_model_dir)


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(tiny_model_dir, num_kv_blocks=128, num_threads=1)


def hf_logprobs(reference: HFReference, prompt: list[int], output: list[int]) -> torch.Tensor:
    """transformers' log-softmax at every position that predicted an output token."""
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt + output[:-1]])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)


def run(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> list[RequestOutput]:
    """Every output of one request, in order."""
    request_id = engine.add_request(prompt, params)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
    return outputs


def assert_matches(entries: list[TokenLogprob], expected: torch.Tensor, width: int) -> None:
    assert len(entries) == expected.shape[0]
    for entry, row in zip(entries, expected, strict=True):
        want = float(row[entry.token_id])
        assert abs(entry.logprob - want) < TOLERANCE + RELATIVE * abs(want)
        assert len(entry.top) == width
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)  # most likely first
        top = torch.topk(row, width)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        for (_, value), want in zip(entry.top, top.values.tolist(), strict=True):
            assert abs(value - want) < TOP_TOLERANCE + RELATIVE * abs(want)


@pytest.mark.parametrize("policy", POLICIES)
def test_greedy_logprobs_equal_transformers_log_softmax(
    llm: LLM, reference: HFReference, policy: str
) -> None:
    llm.set_policy(policy)
    for prompt in PROMPTS:
        params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=5, ignore_eos=True)
        final = run(llm.engine, prompt, params)[-1]
        assert final.logprobs is not None
        assert [e.token_id for e in final.logprobs] == final.token_ids
        expected = hf_logprobs(reference, prompt, final.token_ids)
        assert_matches(final.logprobs, expected, 5)
        # greedy: the chosen token is the most likely one
        assert all(e.top[0][0] == e.token_id for e in final.logprobs)
    llm.set_policy("continuous")


def test_logprobs_are_the_log_softmax_of_the_engine_logits(llm: LLM) -> None:
    """Exactly what the sampler saw, before temperature/top-k/top-p, for a sampled row."""
    runner = llm.engine.runner
    sampler = runner.sampler
    seen: list[torch.Tensor] = []

    def capture(logits: torch.Tensor, seqs: list[Sequence]) -> StepResult:
        seen.append(logits.detach().float().clone())
        return sampler(logits, seqs)

    runner.sampler = capture
    try:
        params = SamplingParams(max_tokens=6, temperature=0.7, top_k=5, seed=3, logprobs=4)
        final = run(llm.engine, PROMPTS[0], params)[-1]
    finally:
        runner.sampler = sampler
    assert len(seen) == len(final.logprobs or [])
    for logits, entry in zip(seen, final.logprobs or [], strict=True):
        row = torch.log_softmax(logits[0], dim=-1)
        assert abs(entry.logprob - float(row[entry.token_id])) < 1e-6
        top = torch.topk(row, 4)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert (
            max(abs(v - w) for (_, v), w in zip(entry.top, top.values.tolist(), strict=True)) < 1e-6
        )


def test_sampled_logprobs_are_of_the_raw_distribution(llm: LLM, reference: HFReference) -> None:
    """Temperature, top-k and top-p change what is sampled, never the logprobs returned."""
    prompt = PROMPTS[1]
    params = SamplingParams(
        max_tokens=12, temperature=1.7, top_p=0.9, top_k=40, seed=11, logprobs=3, ignore_eos=True
    )
    final = run(llm.engine, prompt, params)[-1]
    expected = hf_logprobs(reference, prompt, final.token_ids)
    assert_matches(final.logprobs or [], expected, 3)
    # sampled at temperature 1.7, some token was not the most likely one
    assert any(e.top[0][0] != e.token_id for e in final.logprobs or [])


def test_logprobs_zero_gives_the_chosen_token_only(llm: LLM, reference: HFReference) -> None:
    prompt = PROMPTS[0]
    final = run(llm.engine, prompt, SamplingParams(max_tokens=4, temperature=0.0, logprobs=0))[-1]
    assert final.logprobs is not None and all(e.top == () for e in final.logprobs)
    assert_matches(final.logprobs, hf_logprobs(reference, prompt, final.token_ids), 0)


def test_streamed_logprobs_add_up_to_the_final_ones(llm: LLM) -> None:
    params = SamplingParams(max_tokens=9, temperature=0.0, logprobs=2)
    outputs = run(llm.engine, PROMPTS[0], params)
    streamed = [e for o in outputs for e in o.new_logprobs or []]
    assert streamed == outputs[-1].logprobs
    assert all(len(o.new_logprobs or []) == len(o.new_token_ids) for o in outputs)


@pytest.mark.parametrize("policy", POLICIES)
def test_prompt_logprobs_equal_transformers_log_softmax(
    tiny_model_dir: Path, reference: HFReference, policy: str
) -> None:
    """Every prompt token from the second on, computed in 32-token chunks (chunked prefill,
    or the padded groups' sub-batches), with the prompt's blocks already in the prefix cache
    (a request asking for prompt logprobs takes no hits: it computes every position)."""
    llm = LLM(
        tiny_model_dir, num_kv_blocks=128, num_threads=1, policy=policy, max_num_batched_tokens=32
    )
    prompt = PROMPTS[0] + list(range(300, 370))
    llm.generate([prompt], SamplingParams(max_tokens=1))  # publishes the prompt's blocks
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=4, n=2)
    outputs = run(llm.engine, prompt, params)
    final = outputs[-1]
    assert final.metrics.num_cached_tokens == 0
    entries = final.prompt_logprobs or []
    assert [e.token_id for e in entries] == prompt[1:]
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt])).logits[0].float()
    assert_matches(entries, torch.log_softmax(logits[:-1], dim=-1), 4)
    assert all(o.prompt_logprobs == entries for o in outputs if o.finished)  # both choices
    assert final.logprobs is None  # output logprobs were not asked for


def test_no_logprobs_unless_asked(llm: LLM) -> None:
    final = run(llm.engine, PROMPTS[0], SamplingParams(max_tokens=3, temperature=0.0))[-1]
    assert final.logprobs is None and final.new_logprobs is None
    # the sampler computes none for a batch in which no row asks
    seqs = [Sequence(str(i), [1, 2], SamplingParams(temperature=0.0), 0.0) for i in range(2)]
    logits = torch.randn(2, 50)
    result = Sampler(torch.Generator())(logits, seqs)
    assert isinstance(result, StepResult) and result.logprobs is None
    # and only for the rows that ask in a batch that mixes them
    seqs[1] = Sequence("1", [1, 2], SamplingParams(temperature=0.0, logprobs=1), 0.0)
    mixed = Sampler(torch.Generator())(logits, seqs).logprobs
    assert mixed is not None and mixed[0] is None
    assert mixed[1] is not None and mixed[1].token_id == int(logits[1].argmax())


def test_logprobs_bounds() -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=-1)
