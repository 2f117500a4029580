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


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (``make test``): a module's tests run on one
    worker, so a module-scoped server starts once; every fleet test runs on one worker, so the
    session's Ray instance and 2-replica server start once (two Ray instances side by side
    would double the fleet's cost on two cores)."""
    for item in items:
        path = Path(str(item.path))
        group = "fleet" if path.parent.name == "fleet" else str(path.relative_to(path.parents[1]))
        item.add_marker(pytest.mark.xdist_group(group))
