"""What a calibration is of (``sim.calibrations``, ``sim.fingerprint``): the model's hash, the
refusal of a calibration of another engine by the field that differs, the store and the order
in which a server finds its cost model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sim.calibrated import FORMAT, CalibratedModel
from sim.calibrations import (
    CalibrationMismatch,
    Identity,
    check,
    choose,
    find,
    served_identity,
    store,
    store_dir,
)
from sim.fingerprint import model_hash
from sim.models import load_cost_model

SERVED = Identity("sha256:00112233aabbccdd", "float32", "Some CPU (AVX2; avx2 fma)", "native")


def calibration(ident: Identity = SERVED, created: str = "2026-12-07T10:00:00+00:00",
                constant: float = 0.01) -> dict[str, Any]:  # fmt: skip
    """A calibration file's data with ``ident``, as ``servedeck calibrate`` writes it."""
    return {
        "format": FORMAT,
        "created": created,
        "servedeck": "0.1.0",
        "model": {"path": "/models/tiny", "hash": ident.model, "hash_of": "test"},
        "machine": {
            "device": "cpu",
            "dtype": ident.dtype,
            "attention": ident.attention,
            "cpu": ident.cpu,
            "threads": 2,
            "torch": "2.x",
        },
        "block_size": 16,
        "kv_cache": {"bytes": 1 << 20, "bytes_per_token": 1024},
        "fit": {"coefficients": {"constant": constant, "decode_rows": 1e-4}},
        "engine_overhead": {"per_step_s": 1e-4, "per_seq_s": 1e-5},
    }


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_the_model_hash_is_of_the_bytes_not_the_path(tiny_model_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(tiny_model_dir, tmp_path / "copied elsewhere"))
    assert model_hash(copy) == model_hash(tiny_model_dir)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    half = len(data) // 2  # the weights past the header: other values, same names and shapes
    data[half // 2 : half + half // 2] = bytes(half)
    weights.write_bytes(bytes(data))
    assert model_hash(copy) != model_hash(tiny_model_dir)
    digest = model_hash(tiny_model_dir)
    assert digest.startswith("sha256:") and len(digest) == 7 + 16
    assert model_hash(tiny_model_dir / "model.safetensors") != digest  # no config.json


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("model", "sha256:ffffffffffffffff", "model 'sha256:ffff"),
        ("dtype", "bfloat16", "dtype 'bfloat16'"),
        ("cpu", "Other CPU (AVX512; avx2 fma avx512f avx512_bf16)", "CPU kind 'Other CPU"),
        ("attention", "torch", "attention path 'torch'"),
    ],
)
def test_a_calibration_of_another_engine_is_refused_naming_the_field(
    field: str, value: str, named: str
) -> None:
    foreign = Identity(**{**{f: getattr(SERVED, f) for f in Identity.__slots__}, field: value})
    with pytest.raises(CalibrationMismatch, match="another engine") as refused:
        check(calibration(foreign), SERVED, "cal.json")
    assert named in str(refused.value)
    assert f"(the server's: {getattr(SERVED, field)!r})" in str(refused.value)
    for other in ("model ", "dtype ", "CPU kind ", "attention path "):
        if not named.startswith(other):
            assert other not in str(refused.value)  # only the field that differs
    check(calibration(SERVED), SERVED, "cal.json")  # the same engine passes


def test_an_older_format_is_refused_by_name(tmp_path: Path) -> None:
    old = write(tmp_path / "old.json", {**calibration(), "format": "servedeck-calibration/1"})
    for load in (CalibratedModel.load, load_cost_model):
        with pytest.raises(ValueError, match="format servedeck-calibration/1") as refused:
            load(old)
        assert FORMAT in str(refused.value) and "servedeck calibrate" in str(refused.value)
    with pytest.raises(ValueError, match="servedeck-calibration/1"):
        check(json.loads(old.read_text()), SERVED, "old.json")


def test_unknown_attention_is_not_compared() -> None:
    """A fleet's control process does not know its replicas' attention path."""
    check(calibration(SERVED), Identity(SERVED.model, SERVED.dtype, SERVED.cpu, None), "c")


def test_store_finds_the_newest_calibration_of_the_served_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path))
    assert store_dir() == tmp_path / "calibrations"
    assert find(SERVED) is None  # no store yet
    older = store(calibration(created="2026-12-06T09:00:00+00:00"))
    assert older.parent == store_dir()
    foreign = store(calibration(Identity("sha256:99", "float32", SERVED.cpu, "native")))
    write(store_dir() / "old-format.json", {**calibration(), "format": "servedeck-calibration/1"})
    (store_dir() / "broken.json").write_text("{")
    assert find(SERVED) == older
    newer = write(store_dir() / "copied-in.json", calibration(created="2026-12-07T09:00:00+00:00"))
    assert find(SERVED) == newer
    again = store(calibration(created="2026-12-08T09:00:00+00:00"))
    assert again == older  # one stored file per engine: a new calibration replaces it
    assert find(SERVED) == older and foreign.exists()


def test_lookup_order_explicit_then_stored_then_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path / "home"))
    none = choose(None, SERVED)
    assert none.spec is None and none.calibration is None
    stored = store(calibration(created="2026-12-07T08:00:00+00:00"))
    found = choose(None, SERVED)
    assert found.spec == str(stored) and found.calibration is not None
    assert found.calibration.source == "stored"
    assert found.calibration.created == "2026-12-07T08:00:00+00:00"
    explicit = write(tmp_path / "mine.json", calibration(created="2026-12-01T00:00:00+00:00"))
    chosen = choose(str(explicit), SERVED)  # wins over the newer stored one
    assert chosen.spec == str(explicit) and chosen.calibration is not None
    assert (chosen.calibration.source, chosen.calibration.path) == ("explicit", str(explicit))
    profile = choose("a100-80g/llama3-8b", SERVED)
    assert profile.spec == "a100-80g/llama3-8b" and profile.calibration is None
    foreign = write(tmp_path / "foreign.json", calibration(Identity("sha256:1", "float32", "x")))
    with pytest.raises(CalibrationMismatch, match="model 'sha256:1'"):
        choose(str(foreign), SERVED)  # an explicit file of another engine fails the start


def test_served_identity_of_a_model_folder(tiny_model_dir: Path) -> None:
    from engine.cpu import cpu_features

    ident = served_identity(tiny_model_dir, "float32", "cpu", "torch")
    expected = Identity(model_hash(tiny_model_dir), "float32", cpu_features().summary, "torch")
    assert ident == expected
    assert served_identity(tiny_model_dir, "bfloat16", "cuda").cpu == "cuda"


def test_the_calibrate_command_asks_for_the_served_engine() -> None:
    from control.guardrail.prediction import calibrate_command
    from engine.config import EngineConfig
    from engine.cpu import choose_dtype

    auto = choose_dtype("auto").dtype
    assert calibrate_command(EngineConfig(model="m", dtype=auto), None) == "servedeck calibrate"
    other = "bfloat16" if auto == "float32" else "float32"
    config = EngineConfig(model="m", dtype=other, native_attention=False, num_threads=3)
    assert calibrate_command(config, Path("/models/my model")) == (
        f"servedeck calibrate --model '/models/my model' --dtype {other} "
        "--no-native-attention --threads 3"
    )
