"""A plain progress bar on stderr, weighted by tokens (a 500-request burst of long prompts
is not the same work as a 500-request sweep of short ones)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class Progress:
    def __init__(self, total_units: float, label: str, stream: TextIO | None = None) -> None:
        self.total = max(total_units, 1.0)
        self.done = 0.0
        self.label = label
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.perf_counter()
        self.run_name = ""
        self.run_index = 0
        self.num_runs = 0
        self._unit = 1.0
        self._shown = 0.0

    def start_run(self, name: str, index: int, num_runs: int, units_per_request: float) -> None:
        self.run_name, self.run_index, self.num_runs = name, index, num_runs
        self._unit = units_per_request
        if not self.live:
            self.stream.write(f"[{self.label}] run {index}/{num_runs} {name} ...\n")
            self.stream.flush()
        self._draw(force=True)

    def advance(self, requests: int) -> None:
        self.done = min(self.total, self.done + requests * self._unit)
        self._draw()

    def finish_run(self, summary: str) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        self.stream.write(f"[{self.label}] {self.run_name}: {summary}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        elapsed = time.perf_counter() - self.started
        self.stream.write(f"[{self.label}] done in {_clock(elapsed)}\n")
        self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.live or (not force and now - self._shown < 0.25):
            return
        self._shown = now
        share = self.done / self.total
        elapsed = now - self.started
        eta = f", ~{_clock(elapsed / share - elapsed)} left" if share > 0.02 else ""
        width = 24
        bar = "#" * int(share * width) + "-" * (width - int(share * width))
        self.stream.write(
            f"\r\033[K[{self.label}] [{bar}] {share:4.0%} run {self.run_index}/{self.num_runs} "
            f"{self.run_name} · {_clock(elapsed)}{eta}"
        )
        self.stream.flush()
