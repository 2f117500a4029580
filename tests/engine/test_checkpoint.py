"""Random-weight checkpoints: sizes, determinism, Hugging Face compatibility, sharding."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from engine.checkpoint import PRESETS, build_tokenizer, default_model_dir, hf_config, init_model
from engine.model.config import ModelConfig
from engine.sampling_params import SamplingParams
from serving.llm import LLM


def test_preset_sizes_match_the_spec(tiny_model_dir):
    assert 2e6 <= PRESETS["tiny"].num_parameters() <= 4e6
    assert 30e6 <= PRESETS["small"].num_parameters() <= 60e6
    assert 7.9e9 <= PRESETS["llama3-8b"].num_parameters() <= 8.1e9
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    assert sum(t.numel() for t in tensors.values()) == PRESETS["tiny"].num_parameters()


def test_llama3_8b_config_has_the_real_shapes():
    config = hf_config(PRESETS["llama3-8b"], 0, 1)
    assert (config["hidden_size"], config["num_hidden_layers"]) == (4096, 32)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (32, 8)
    assert (config["intermediate_size"], config["vocab_size"]) == (14336, 128256)
    assert config["rope_scaling"]["rope_type"] == "llama3"
    assert ModelConfig.from_dict(config).head_dim == 128


def test_tokenizer_training_is_deterministic():
    assert build_tokenizer(512).to_str() == build_tokenizer(512).to_str()


def test_weights_are_deterministic_per_seed(tmp_path, tiny_model_dir):
    again = init_model(tmp_path / "again", "tiny", seed=0)
    other = init_model(tmp_path / "other", "tiny", seed=1)
    a = load_file(str(tiny_model_dir / "model.safetensors"))
    b = load_file(str(again / "model.safetensors"))
    c = load_file(str(other / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert (again / "tokenizer.json").read_text() == (tiny_model_dir / "tokenizer.json").read_text()


def test_transformers_loads_the_tokenizer_and_agrees(tiny_model_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    ours = LLM(tiny_model_dir, num_kv_blocks=64).tokenizer
    text = "The dynamic policy pads each group to its longest prompt."
    assert hf(text)["input_ids"] == ours.encode(text).ids
    assert ours.encode(text).ids[0] == hf.bos_token_id


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, tiny_model_dir):
    sharded = init_model(tmp_path / "sharded", "tiny", seed=0, max_shard_bytes=3 << 20)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (sharded / "model.safetensors").exists()
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompt = [[5, 6, 7, 8, 9]]
    single = LLM(tiny_model_dir, num_kv_blocks=64).generate(prompt, params)[0].token_ids
    assert LLM(sharded, num_kv_blocks=64).generate(prompt, params)[0].token_ids == single


def test_default_model_is_created_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path))
    path = default_model_dir("tiny")
    assert path == tmp_path / "models" / "tiny-seed0"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert default_model_dir("tiny") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_unknown_preset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        init_model(tmp_path, "huge")
