"""A model's content hash, cheap enough to take at every server start.

A calibration is of one model's weights; the path and the file's times say nothing about
them (a copied file keeps its weights, a re-downloaded one changes its times), so the hash is
of bytes: for each weight file (``*.safetensors``, ``*.gguf``, ``*.bin``; a GGUF file on its
own) its size, its first MiB (the header: every tensor's name, dtype and shape, and a GGUF
file's metadata) and ``SAMPLES`` evenly spaced 64 KiB samples of the rest (the weights
themselves: two seeds of one preset differ there), plus ``config.json`` whole. About 3 MiB
read per file whatever its size: milliseconds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HEAD_BYTES = 1 << 20
SAMPLE_BYTES = 64 << 10
SAMPLES = 32
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin")
HASH_OF = (
    "sha256 of config.json and, per weight file, its size, first MiB and "
    f"{SAMPLES} evenly spaced {SAMPLE_BYTES >> 10} KiB samples"
)
"""What ``model_hash`` covers, in words (recorded beside the hash)."""


def _file_digest(digest: hashlib._Hash, path: Path) -> None:
    size = path.stat().st_size
    digest.update(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        digest.update(f.read(HEAD_BYTES))
        rest = size - HEAD_BYTES
        if rest <= 0:
            return
        step = max(rest // SAMPLES, 1)
        for i in range(SAMPLES):
            offset = HEAD_BYTES + i * step
            if offset >= size:
                break
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
        f.seek(max(size - SAMPLE_BYTES, HEAD_BYTES))
        digest.update(f.read(SAMPLE_BYTES))


def model_hash(path: str | Path) -> str:
    """``sha256:`` and the first 16 hex digits of the hash of the model folder or GGUF file
    ``path`` (what ``HASH_OF`` says). FileNotFoundError where there is no model."""
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        _file_digest(digest, path)
    else:
        config = path / "config.json"
        digest.update(config.read_bytes())
        weights = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        for weight in weights:
            digest.update(weight.name.encode() + b"\0")
            _file_digest(digest, weight)
    return f"sha256:{digest.hexdigest()[:16]}"
