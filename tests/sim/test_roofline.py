"""The roofline profiles: a lone request's TTFT and TPOT sit between the hand roofline and twice
it, the KV pool is what is left of the GPU, every constant states its source."""

from __future__ import annotations

import json

import pytest

from sim.cost_model import StepShape
from sim.models import load_cost_model, profile_names
from sim.roofline import PROFILES, GpuProfile, ModelShape, RooflineModel
from sim.simulator import simulate
from sim.trace import TraceRequest

A100 = "a100-80g/llama3-8b"


@pytest.mark.parametrize("prompt", [200, 1000, 2000])
def test_one_request_on_the_a100_is_within_twice_the_hand_roofline_and_never_below(
    prompt: int,
) -> None:
    """Hand roofline, from the datasheet and the model shape alone: TTFT = prefill FLOPs (2 ×
    decoder params × prompt tokens + the LM head for the one row sampled) / (peak × the stated
    achievable fraction); TPOT = weight bytes / peak HBM bandwidth."""
    model = load_cost_model(A100)
    assert isinstance(model, RooflineModel)
    gpu = json.loads((PROFILES / "gpus" / "a100-80g.json").read_text())
    assert gpu["hbm_bandwidth_bytes_per_s"] == 2.039e12 and gpu["peak_flops_bf16"] == 312e12
    hidden, vocab = 4096, 128256
    decoder_params = 8.03e9 - 2 * vocab * hidden  # Llama 3 8B less its two embedding tables
    flops = 2 * decoder_params * prompt + 2 * vocab * hidden
    hand_ttft = flops / (gpu["peak_flops_bf16"] * gpu["flops_efficiency"])
    hand_tpot = 8.03e9 * 2 / gpu["hbm_bandwidth_bytes_per_s"]

    result = simulate([TraceRequest(0.0, prompt, 50)], model, "continuous")
    (record,) = result.records
    ttft, tpot = record.metrics.ttft, record.metrics.tpot
    assert hand_ttft <= ttft <= 2 * hand_ttft, (ttft, hand_ttft)
    assert hand_tpot <= tpot <= 2 * hand_tpot, (tpot, hand_tpot)


def test_a_decode_step_pays_for_the_kv_it_reads() -> None:
    """64 decode rows over 4,000 tokens each read 33.5 GB of K/V beside 16 GB of weights."""
    model = load_cost_model(A100)
    short = model.step_time(StepShape(decode_context=(100,) * 64))
    long = model.step_time(StepShape(decode_context=(4000,) * 64))
    kv_read = 64 * 3900 * 131072
    assert long - short == pytest.approx(kv_read / (2.039e12 * 0.85), rel=1e-6)


@pytest.mark.parametrize("name", profile_names())
def test_kv_pool_is_what_the_gpu_has_left(name: str) -> None:
    model = load_cost_model(name)
    assert isinstance(model, RooflineModel)
    gpu, shape = model.gpu, model.model
    assert 8.0e9 < shape.num_params < 8.1e9
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    left = gpu.memory_bytes * 0.90 - shape.weight_bytes - shape.activation_reserve_bytes
    left -= gpu.runtime_reserve_bytes
    blocks = model.kv_cache_blocks(16)
    assert blocks * 16 * shape.kv_bytes_per_token <= left
    assert (blocks + 1) * 16 * shape.kv_bytes_per_token > left


def test_the_article_burst_of_500_does_not_fit_an_a100_at_once() -> None:
    """500 × ~1,450 tokens of K/V is ~95 GB: more than an 80 GB A100 has left after the
    weights, so capacity shows in the prediction (requests wait or are preempted)."""
    model = load_cost_model(A100)
    demand = 500 * 1450 * model.model.kv_bytes_per_token
    assert demand > model.kv_cache_blocks(16) * 16 * model.model.kv_bytes_per_token


def test_every_constant_states_its_source() -> None:
    for kind, cls in (("gpus", GpuProfile), ("models", ModelShape)):
        for path in (PROFILES / kind).glob("*.json"):
            data = json.loads(path.read_text())
            cls.load(path)  # every field present
            numbers = [k for k, v in data.items() if isinstance(v, int | float)]
            if kind == "gpus":
                assert all(f"{k}_source" in data for k in numbers), path
            else:
                assert data["source"] and data["activation_reserve_bytes_source"], path


def test_unknown_profiles_are_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="a100-80g/llama3-8b"):
        load_cost_model("nonsense")
    with pytest.raises(ValueError, match="a100-80g"):
        load_cost_model("v100/llama3-8b")
