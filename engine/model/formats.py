"""Which checkpoint format a path names and which files it must hold, without importing any
reader (no torch, no gguf): the chat template's render workers ask this of every path, and
must start in a fraction of a second; the engine's front (engine/front.py) checks a folder
with it without loading the weights. The format also chooses the reader of the model's config
(``read_model_config``): a folder's ``config.json`` (``ModelConfig.from_dir``), or a GGUF
file's metadata (engine/model/gguf_file.py, imported only for such a path), so the config, a
plain value type, never imports a file reader."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.errors import CheckpointError
from engine.model.config import ModelConfig

GGUF_SUFFIX = ".gguf"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def is_gguf(path: str | Path) -> bool:
    """A llama.cpp GGUF file (one file, or any part of a split one)."""
    return str(path).endswith(GGUF_SUFFIX)


def read_model_config(path: str | Path) -> ModelConfig:
    """A folder's ``config.json``, or a GGUF checkpoint's metadata (a ``.gguf`` path)."""
    if is_gguf(path):
        from engine.model.gguf_file import open_checkpoint  # it imports torch

        return open_checkpoint(Path(path)).model_config()
    return ModelConfig.from_dir(path)


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    config: Path
    tokenizer: Path
    weights: list[Path]


def checkpoint_files(path: str | Path) -> CheckpointFiles:
    """The folder's files, every one checked to exist (``CheckpointError`` names the first
    missing one). A GGUF checkpoint is its own config and tokenizer; its weights are its
    parts."""
    path = Path(path)
    if is_gguf(path):
        from engine.model.gguf_file import split_files  # it imports torch

        parts = split_files(path)
        return CheckpointFiles(path, path, parts)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist", path)
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"no config.json in {path}", config)
    tokenizer = path / TOKENIZER_FILE
    if not tokenizer.is_file():
        hint = (
            " (tokenizer.model alone is not read: write tokenizer.json with transformers' "
            "AutoTokenizer.from_pretrained(dir).save_pretrained(dir))"
            if (path / "tokenizer.model").is_file()
            else ""
        )
        raise CheckpointError(f"no {TOKENIZER_FILE} in {path}{hint}", tokenizer)
    if (path / INDEX_FILE).is_file():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        weights = [path / name for name in sorted(set(weight_map.values()))]
        for shard in weights:
            if not shard.is_file():
                raise CheckpointError(f"{INDEX_FILE} names {shard.name}, missing in {path}", shard)
    elif (path / SINGLE_FILE).is_file():
        weights = [path / SINGLE_FILE]
    else:
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}", path)
    return CheckpointFiles(config, tokenizer, weights)
