"""The two CLI commands of the engine floor, as a user runs them."""

from __future__ import annotations

import subprocess
import sys


def test_init_model_then_generate(tmp_path):
    model = tmp_path / "tiny"
    made = subprocess.run(
        [sys.executable, "-m", "control.cli", "init-model", str(model), "--preset", "tiny"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tiny checkpoint" in made.stdout and (model / "config.json").is_file()
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "control.cli",
            "generate",
            "--model",
            str(model),
            "--prompt",
            "The scheduler",
            "--max-tokens",
            "5",
            "--num-kv-blocks",
            "64",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "[5 tokens, finish=length" in ran.stderr
    assert ran.stdout.strip()
