"""Predicted vs measured, from accuracy.json: ``python bench/results/calibration/plot.py``
writes accuracy.png beside it (each point one workload × policy; the bar spans the three
measured runs; the band is the issue's tolerance: ±15 % tok/s, ±25 % TTFT p50)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
PANELS = (
    ("output_throughput", "output tok/s", 1.0, 0.15),
    ("ttft_p50", "TTFT p50 (ms)", 1e3, 0.25),
)


def main() -> None:
    rows = json.loads((HERE / "accuracy.json").read_text())["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (key, label, scale, tolerance) in zip(axes, PANELS, strict=True):
        top = 0.0
        for policy in sorted({r["policy"] for r in rows}):
            mine = [r for r in rows if r["policy"] == policy and r["predicted"][key] is not None]
            meas = [r[f"{key}_measured_median"] * scale for r in mine]
            pred = [r["predicted"][key] * scale for r in mine]
            runs = [[x[key] * scale for x in r["measured"]] for r in mine]
            low = [m - min(v) for m, v in zip(meas, runs, strict=True)]
            high = [max(v) - m for m, v in zip(meas, runs, strict=True)]
            ax.errorbar(meas, pred, xerr=[low, high], fmt="o", capsize=3, label=policy)
            top = max(top, *meas, *pred)
        line = [0, top * 1.1]
        ax.plot(line, line, color="grey", linewidth=1)
        ax.fill_between(
            line, [v * (1 - tolerance) for v in line], [v * (1 + tolerance) for v in line],
            color="grey", alpha=0.15, label=f"±{tolerance:.0%}",
        )  # fmt: skip
        ax.set_xlabel(f"measured {label} (median of 3)")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(label)
        ax.legend(fontsize=8)
    fig.suptitle("Calibrated cost model vs measured runs (small checkpoint, this CPU)")
    fig.tight_layout()
    fig.savefig(HERE / "accuracy.png", dpi=110)


if __name__ == "__main__":
    main()
