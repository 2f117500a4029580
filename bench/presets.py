"""What each preset runs, and how big. ``seed`` is the article unscaled (for GPUs); ``cpu``
scales lengths by 14 on the ``small`` model; ``quick`` is a ``tiny``-model subset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from bench.metrics import Slo
from bench.workloads import Span
from policies.base import PolicyName

MIXED_INPUTS = Span(32, 512)
MIXED_OUTPUT = 64
SUITES = (
    "burst",
    "mixed",
    "batch-sweep",
    "block-sweep",
    "poisson",
    "short-long",
    "reserve",
    "reclaim",
    "hybrid-depth",
    "capacity",
)
POLICIES: tuple[str, ...] = get_args(PolicyName)
PEERS = ("hf-static", "hf-continuous")


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    model_preset: str
    scale: float
    """Lengths are the article's divided by this (1 = unscaled)."""
    concurrencies: tuple[int, ...]
    """Burst sizes; every policy runs at the first, ``large_burst_policies`` at the rest."""
    large_burst_policies: tuple[str, ...]
    large_burst_workloads: tuple[str, ...]
    """Which bursts run at the larger sizes: "burst-fixed" (the article's) and/or
    "burst-variable"."""
    kv_tokens: int
    """KV pool of every burst run (same memory for every policy), in token slots."""
    slo: Slo
    mixed_requests: int = 64
    mixed_scale: float = 1
    """Issue 2's workload (prompts 32-512, 64 new tokens) is CPU-sized: unscaled on cpu."""
    mixed_policies: tuple[str, ...] = ("continuous", "static", "dynamic")
    peer_batch: int = 64
    peers: tuple[str, ...] = PEERS
    poisson_requests: int = 50
    poisson_rates: tuple[float, ...] = (0.25, 0.5, 0.75, 0.9, 1.1)
    poisson_policies: tuple[str, ...] = ("continuous", "dynamic")
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64, 128)
    sweep_policies: tuple[str, ...] = ("continuous", "dynamic")
    sweep_rounds: int = 2
    """Closed-loop sweep: each of the B clients sends this many requests (at least 8 in all)."""
    block_sizes: tuple[int, ...] = (16, 32, 64)
    block_policies: tuple[str, ...] = ("continuous", "dynamic")
    block_repeats: int = 1
    short_long_requests: int = 100
    long_share: float = 0.05
    reserves: tuple[float, ...] = (0.0, 0.10, 0.15)
    reserve_requests: int = 40
    """Reserve runs: a burst of this many long-output requests (see ``long_output``)."""
    overload_kv_share: float = 0.35
    """Reserve and capacity runs: pool = this share of the burst's total KV demand."""
    hybrid_depths: tuple[int, ...] = (1, 2, 3)
    hybrid_requests_per_client: int = 4
    reclaim_every_s: float = 5.0
    leak_share: float = 0.10
    replay_policies: tuple[str, ...] = ("continuous", "dynamic")
    """The replay bound runs for these on the fixed burst at the base size (continuous on
    issue 2's workload always has it): it costs another forward pass of the whole run."""
    short_long_policies: tuple[str, ...] = POLICIES
    policies: tuple[str, ...] = POLICIES
    length_window: int = field(default=128)
    """Dynamic/hybrid length window in unscaled tokens (divided by ``scale`` like lengths)."""

    @property
    def base_concurrency(self) -> int:
        return self.concurrencies[0]

    @property
    def scaled_window(self) -> int:
        return max(1, round(self.length_window / self.scale))

    @property
    def mixed_window(self) -> int:
        return max(1, round(self.length_window / self.mixed_scale))

    @property
    def mixed_inputs(self) -> Span:
        return MIXED_INPUTS.scaled(self.mixed_scale)

    @property
    def mixed_output(self) -> int:
        return max(1, round(MIXED_OUTPUT / self.mixed_scale))


PRESETS: dict[str, Preset] = {
    "quick": Preset(
        name="quick",
        model_preset="tiny",
        scale=40,
        concurrencies=(16, 48),
        large_burst_policies=("continuous", "dynamic"),
        large_burst_workloads=("burst-fixed", "burst-variable"),
        kv_tokens=4096,
        slo=Slo(ttft_s=1.0, tpot_s=0.05),
        mixed_requests=16,
        mixed_scale=8,
        peer_batch=16,
        poisson_requests=12,
        poisson_rates=(0.5, 1.1),
        batch_sizes=(1, 4, 16),
        sweep_rounds=1,
        block_sizes=(16, 64),
        short_long_requests=16,
        long_share=0.125,
        hybrid_depths=(1, 3),
        hybrid_requests_per_client=2,
        reclaim_every_s=0.1,
        leak_share=0.25,
        reserve_requests=16,
    ),
    "cpu": Preset(
        name="cpu",
        model_preset="small",
        scale=14,
        concurrencies=(100, 500),
        large_burst_policies=("continuous", "dynamic"),
        large_burst_workloads=("burst-fixed",),
        kv_tokens=32768,
        slo=Slo(ttft_s=5.0, tpot_s=0.25),
        mixed_policies=("continuous",),
        block_policies=("continuous",),
        block_repeats=2,
        replay_policies=(),
        short_long_policies=("dynamic", "continuous", "hybrid"),
        poisson_requests=30,
        sweep_rounds=1,
        reserve_requests=30,
    ),
    "seed": Preset(
        name="seed",
        model_preset="llama3-8b",
        scale=1,
        concurrencies=(100, 500),
        large_burst_policies=POLICIES,
        large_burst_workloads=("burst-fixed", "burst-variable"),
        kv_tokens=400_000,
        slo=Slo(ttft_s=2.0, tpot_s=0.1),
        mixed_policies=POLICIES,
        poisson_requests=500,
        poisson_policies=POLICIES,
        sweep_policies=POLICIES,
        block_policies=POLICIES,
        reclaim_every_s=5.0,
    ),
}
