"""The engine's front (engine/front.py): built from a config alone, it has the limits, the
tokenizer and the admission checks of the engine that config builds, and it never reads the
weights."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.builder import load_bundle
from engine.checkpoint_parts import RandomWeights
from engine.config import EngineConfig
from engine.errors import CheckpointError, RequestRejected
from engine.front import EngineFront
from engine.sampling_params import SamplingParams
from serving.engine import LLMEngine
from tests.engine.gguf_support import write_llama_q8

ROOT = Path(__file__).resolve().parents[2]


def _same_front(front: EngineFront, engine: LLMEngine) -> None:
    """``front``, built from the config alone, equals the front the engine built."""
    ours = engine.front
    assert front.limits == ours.limits
    assert front.vocab_size == ours.vocab_size
    assert front.eos_token_ids == ours.eos_token_ids
    assert front.max_prompt_bytes == ours.max_prompt_bytes
    assert (front.tokenizer is None) == (ours.tokenizer is None)
    if front.tokenizer is not None and ours.tokenizer is not None:
        text = "The quick brown fox jumps over the lazy dog."
        assert front.tokenize(text) == ours.tokenize(text)


def test_small_preset_front_equals_its_engine() -> None:
    config = EngineConfig(model="small", max_model_len=1024)
    weights = RandomWeights("small")
    engine = LLMEngine.from_config(config, bundle=load_bundle(config, weights))
    front = EngineFront.from_config(config, weights)
    _same_front(front, engine)
    assert front.limits.num_kv_blocks > 1000  # the default pool, counted the engine's way


def test_tiny_gguf_front_equals_its_engine(tmp_path: Path) -> None:
    config = EngineConfig(model=str(write_llama_q8(tmp_path / "tiny.gguf")))
    engine = LLMEngine.from_config(config)
    _same_front(EngineFront.from_config(config), engine)


def test_given_kv_size_and_the_pool_check_equal_the_engine(tiny_model_dir: Path) -> None:
    config = EngineConfig(
        model=str(tiny_model_dir), num_kv_blocks=37, max_model_len=1024, memory_reserve=0.2
    )
    engine = LLMEngine.from_config(config)
    front = EngineFront.from_config(config)
    _same_front(front, engine)
    assert front.limits.num_kv_blocks == 37
    # The pool is judged by its size above the reserve: what an empty pool admits.
    fits = engine.blocks.admissible * config.block_size - 1  # the prompt and one token
    params = SamplingParams(max_tokens=1)
    front.check_request([1] * fits, params)
    with pytest.raises(RequestRejected, match="KV pool admits at most") as refused:
        front.check_request([1] * (fits + 1), params)
    assert refused.value.param == "prompt"
    with pytest.raises(RequestRejected, match="KV pool admits at most"):
        engine.add_request([1] * (fits + 1), params)
    for bad, field in (([], "prompt"), ([10**6], "prompt"), ([1] * 1024, "prompt")):
        with pytest.raises(RequestRejected) as info:
            front.check_request(bad, params)
        assert info.value.param == field
    engine.set_memory_reserve(0.5).result()  # read at each check, as the pool reads it
    with pytest.raises(RequestRejected, match="KV pool admits at most"):
        front.check_request([1] * fits, params)


def test_a_front_reads_no_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A folder whose weights file is cut after its header still gives the whole front (the
    engine's build, which reads the tensors, refuses it), and building it imports no torch
    (nor does the KV pool's bookkeeping, engine/kv_cache.py and engine/kv_step.py)."""
    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, cut)
    weights = cut / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: 8 + int.from_bytes(data[:8], "little") + 16])
    intact = EngineFront.from_config(EngineConfig(model=str(tiny_model_dir)))
    front = EngineFront.from_config(EngineConfig(model=str(cut)))
    assert front.limits == intact.limits and front.vocab_size == intact.vocab_size
    assert front.tokenize("hello world") == intact.tokenize("hello world")
    with pytest.raises(CheckpointError, match="bad data offsets"):
        LLMEngine.from_config(EngineConfig(model=str(cut)))
    probe = (
        "import sys\n"
        "from engine.config import EngineConfig\n"
        "from engine.front import EngineFront\n"
        "import engine.kv_cache, engine.kv_step  # the KV bookkeeping: no torch either\n"
        f"front = EngineFront.from_config(EngineConfig(model={str(cut)!r}))\n"
        "assert front.tokenize('hello') and front.limits.num_kv_blocks > 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        timeout=60,
        check=True,
    )
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_a_missing_file_is_refused_as_the_engine_refuses_it(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        EngineFront.from_config(EngineConfig(model=str(tmp_path / "nothing")))
