"""The JSON being built: each part runs guarded and the file is rewritten after it."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"errors": {}}
        self.started = time.perf_counter()

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def save(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed_s, 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)

    def part(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run one part; a failure is recorded under ``errors`` and the next part still runs."""
        began = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            self.data[name] = fn()
        except Exception as exc:  # a failed part must not stop the others
            self.data["errors"][name] = "".join(traceback.format_exception(exc))[-4000:]
            print(f"[gpu_check] {name} FAILED: {exc!r}", flush=True)
        print(f"[gpu_check] {name} done in {time.perf_counter() - began:.1f}s", flush=True)
        self.save()
        return self.data.get(name)
