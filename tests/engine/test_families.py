"""Checkpoint families (Llama, Mistral, Qwen2 tied and untied, Qwen3) through the one decoder:
tiny random checkpoints written by transformers itself, greedy equality with its ``generate``
under every policy; sharded bfloat16 loading; errors that name what is wrong."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.errors import CheckpointError
from engine.model.config import ModelConfig
from engine.model.formats import read_model_config
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.reference import HFReference, assert_same_as_reference

POLICIES = ("continuous", "static", "dynamic", "hybrid")
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # SmolLM2-like: tied; attention_bias also puts a bias on o_proj.
    "llama": ("LlamaConfig", {"tie_word_embeddings": True, "attention_bias": True}),
    # A window in effect caps the context to it (128 < 1024).
    "mistral": ("MistralConfig", {"sliding_window": 128, "head_dim": 16}),
    "qwen2-tied": ("Qwen2Config", {"tie_word_embeddings": True, "rope_theta": 1e6}),
    "qwen2-untied": ("Qwen2Config", {"tie_word_embeddings": False}),
    # head_dim 24 != 64 / 4 heads, and not a power of two.
    "qwen3": ("Qwen3Config", {"head_dim": 24, "tie_word_embeddings": False}),
}
PROMPT_LENGTHS = (1, 9, 17, 40, 70)
MAX_TOKENS = (12, 16, 20, 12, 16)
STD = {"q_proj": 2.0, "k_proj": 2.0, "o_proj": 4.0, "down_proj": 4.0}
"""Weight scales (÷ sqrt(fan-in)) that keep top-2 logit margins far above float32 noise, as
``engine.checkpoint`` explains; norms and biases are random too, so a misplaced one shows."""


class FamilyReference(HFReference):
    @cached_property
    def model(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()


def sharpen(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() == 1:
                param.copy_((1.0 if "norm" in name else 0.0) + 0.3 * noise)
            elif "embed_tokens" in name or "lm_head" in name:
                param.copy_(noise)
            else:
                kind = name.split(".")[-2]
                param.copy_(noise * STD.get(kind, 1.0) / math.sqrt(param.shape[1]))


def write_family(
    out: Path, family: str, tokenizer_dir: Path, dtype: torch.dtype = torch.float32, **save: Any
) -> Path:
    """A random ``family`` checkpoint saved by transformers, with the tiny model's tokenizer."""
    import transformers

    config_class, extra = FAMILIES[family]
    vocab = read_model_config(tokenizer_dir)
    config = getattr(transformers, config_class)(
        **SHAPE,
        **extra,
        vocab_size=vocab.vocab_size,
        bos_token_id=vocab.bos_token_id,
        eos_token_id=vocab.eos_token_ids[0],
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    sharpen(model, seed=sum(map(ord, family)))
    model.to(dtype).save_pretrained(out, **save)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: write_family(root / name, name, tiny_model_dir) for name in FAMILIES}


@pytest.fixture(scope="module")
def prompts(tiny_model_dir) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    vocab = read_model_config(tiny_model_dir).vocab_size
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def references(checkpoints, prompts) -> dict[str, tuple[FamilyReference, list[list[int]]]]:
    out = {}
    for name, path in checkpoints.items():
        reference = FamilyReference(path)
        expected = [reference.generate(p, n) for p, n in zip(prompts, MAX_TOKENS, strict=True)]
        out[name] = (reference, expected)
    return out


def test_each_family_loads_with_its_switches(checkpoints):
    configs = {name: read_model_config(path) for name, path in checkpoints.items()}
    assert configs["llama"].attention_bias and configs["llama"].o_proj_bias
    assert configs["mistral"].sliding_window == 128
    assert configs["mistral"].max_position_embeddings == 128
    assert configs["qwen2-tied"].attention_bias and not configs["qwen2-tied"].o_proj_bias
    assert configs["qwen2-tied"].tie_word_embeddings
    assert not configs["qwen2-untied"].tie_word_embeddings
    assert configs["qwen3"].qk_norm and configs["qwen3"].head_dim == 24
    assert not configs["qwen3"].attention_bias


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_matches_transformers(checkpoints, prompts, references, family, policy):
    reference, expected = references[family]
    assert sum(len(set(tokens)) for tokens in expected) > 4 * len(expected), expected
    llm = LLM(checkpoints[family], policy=policy, block_size=16, num_kv_blocks=64)
    params = [SamplingParams(max_tokens=n, temperature=0) for n in MAX_TOKENS]
    assert_same_as_reference(reference, prompts, expected, llm.generate(prompts, params))
    assert llm.kv_stats().used == 0


def test_sliding_window_caps_the_context(checkpoints):
    llm = LLM(checkpoints["mistral"], num_kv_blocks=64)
    assert llm.engine.front.limits.max_model_len == 128
    with pytest.raises(ValueError, match="128"):
        LLM(checkpoints["mistral"], num_kv_blocks=64, max_model_len=256)


