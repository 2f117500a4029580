"""Cost models by name: ``gpu/model`` picks the roofline profiles (``a100-80g/llama3-8b``);
a path to a JSON file is a calibration from ``servedeck calibrate``."""

from __future__ import annotations

from pathlib import Path

from sim.cost_model import CostModel
from sim.roofline import PROFILES, GpuProfile, ModelShape, RooflineModel


def profile_names() -> list[str]:
    gpus = sorted(p.stem for p in (PROFILES / "gpus").glob("*.json"))
    models = sorted(p.stem for p in (PROFILES / "models").glob("*.json"))
    return [f"{g}/{m}" for g in gpus for m in models]


def load_cost_model(spec: str | Path) -> CostModel:
    path = Path(spec)
    if path.suffix == ".json" and path.exists():
        from sim.calibrated import CalibratedModel

        return CalibratedModel.load(path)
    gpu, sep, model = str(spec).partition("/")
    if not sep or path.suffix == ".json":
        names = ", ".join(profile_names())
        raise ValueError(f"cost model {str(spec)!r}: a calibration JSON file or one of {names}")
    return RooflineModel(GpuProfile.load(gpu), ModelShape.load(model))
