"""The GPU check's CPU smoke run, and the random-weight model it builds the engine from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.builder import load_bundle
from engine.checkpoint_parts import RandomWeights
from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_cpu_smoke_run_passes_every_part(tmp_path: Path):
    """The device command's code path, end to end: a script run, as on the GPU machine."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself for --cpu-smoke
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--cpu-smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {}
    assert doc["environment"]["triton_interpret"] == "1"
    assert doc["write_kv_cache"]["exact_match"] is True
    for row in doc["decode"]:  # bf16 kernels against the bf16 reference
        assert row["max_abs_err_vs_torch"] < 0.05, row
    assert doc["prefill"]["max_abs_err_vs_torch"] < 0.05
    assert [c for c in doc["decode_sweep"]["configs"] if "error" in c] == []
    engine = doc["engine"]
    assert engine["preset"] == "tiny" and engine["attention_backend"] == "triton"
    assert engine["all_finished"] is True
    agreement = engine["greedy_vs_torch_backend"]
    assert agreement["identical"] == agreement["requests"] == 3


def test_random_weights_equal_the_checkpoint_init_model_writes(tiny_model_dir: Path):
    config = EngineConfig(model=str(tiny_model_dir))
    from_file = load_bundle(config)
    in_memory = load_bundle(config, RandomWeights("tiny", seed=0))
    expected, got = from_file.model.state_dict(), in_memory.model.state_dict()
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert in_memory.eos_token_ids == from_file.eos_token_ids
    assert in_memory.tokenizer is not None and from_file.tokenizer is not None
    assert in_memory.tokenizer.to_str() == from_file.tokenizer.to_str()
    other_seed = load_bundle(config, RandomWeights("tiny", seed=1)).model.state_dict()
    assert not torch.equal(other_seed["embed_tokens"], got["embed_tokens"])


def test_random_weights_name_a_known_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        RandomWeights("gpt-5")
