"""GGUF files the tests write (``gguf_support``: a Q8_0 Llama with llama.cpp's q/k permutation,
an F16 Qwen2), read back by servedeck and by transformers (``from_pretrained(dir,
gguf_file=...)``, float32): same config, same greedy tokens, same log-probabilities, same
tokenizer; and files servedeck must refuse (truncated, unsupported architecture or tensor
type) refused with a ``CheckpointError`` naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter

from engine.errors import CheckpointError
from engine.gguf_tokenizer import gguf_tokenizer
from engine.model.formats import read_model_config
from engine.model.gguf_file import GGUFCheckpoint
from engine.sampling_params import SamplingParams
from serving.llm import LLM
from tests.engine.gguf_support import write_llama_q8, write_qwen2_f16
from tests.engine.gguf_texts import varied_texts

WRITERS = {"llama-q8_0": write_llama_q8, "qwen2-f16": write_qwen2_f16}
PROMPTS = ["The quick brown fox", "Once upon a time, in a land", "1 2 3 4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {name: write(folder / f"{name}.gguf") for name, write in WRITERS.items()}


@pytest.fixture(scope="module")
def hf(files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = {}
    for name, path in files.items():
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded[name] = (model, tokenizer)
    return loaded


@pytest.mark.parametrize("name", list(WRITERS))
def test_config_from_metadata_equals_transformers(files, hf, name):
    ours = read_model_config(files[name])
    theirs = hf[name][0].config
    assert ours.architecture == type(hf[name][0]).__name__
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)
    assert ours.attention_bias == (name == "qwen2-f16")


@pytest.mark.parametrize("name", list(WRITERS))
def test_greedy_tokens_and_logprobs_equal_transformers(files, hf, name):
    model, tokenizer = hf[name]
    llm = LLM(files[name], num_threads=1)
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=1, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params)
    distinct = set()
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids = tokenizer(prompt)["input_ids"]
        assert llm.engine.front.tokenize(prompt) == ids
        with torch.no_grad():
            want = model.generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, min_new_tokens=12
            )[0, len(ids) :].tolist()
            logits = model(torch.tensor([ids + want])).logits[0, len(ids) - 1 : -1]
        assert out.token_ids == want, prompt
        theirs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(want)[:, None])[:, 0]
        ours = torch.tensor([lp.logprob for lp in out.logprobs])
        torch.testing.assert_close(ours, theirs, atol=2e-3, rtol=0)
        distinct |= set(want)
    assert len(distinct) > 8, "random weights that repeat one token would hide bugs"


@pytest.mark.parametrize("name", list(WRITERS))
def test_tokenizer_equals_transformers(files, hf, name):
    ours = gguf_tokenizer(files[name]).tokenizer
    theirs = hf[name][1]
    texts = varied_texts()
    assert len(texts) >= 300
    got = [e.ids for e in ours.encode_batch(texts)]
    want = [theirs(t)["input_ids"] for t in texts]
    mismatches = [(t, g, w) for t, g, w in zip(texts, got, want, strict=True) if g != w]
    assert not mismatches, mismatches[:3]
    for ids in want[:50]:
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids)


def test_chat_template_and_special_tokens_come_from_the_file(files):
    tok = gguf_tokenizer(files["llama-q8_0"])
    assert tok.chat_template is not None and "<|assistant|>" in tok.chat_template
    assert tok.special_tokens["bos_token"] == "<s>"
    assert tok.tokenizer.encode("hi").ids[0] == 1, "llama files add BOS"
    assert gguf_tokenizer(files["qwen2-f16"]).tokenizer.encode("hi").ids[0] != 0


def test_truncated_file_is_refused(files, tmp_path):
    data = files["llama-q8_0"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated"):
        GGUFCheckpoint(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:100])
    with pytest.raises(CheckpointError, match=r"header\.gguf"):
        GGUFCheckpoint(header_only)


def _write_one(path: Path, arch: str, dtype: GGMLQuantizationType) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    t = np.zeros((32, 32), dtype=np.float32)
    if dtype == GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", t)
    else:  # I8 holds its raw bytes as they are
        w.add_tensor("token_embd.weight", t.astype(np.int8), raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_is_refused(tmp_path):
    path = _write_one(tmp_path / "gpt2.gguf", "gpt2", GGMLQuantizationType.F32)
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported"):
        GGUFCheckpoint(path)


def test_unsupported_tensor_type_is_refused(tmp_path):
    path = _write_one(tmp_path / "i8.gguf", "llama", GGMLQuantizationType.I8)
    with pytest.raises(CheckpointError, match=r"token_embd\.weight has type I8"):
        GGUFCheckpoint(path)


def test_missing_split_part_is_named(files, tmp_path):
    first = tmp_path / "model-00001-of-00002.gguf"
    first.write_bytes(files["qwen2-f16"].read_bytes())
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.gguf"):
        GGUFCheckpoint(first)