def test_qwen_window_switched_off_is_no_cap():
    """Qwen2.5's config.json names a window but leaves ``use_sliding_window`` off."""
    raw = {
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": 8,
        **SHAPE,
        "max_position_embeddings": 32768,
        "sliding_window": 4096,
        "use_sliding_window": False,
    }
    config = ModelConfig.from_dict(raw)
    assert config.sliding_window is None and config.max_position_embeddings == 32768
    assert ModelConfig.from_dict(raw | {"use_sliding_window": True}).max_position_embeddings == 4096


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_triton_backend_takes_qk_norm_and_odd_head_dim(checkpoints, prompts, references):
    pytest.importorskip("triton")
    _, expected = references["qwen3"]
    llm = LLM(checkpoints["qwen3"], attention_backend="triton", num_kv_blocks=64)
    outs = llm.generate(prompts[:3], [SamplingParams(max_tokens=4, temperature=0)] * 3)
    assert [o.token_ids for o in outs] == [e[:4] for e in expected[:3]]


@pytest.fixture(scope="module")
def sharded_bf16(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("sharded") / "qwen3-bf16"
    return write_family(out, "qwen3", tiny_model_dir, torch.bfloat16, max_shard_size="200KB")


def test_sharded_bfloat16_loads_in_its_dtype_and_converted(sharded_bf16, prompts):
    index = json.loads((sharded_bf16 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(sharded_bf16).state_dict()
    assert theirs["model.embed_tokens.weight"].dtype == torch.bfloat16
    for dtype in (torch.bfloat16, torch.float32):
        model = LLM(sharded_bf16, dtype=str(dtype)[6:], num_kv_blocks=8).engine.runner.model
        attn = model.layers[1].self_attn
        q_rows = attn.q_norm.weight.shape[0] * model.config.num_attention_heads
        pairs = [
            (model.embed_tokens, theirs["model.embed_tokens.weight"]),
            (model.lm_head, theirs["lm_head.weight"]),
            (attn.qkv_proj[q_rows:], theirs["model.layers.1.self_attn.k_proj.weight"]),
            (attn.k_norm.weight, theirs["model.layers.1.self_attn.k_norm.weight"]),
        ]
        for ours, want in pairs:
            assert ours.dtype == dtype
            assert torch.equal(ours[: want.shape[0]], want.to(dtype))


def test_sharded_bfloat16_greedy_in_float32(sharded_bf16, prompts):
    reference = FamilyReference(sharded_bf16)
    expected = [reference.generate(p, 8) for p in prompts[:3]]
    outs = LLM(sharded_bf16, num_kv_blocks=64).generate(
        prompts[:3], SamplingParams(max_tokens=8, temperature=0)
    )
    assert_same_as_reference(reference, prompts[:3], expected, outs)


def broken_copy(source: Path, dest: Path, remove: str | None = None, **config: Any) -> Path:
    shutil.copytree(source, dest)
    if remove:
        (dest / remove).unlink()
    if config:
        raw = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps(raw | config))
    return dest


def shard_names(path: Path) -> list[str]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"remove": "config.json"}, "config.json"),
        ({"remove": "tokenizer.json"}, "tokenizer.json"),
        ({"remove": "shard"}, "shard"),
        ({"architectures": ["GPTNeoXForCausalLM"]}, "GPTNeoXForCausalLM"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_a_broken_checkpoint_is_named(sharded_bf16, tmp_path, change, named):
    shard = shard_names(sharded_bf16)[1]
    if change.get("remove") == "shard":
        change, named = {"remove": shard}, shard
    path = broken_copy(sharded_bf16, tmp_path / "broken", **change)
    with pytest.raises(CheckpointError, match=named):
        LLM(path, num_kv_blocks=8)


def test_a_shard_of_another_model_is_named(sharded_bf16, checkpoints, tmp_path):
    path = broken_copy(sharded_bf16, tmp_path / "broken")
    first = shard_names(path)[0]
    shutil.copy(checkpoints["qwen2-untied"] / "model.safetensors", path / first)
    with pytest.raises(CheckpointError, match=first):
        LLM(path, num_kv_blocks=8)


def test_the_server_names_a_missing_shard(sharded_bf16, tmp_path):
    shard = shard_names(sharded_bf16)[-1]
    path = broken_copy(sharded_bf16, tmp_path / "broken", remove=shard)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
    env |= {"SERVEDECK_HOME": str(tmp_path), "SERVEDECK_ADMIN_TOKEN": "t" * 24}
    argv = [sys.executable, "-m", "control.cli", "serve", "--model", str(path), "--port", "0"]
    argv += ["--db", str(tmp_path / "servedeck.db"), "--num-threads", "1"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"model.safetensors.index.json names {shard}, missing" in done.stdout + done.stderr
