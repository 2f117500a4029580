"""What a calibration is of, whether it fits the served engine, and where calibrations live.

A calibration (``servedeck calibrate``'s file) times one model in one dtype with one decode
attention on one kind of CPU; on anything else it predicts the wrong engine. Its ``Identity``
is those four: the model's content hash (``sim.fingerprint``), the dtype in force, the CPU
kind (``engine.cpu.CpuFeatures.summary``: model name, torch's dispatch level, the flags that
matter; the device's name off the CPU) and the attention path (``native``, ``torch``,
``triton``: the engine's compute report). A file whose identity differs from the served
engine's is refused, naming the field (``CalibrationMismatch``).

Where the server finds one (``choose``): ``--cost-model FILE`` (or a roofline profile) wins;
otherwise the newest stored calibration (``store_dir()``, under the state directory,
``$SERVEDECK_HOME``) whose identity matches; otherwise none, and the dry run says
"uncalibrated" with the command that makes one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.checkpoint import cache_dir
from sim.calibrated import check_format
from sim.fingerprint import model_hash

log = logging.getLogger(__name__)

FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "model"),
    ("dtype", "dtype"),
    ("cpu", "CPU kind"),
    ("attention", "attention path"),
)
"""``Identity``'s fields in the order they are compared, with their names for a person."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What a calibration was made on, or what the server runs."""

    model: str
    """The model's content hash (``sim.fingerprint.model_hash``)."""
    dtype: str
    cpu: str
    """The CPU kind (``CpuFeatures.summary``), or the device's name off the CPU."""
    attention: str | None = None
    """The decode attention in force; None where it is not known (not compared)."""

    @classmethod
    def of(cls, data: dict[str, Any]) -> Identity:
        """A calibration file's (``data``: its JSON, format already checked)."""
        machine = data["machine"]
        return cls(data["model"]["hash"], machine["dtype"], machine["cpu"], machine["attention"])

    def differences(self, served: Identity) -> list[str]:
        """Each field where this calibration differs from ``served``, in words."""
        out = []
        for field, name in FIELDS:
            ours, theirs = getattr(self, field), getattr(served, field)
            if ours is None or theirs is None or ours == theirs:
                continue
            out.append(f"{name} {ours!r} (the server's: {theirs!r})")
        return out


class CalibrationMismatch(ValueError):
    """A calibration of another model, dtype, CPU kind or attention path than the served one."""


def served_identity(
    model: str | Path, dtype: str, device: str = "cpu", attention: str | None = None
) -> Identity:
    """The identity of an engine serving ``model`` in ``dtype`` on ``device`` (this machine's
    CPU kind when it is ``cpu``)."""
    return Identity(model_hash(model), dtype, cpu_kind(device), attention)


def cpu_kind(device: str = "cpu") -> str:
    from engine.cpu import cpu_features

    return cpu_features().summary if device == "cpu" else device


def check(data: dict[str, Any], served: Identity, name: str) -> None:
    """Refuse (``CalibrationMismatch``) a calibration made on anything else than ``served``;
    an older or foreign format is refused by ``check_format`` (ValueError) first."""
    check_format(data, name)
    differs = Identity.of(data).differences(served)
    if differs:
        raise CalibrationMismatch(
            f"{name}: a calibration of another engine than the one served: "
            + "; ".join(differs)
            + " (servedeck calibrate makes one of this engine)"
        )


def store_dir() -> Path:
    """Where calibrations are stored: ``calibrations/`` under the state directory."""
    return cache_dir() / "calibrations"


def stored_name(data: dict[str, Any]) -> str:
    """One file per identity, so a new calibration of the same engine replaces the old."""
    import hashlib

    ident = Identity.of(data)
    stem = Path(data["model"]["path"]).stem.replace(" ", "_") or "model"
    machine = hashlib.sha256(f"{ident.cpu}|{ident.attention}".encode()).hexdigest()[:8]
    return f"{stem}-{ident.model.removeprefix('sha256:')[:12]}-{ident.dtype}-{machine}.json"


def store(data: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``data`` into the store (``store_dir()`` unless ``directory``); its path."""
    directory = directory or store_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / stored_name(data)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return path


def find(served: Identity, directory: Path | None = None) -> Path | None:
    """The newest stored calibration (by ``created``) whose identity matches ``served``; an
    unreadable or older-format file in the store is passed over (logged)."""
    directory = directory or store_dir()
    best: tuple[str, Path] | None = None
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            data = json.loads(path.read_text())
            check(data, served, str(path))
        except CalibrationMismatch:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.info("stored calibration passed over: %s", exc)
            continue
        created = str(data.get("created", ""))
        if best is None or created > best[0]:
            best = (created, path)
    return best[1] if best else None


@dataclass(frozen=True, slots=True)
class CalibrationRef:
    """The calibration a server predicts with: where it is and when it was made."""

    path: str
    created: str
    source: Literal["explicit", "stored"]
    """``explicit``: ``--cost-model FILE``; ``stored``: found in the store by identity."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The cost model a server predicts with, and where it came from."""

    spec: str | None
    """What ``sim.models.load_cost_model`` loads (a profile's name or a file's path); None:
    uncalibrated."""
    calibration: CalibrationRef | None = None
    """The calibration file, where ``spec`` is one (None for a roofline profile)."""


def _ref(path: Path, served: Identity, source: Literal["explicit", "stored"]) -> CalibrationRef:
    data = json.loads(path.read_text())
    check(data, served, str(path))
    return CalibrationRef(str(path.resolve()), str(data.get("created", "")), source)


def choose(explicit: str | None, served: Identity, directory: Path | None = None) -> Choice:
    """``explicit`` (``--cost-model``) wins: a profile as it is, a calibration file checked
    against ``served`` (a mismatch or an older format raises: the start fails naming the
    field); otherwise the stored calibration that matches ``served``; otherwise none."""
    if explicit is not None:
        path = Path(explicit)
        if path.suffix == ".json" and path.is_file():
            return Choice(str(path), _ref(path, served, "explicit"))
        return Choice(explicit)
    found = find(served, directory)
    if found is None:
        return Choice(None)
    return Choice(str(found), _ref(found, served, "stored"))
