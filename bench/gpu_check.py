"""The GPU check's entry point as a script: ``python3 bench/gpu_check.py [--out FILE]
[--cpu-smoke] [--skip-engine]``. The check itself is the ``bench.gpu`` package (docs/gpu.md)."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, not -m
    from bench.gpu.main import main

    raise SystemExit(main())
