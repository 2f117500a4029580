"""The decoder's parts against transformers' own, and the dtypes it runs in."""

from __future__ import annotations

import pytest
import torch

from engine.model.config import ModelConfig
from engine.model.rope import inverse_frequencies
from engine.sampling_params import SamplingParams
from serving.llm import LLM

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize("scaling", [None, LLAMA3_SCALING])
def test_rope_frequencies_match_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=4096,
        num_attention_heads=32,
        rope_theta=500000.0,
        rope_scaling=scaling,
        max_position_embeddings=131072,
    )
    ours = inverse_frequencies(128, 500000.0, scaling)
    if scaling is None:
        theirs = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
    else:
        theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    torch.testing.assert_close(ours, theirs.float())


def test_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        ModelConfig.from_dict(
            {
                "architectures": ["GPTNeoXForCausalLM"],
                "vocab_size": 8,
                "hidden_size": 8,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
            }
        )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees_with_float32(tiny_model_dir, dtype):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = [[5, 9, 200, 31], [7] * 40]
    full = LLM(tiny_model_dir, num_kv_blocks=64).generate(prompts, params)
    half = LLM(tiny_model_dir, dtype=dtype, num_kv_blocks=64)
    assert half.engine.runner.kv_caches[0].dtype == getattr(torch, dtype)
    outs = half.generate(prompts, params)
    assert all(len(o.token_ids) == 6 for o in outs)
    assert outs[0].token_ids[0] == full[0].token_ids[0]
