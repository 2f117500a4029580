"""Tiny random GGUF checkpoints written with ggml-org's ``gguf`` writer, as llama.cpp's
converter writes them: HF-named weights renamed, the Llama family's q/k rows permuted
(``convert_hf_to_gguf.py``'s ``LlamaModel.permute``), quantized; the tokenizer as metadata.

- ``write_llama_q8``: a Llama in Q8_0 (norms F32) with a SentencePiece-style ``llama``
  tokenizer (tokens, scores and types, no merges: readers rebuild them from the scores) and
  BOS added;
- ``write_qwen2_f16``: a Qwen2 (q/k/v biases) in F16 with a byte-level ``gpt2`` tokenizer,
  pre-tokenizer ``qwen2``, merges in the file, no BOS;
- ``write_llama_weights``: a Llama in Q8_0 with no tokenizer, sized to measure a load.

The weights use the sharp scales of ``engine.checkpoint.random_weights`` so greedy choices sit
far above float rounding.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.corpus import corpus_lines

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ROLE_TOKENS = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    context: int = 256


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's [first half, second half] rows become pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def random_tensors(shape: Shape, vocab: int, bias: bool, seed: int) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    d, inter, hd = shape.hidden, shape.intermediate, shape.hidden // shape.heads
    q, kv = shape.heads * hd, shape.kv_heads * hd

    def normal(*size: int, std: float) -> np.ndarray:
        return torch.empty(*size).normal_(0.0, std, generator=g).numpy()

    out = {"token_embd.weight": normal(vocab, d, std=1.0)}
    for i in range(shape.layers):
        p = f"blk.{i}"
        out[f"{p}.attn_norm.weight"] = 1.0 + normal(d, std=0.1)
        out[f"{p}.ffn_norm.weight"] = 1.0 + normal(d, std=0.1)
        out[f"{p}.attn_q.weight"] = normal(q, d, std=2.0 / math.sqrt(d))
        out[f"{p}.attn_k.weight"] = normal(kv, d, std=2.0 / math.sqrt(d))
        out[f"{p}.attn_v.weight"] = normal(kv, d, std=1.0 / math.sqrt(d))
        if bias:
            out[f"{p}.attn_q.bias"] = normal(q, std=0.5)
            out[f"{p}.attn_k.bias"] = normal(kv, std=0.5)
            out[f"{p}.attn_v.bias"] = normal(kv, std=0.5)
        out[f"{p}.attn_output.weight"] = normal(d, q, std=4.0 / math.sqrt(q))
        out[f"{p}.ffn_gate.weight"] = normal(inter, d, std=1.0 / math.sqrt(d))
        out[f"{p}.ffn_up.weight"] = normal(inter, d, std=1.0 / math.sqrt(d))
        out[f"{p}.ffn_down.weight"] = normal(d, inter, std=4.0 / math.sqrt(inter))
    out["output_norm.weight"] = 1.0 + normal(d, std=0.1)
    return out


def _header(w: GGUFWriter, arch: str, shape: Shape, vocab: int) -> None:
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    w.add_vocab_size(vocab)
    w.add_chat_template(CHAT_TEMPLATE)


def _spm_vocab(size: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, role tokens,
    then ▁-spelled BPE pieces trained on the shipped corpus; scores follow merge order."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False, special_tokens=[])
    tok.train_from_iterator(corpus_lines(), trainer)
    learned = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *ROLE_TOKENS]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    types += [TokenType.BYTE] * 256 + [TokenType.CONTROL] * 3 + [TokenType.USER_DEFINED]
    scores = [0.0] * len(tokens)
    for rank, (piece, _) in enumerate(learned):
        tokens.append(piece)
        types.append(TokenType.NORMAL)
        scores.append(-float(rank))
    return tokens, scores, [int(t) for t in types]


def write_llama_q8(path: Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    tokens, scores, types = _spm_vocab(800)
    vocab = len(tokens) + (-len(tokens)) % 32  # Q8_0 rows are multiples of 32 wide
    while len(tokens) < vocab:
        tokens.append(f"<pad{len(tokens)}>")
        scores.append(-1e9)
        types.append(int(TokenType.UNUSED))
    w = GGUFWriter(str(path), "llama")
    _header(w, "llama", shape, vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    tensors = random_tensors(shape, vocab, bias=False, seed=seed)
    tensors["output.weight"] = random_tensors(shape, vocab, False, seed + 1)["token_embd.weight"]
    for name, t in tensors.items():
        if ".attn_q." in name:
            t = permute(t, shape.heads)
        elif ".attn_k." in name:
            t = permute(t, shape.kv_heads)
        if t.ndim == 2:
            q8 = GGMLQuantizationType.Q8_0
            w.add_tensor(name, quantize(t, q8), raw_shape=None, raw_dtype=q8)
        else:
            w.add_tensor(name, t.astype(np.float32))
    return _close(w, path)


def write_qwen2_f16(path: Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *ROLE_TOKENS]
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [int(TokenType.CONTROL if t in special else TokenType.NORMAL) for t in tokens]
    w = GGUFWriter(str(path), "qwen2")
    _header(w, "qwen2", shape, len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    for name, t in random_tensors(shape, len(tokens), bias=True, seed=seed).items():
        w.add_tensor(name, t.astype(np.float16 if t.ndim == 2 else np.float32))
    return _close(w, path)


def write_llama_weights(path: Path, shape: Shape, vocab: int, seed: int = 0) -> Path:
    """Weights and the config's metadata only (``load_model`` reads them; no tokenizer), the
    matrices in Q8_0 as llama.cpp's converter stores them (q/k permuted), norms F32."""
    w = GGUFWriter(str(path), "llama")
    _header(w, "llama", shape, vocab)
    q8 = GGMLQuantizationType.Q8_0
    for name, t in random_tensors(shape, vocab, bias=False, seed=seed).items():
        if ".attn_q." in name:
            t = permute(t, shape.heads)
        elif ".attn_k." in name:
            t = permute(t, shape.kv_heads)
        if t.ndim == 2:
            w.add_tensor(name, quantize(t, q8), raw_shape=None, raw_dtype=q8)
        else:
            w.add_tensor(name, t.astype(np.float32))
    return _close(w, path)


def _close(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
