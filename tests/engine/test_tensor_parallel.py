"""Tensor parallelism on the CPU (gloo on loopback): at ``tensor_parallel_size`` 2 greedy
decoding equals transformers under two policies and across policy switches; a size that does
not divide the heads is refused before any process starts; the worker ranks stop when the LLM
is closed or its process exits, and a worker that dies ends the engine with an error."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.parallel.world import TensorParallelError
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.reference import HFReference, assert_same_as_reference, max_tokens_for, mixed_prompts

PICK = (0, 2, 4, 5, 7, 9, 11, 14)
"""Prompts of 1, 7, 16, 17, 33, 65, 128 and 257 tokens: around block boundaries."""


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> HFReference:
    return HFReference(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(reference) -> list[list[int]]:
    every = mixed_prompts(reference.model.config.vocab_size)
    return [every[i] for i in PICK]


@pytest.fixture(scope="module")
def params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=max_tokens_for(i), temperature=0) for i in range(len(PICK))]


@pytest.fixture(scope="module")
def expected(reference, prompts, params) -> list[list[int]]:
    return [reference.generate(p, s.max_tokens) for p, s in zip(prompts, params, strict=True)]


@pytest.fixture(scope="module")
def tp_llm(tiny_model_dir):
    """One tensor-parallel engine per process at a time: ``test_ranks_stop_when_the_llm_is_
    closed`` closes this one; the tests after it build their own."""
    with LLM(tiny_model_dir, tensor_parallel_size=2, num_kv_blocks=256) as llm:
        yield llm


def test_each_rank_holds_half_the_heads_and_its_own_kv(tp_llm):
    model = tp_llm.engine.runner.model
    attention = model.layers[0].self_attn
    assert (attention.num_heads, attention.num_kv_heads) == (2, 1)  # of 4 and 2
    assert model.layers[0].mlp.down_proj.shape[1] == 256  # of 512 columns
    assert tp_llm.engine.runner.kv_caches[0].shape[3] == 1  # this rank's one KV head
    assert len(tp_llm._bundle.parallel.pids) == 1


@pytest.mark.parametrize("policy", ["continuous", "dynamic"])
def test_greedy_matches_transformers_at_tp2(tp_llm, reference, prompts, params, expected, policy):
    tp_llm.set_policy(policy)
    outputs = tp_llm.generate(prompts, params)
    assert_same_as_reference(reference, prompts, expected, outputs)


def test_policy_switch_mid_run_at_tp2(tp_llm, reference, prompts, params, expected):
    engine = tp_llm.engine
    tp_llm.set_policy("continuous")
    ids = [engine.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
    final, step, switches = {}, 0, []
    while engine.has_unfinished_requests():
        if step in (3, 12, 25):
            target = "dynamic" if engine.policy.name == "continuous" else "continuous"
            engine.set_policy({"name": target, "params": {}}).result()
            switches.append(engine.policy.name)
        final.update({o.request_id: o for o in engine.step() if o.finished})
        step += 1
    assert switches == ["dynamic", "continuous", "dynamic"]
    assert_same_as_reference(reference, prompts, expected, [final[i] for i in ids])


@pytest.mark.parametrize(
    ("size", "field"), [(3, "num_attention_heads=4"), (4, "num_key_value_heads=2")]
)
def test_a_size_that_does_not_divide_the_heads_is_refused(tiny_model_dir, size, field):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=f"tensor_parallel_size={size} must divide .*{field}"):
        LLM(tiny_model_dir, tensor_parallel_size=size)
    assert set(multiprocessing.active_children()) == before, "a rank started anyway"


def test_a_second_engine_is_refused_while_one_is_open(tp_llm, tiny_model_dir):
    before = set(multiprocessing.active_children())
    with pytest.raises(TensorParallelError, match="close that LLM first"):
        LLM(tiny_model_dir, tensor_parallel_size=2)
    assert set(multiprocessing.active_children()) == before


def test_ranks_stop_when_the_llm_is_closed(tp_llm):
    pids = tp_llm._bundle.parallel.pids
    assert pids and all(_running(pid) for pid in pids)
    tp_llm.close()
    assert not any(_running(pid) for pid in pids)
    tp_llm.close()  # idempotent
    with pytest.raises(TensorParallelError, match="closed"):
        tp_llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))


def test_a_worker_that_dies_ends_the_engine_with_an_error(tiny_model_dir):
    with LLM(tiny_model_dir, tensor_parallel_size=2, num_kv_blocks=64) as llm:
        (worker,) = llm._bundle.parallel.processes
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        for _ in range(2):  # and every later step too
            started = time.monotonic()
            with pytest.raises(TensorParallelError, match="rank 1 exited with code -9"):
                llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))
            assert time.monotonic() - started < 5


def test_a_stuck_worker_fails_the_step_after_the_timeout_never_a_hang(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("engine.parallel.group.COLLECTIVE_TIMEOUT_S", 2.0)
    with LLM(tiny_model_dir, tensor_parallel_size=2, num_kv_blocks=64) as llm:
        (worker,) = llm._bundle.parallel.processes
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(TensorParallelError, match="stopped answering"):
                llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))
            assert time.monotonic() - started < 10
            started = time.monotonic()
            with pytest.raises(TensorParallelError, match="stopped answering"):
                llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))
            assert time.monotonic() - started < 1, "a later step waited again"
        finally:
            os.kill(worker.pid, signal.SIGCONT)


def test_ranks_stop_when_the_process_exits_without_close(tiny_model_dir):
    """A plain script that never closes its LLM leaves no rank behind (atexit)."""
    script = (
        "from serving.llm import LLM\n"
        f"llm = LLM({str(tiny_model_dir)!r}, tensor_parallel_size=2, num_kv_blocks=64)\n"
        "print(*llm._bundle.parallel.pids, flush=True)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 1
    _wait_gone(pids[0])


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _running(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.05)


def test_the_server_serves_with_two_ranks(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`servedeck serve --tensor-parallel-size 2`: the same greedy text as one rank."""
    import httpx

    from tests.control.support import TOKEN, ServerProcess

    body = {"prompt": "hello world", "max_tokens": 8, "temperature": 0.0}
    texts = []
    for size, workdir in (("1", tmp_path / "one"), ("2", tmp_path / "two")):
        workdir.mkdir()
        args = ["--admin-token", TOKEN, "--tensor-parallel-size", size]
        server = ServerProcess(tiny_model_dir, workdir, args, {})
        server.start()
        try:
            answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            texts.append(answer.json()["choices"][0]["text"])
        finally:
            server.stop()
    assert texts[0] == texts[1]
