"""A server finds the stored calibration of the engine it serves (no ``--cost-model``), and its
dry run says which calibration it predicted with: the path and when it was made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.config import EngineConfig
from kernels import native
from sim.calibrations import served_identity, store
from tests.control.support import TOKEN, ServerProcess
from tests.control.test_prediction import complete, dry_run
from tests.sim.test_calibrations import calibration

CREATED = "2026-12-07T12:34:56+00:00"


@pytest.fixture(scope="module")
def stored_home(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory holding a calibration of the tiny model as the server runs it (the
    dtype ``auto`` gives here, this CPU, the attention path the server will take) and one of
    another dtype, which it must pass over."""
    home = tmp_path_factory.mktemp("calibrated")
    dtype = EngineConfig(model=str(tiny_model_dir)).weights_dtype
    attention = "native" if native.load() is not None else "torch"
    served = served_identity(tiny_model_dir, dtype, "cpu", attention)
    store(calibration(served, CREATED, constant=0.002), home / "calibrations")
    other = "bfloat16" if dtype == "float32" else "float32"
    foreign = served_identity(tiny_model_dir, other, "cpu", attention)
    store(calibration(foreign, "2026-12-08T00:00:00+00:00"), home / "calibrations")
    return home


@pytest.fixture(scope="module")
def calibrated(tiny_model_dir: Path, stored_home: Path) -> Iterator[httpx.Client]:
    args = ["--admin-token", TOKEN, "--prediction-timeout-s", "60"]
    server = ServerProcess(tiny_model_dir, stored_home, args, {})
    server.start()
    try:
        with server.client() as http:
            yield http
    finally:
        server.stop()


def test_the_dry_run_names_the_stored_calibration_it_used(
    calibrated: httpx.Client, stored_home: Path
) -> None:
    for prompt in ("Hello there", "One two three"):
        complete(calibrated, prompt, 4)
    prediction = dry_run(calibrated, policy={"name": "dynamic"})["prediction"]
    assert prediction["available"] is True, prediction["reason"]
    used = prediction["calibration"]
    assert used["source"] == "stored" and used["created"] == CREATED
    path = Path(used["path"])
    assert path.parent == (stored_home / "calibrations").resolve()
    assert f"-{EngineConfig(model='x').weights_dtype}-" in path.name  # not the other dtype's
    assert prediction["cost_model"] == f"calibrated:{path.name}"
    assert f"calibration {path}, made {CREATED}; stored" in prediction["statement"]
    assert prediction["calibrate_command"] is None
    assert prediction["correction"] is not None  # by the engine's steps of the two requests
    assert prediction["current"]["requests"] == 2
