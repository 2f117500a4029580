"""What a checkpoint is besides its weights: its model config, its tokenizer and its stop
tokens, read alike by the engine's front (admission, which never loads a weight) and by the
builder (which loads the weights beside them); and ``RandomWeights``, the seeded preset either
of them builds instead of a folder. The one module both use, so neither imports the other and
the tensor-parallel ranks name the preset without reaching the builder.

An HF folder's parts import no torch; a GGUF file's do (its reader lives beside the tensors'
dequantization), as do a random preset's (its tokenizer is trained beside the weights'
generator).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from engine.config import EngineConfig
from engine.errors import CheckpointError
from engine.model.config import ModelConfig
from engine.model.formats import checkpoint_files, is_gguf, read_model_config


@dataclass(frozen=True, slots=True)
class RandomWeights:
    """A checkpoint preset (``engine.checkpoint.PRESETS``) built with seeded random weights.

    The weights are made tensor by tensor on the engine's device, so no file is read or
    written and an 8B-shaped model never exists twice. They are deterministic for a seed on one
    device type; on the CPU they equal the checkpoint ``servedeck init-model DIR --preset P
    --seed S`` writes (same draws, same dtype), and the tokenizer is the same one, built in
    memory."""

    preset: str
    seed: int = 0

    def __post_init__(self) -> None:
        from engine.checkpoint import PRESETS  # it imports torch

        if self.preset not in PRESETS:
            choices = ", ".join(PRESETS)
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {choices}")


def load_tokenizer(path: Path) -> Tokenizer | None:
    """``tokenizer.json`` of a folder, or the tokenizer a GGUF file describes."""
    if is_gguf(path):
        from engine.gguf_tokenizer import gguf_tokenizer  # its reader imports torch

        return gguf_tokenizer(path).tokenizer
    file = path / "tokenizer.json"
    return Tokenizer.from_file(str(file)) if file.is_file() else None


def eos_token_ids(path: Path, model_config: ModelConfig) -> tuple[int, ...]:
    """``generation_config.json`` wins over ``config.json``, as in transformers (a GGUF file:
    its EOS and EOT ids, in the model config)."""
    file = path / "generation_config.json"
    if file.is_file():
        eos = json.loads(file.read_text()).get("eos_token_id")
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (eos,)
    return model_config.eos_token_ids


def checkpoint_tokenizer(config: EngineConfig) -> Tokenizer | None:
    """The tokenizer ``config`` serves: ``config.tokenizer``'s (which must have one) or the
    model's own (a folder may have none: the engine then takes token ids only)."""
    path = Path(config.tokenizer) if config.tokenizer else Path(config.model)
    if config.tokenizer and not is_gguf(path) and not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"no tokenizer.json in {path}", path)
    return load_tokenizer(path)


def checkpoint_parts(
    config: EngineConfig,
) -> tuple[ModelConfig, Tokenizer | None, tuple[int, ...]]:
    """The folder (or GGUF file) ``config.model``'s model config, tokenizer and stop tokens,
    every file the build needs checked to exist, no weight read."""
    path = Path(config.model)
    checkpoint_files(path)  # the engine's build refuses a folder missing a file: so does this
    model = read_model_config(path)
    return model, checkpoint_tokenizer(config), eos_token_ids(path, model)


def preset_parts(name: str) -> tuple[ModelConfig, Tokenizer, tuple[int, ...]]:
    """A checkpoint preset's model config, tokenizer (built in memory) and stop tokens."""
    from engine.checkpoint import PRESETS, build_tokenizer, hf_config, special_ids

    preset = PRESETS[name]
    tokenizer = build_tokenizer(preset.tokenizer_vocab)
    bos, eos = special_ids(tokenizer)
    model = ModelConfig.from_dict(hf_config(preset, bos, eos))
    return model, tokenizer, model.eos_token_ids
