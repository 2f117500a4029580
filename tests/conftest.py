"""Suite-wide set-up. TRITON_INTERPRET must be set before anything imports triton."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest
import torch
from hypothesis import settings

# One thread: the suite shares two cores with server subprocesses, and two-thread matrix
# products stall badly when the other core is busy.
torch.set_num_threads(1)
settings.register_profile("servedeck", deadline=None, print_blob=True)
settings.load_profile("servedeck")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``tiny`` random-weight checkpoint, written once per test session."""
    from engine.checkpoint import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", "tiny", seed=0)
