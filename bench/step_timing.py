"""The timers ``bench.step_profile`` holds a step to: a clock, its weight products alone at the
step's shapes, and this machine's copy rate."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""``cpu`` times with the process's CPU time: with one thread on a loaded machine it is what
the step costs, not how long others kept it waiting (with more threads it counts their
spin-waits too)."""


@dataclass(frozen=True)
class Timer:
    clock: Callable[[], float] = time.perf_counter

    def once(self, fn: Callable[[], object]) -> float:
        started = self.clock()
        fn()
        return self.clock() - started

    def median(self, fn: Callable[[], object], reps: int) -> float:
        return statistics.median(self.once(fn) for _ in range(reps))

    def paired(
        self, first: Callable[[], object], second: Callable[[], object], reps: int
    ) -> tuple[list[float], list[float]]:
        """Times of ``first`` and ``second`` taken alternately, so that on a shared machine
        both see the same load (timed one after the other, a burst of load on one side moves
        the ratio by tens of percent)."""
        a, b = [], []
        for _ in range(reps):
            a.append(self.once(first))
            b.append(self.once(second))
        return a, b

    def copy_rate(self, megabytes: int = 256) -> float:
        """Bytes per second a plain tensor copy moves (bytes read) on this machine."""
        src = torch.ones(megabytes * 2**20 // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        return src.numel() * 4 / self.median(lambda: dst.copy_(src), 5)


def weight_products(model, tokens: int, sampled: int) -> tuple[Callable[[], None], float]:
    """The step's weight products alone (every layer's, plus the sampled rows' logits) as a
    function to time, and their FLOPs."""
    hidden = model.config.hidden_size
    products = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        products += [
            (hidden, attn.qkv_proj),
            (attn.q_size, attn.o_proj),
            (hidden, mlp.gate_up_proj),
            (mlp.down_proj.shape[1], mlp.down_proj),
        ]
    inputs = {n: torch.randn(tokens, n) for n, _ in products}
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    rows = torch.randn(max(sampled, 1), hidden)

    def run() -> None:
        for n, weight in products:
            F.linear(inputs[n], weight)
        if sampled:
            F.linear(rows, head)

    run()
    flops = sum(2 * tokens * w.shape[0] * w.shape[1] for _, w in products)
    flops += 2 * sampled * head.shape[0] * head.shape[1]
    return run, flops
