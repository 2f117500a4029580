"""What one bench run measures: the list of runs for a preset, in order.

Every run draws its requests from the seeded workloads, so each policy and each peer sees the
very same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench import workloads as wl
from bench.presets import SUITES, Preset
from bench.runner import EngineSettings, Hooks
from bench.workloads import Workload
from policies.registry import POLICIES
from policies.spec import parse_spec

SEED = 0


@dataclass
class RunSpec:
    suite: str
    policy: str
    workload: Workload
    settings: EngineSettings
    labels: dict[str, Any] = field(default_factory=dict)
    hooks: Hooks = field(default_factory=Hooks)
    replay: bool = False
    rate_fraction: float | None = None
    """Poisson runs: arrival rate as a share of the continuous policy's saturation rate."""
    keep_series: bool = False

    @property
    def id(self) -> str:
        extra = "".join(f",{k}={v}" for k, v in self.labels.items() if v is not None)
        return f"{self.suite}:{self.workload.name}@{self.workload.concurrency}:{self.policy}{extra}"

    @property
    def units_per_request(self) -> float:
        w = self.workload
        return (w.prompt_tokens + w.output_tokens) / max(1, len(w.requests))


@dataclass
class PeerSpec:
    peer: str
    workload: Workload

    @property
    def id(self) -> str:
        return f"peers:{self.workload.name}@{self.workload.concurrency}:{self.peer}"

    @property
    def units_per_request(self) -> float:
        w = self.workload
        return (w.prompt_tokens + w.output_tokens) / max(1, len(w.requests))


def policy_params(policy: str, window: int, max_batch: int | None = None) -> dict[str, Any]:
    """Each policy at its params model's defaults, but for the batch cap a run sets and the
    length window, scaled like the workload's lengths (for the policies that have one)."""
    params: dict[str, Any] = {batch_field(policy): max_batch} if max_batch else {}
    if "length_window" in POLICIES[policy].params_model.model_fields:
        params["length_window"] = window
    return params


def batch_field(policy: str) -> str:
    """The params field that caps a policy's batch: the one the engine's max_num_seqs bounds
    (``max_batch_size`` for the padded policies, ``max_num_seqs`` for the others)."""
    caps = POLICIES[policy].params_model.caps
    return next(name for name, cap in caps.items() if cap == "max_num_seqs")


def max_batch_of(settings: EngineSettings) -> int:
    """The batch cap the run's policy works under: its param, else the engine's cap."""
    params = parse_spec({"name": settings.policy, "params": settings.policy_params}).params
    return getattr(params, batch_field(settings.policy)) or settings.config().max_num_seqs


class Plan:
    """Builds the list of runs for a preset (lengths need the model's vocabulary)."""

    def __init__(
        self,
        preset: Preset,
        policies: tuple[str, ...],
        peers: tuple[str, ...],
        vocab: int,
        suites: tuple[str, ...] = SUITES,
    ):
        self.preset = preset
        self.policies = policies
        self.peers = peers
        self.vocab = vocab
        self.suites = suites
        self.runs: list[RunSpec | PeerSpec] = []

    def settings(
        self,
        policy: str,
        max_batch: int | None = None,
        window: int | None = None,
        kv_tokens: int | None = None,
        **engine: Any,
    ) -> EngineSettings:
        """``engine`` are ``EngineConfig`` fields this run sets (block_size, memory_reserve)."""
        params = policy_params(policy, window or self.preset.scaled_window, max_batch)
        return EngineSettings(policy, params, kv_tokens or self.preset.kv_tokens, engine)

    def burst(self, n: int, variable: bool) -> Workload:
        return wl.burst(n, variable, self.preset.scale, self.vocab, SEED)

    def demand(self, workload: Workload) -> int:
        return workload.prompt_tokens + workload.output_tokens

    def build(self) -> list[RunSpec | PeerSpec]:
        steps = {
            "burst": self._bursts,
            "mixed": self._mixed,
            "batch-sweep": self._batch_sweep,
            "block-sweep": self._block_sweep,
            "poisson": self._poisson,
            "short-long": self._short_long,
            "reserve": self._reserve,
            "reclaim": self._reclaim,
            "hybrid-depth": self._hybrid_depths,
            "capacity": self._capacity,
        }
        for suite in SUITES:
            if suite in self.suites:
                steps[suite]()
        return self.runs

    def _bursts(self) -> None:
        p = self.preset
        for variable in (False, True):
            for n in p.concurrencies:
                workload = self.burst(n, variable)
                base = n == p.base_concurrency
                if not base and workload.name not in p.large_burst_workloads:
                    continue
                chosen = self.policies if base else p.large_burst_policies
                for policy in [q for q in self.policies if q in chosen]:
                    self.runs.append(
                        RunSpec(
                            "burst",
                            policy,
                            workload,
                            self.settings(policy),
                            replay=base and not variable and policy in p.replay_policies,
                            keep_series=base,
                        )
                    )

    def _mixed(self) -> None:
        p = self.preset
        workload = wl.mixed(p.mixed_requests, p.mixed_inputs, p.mixed_output, self.vocab, SEED)
        kv = max(p.kv_tokens, self.demand(workload) + 64 * p.mixed_requests)
        for policy in [q for q in p.mixed_policies if q in self.policies]:
            batch = p.peer_batch if policy == "static" else None
            self.runs.append(
                RunSpec(
                    "mixed",
                    policy,
                    workload,
                    self.settings(policy, batch, p.mixed_window, kv_tokens=kv),
                    replay=policy == "continuous",
                    keep_series=True,
                )
            )
        for peer in self.peers:
            self.runs.append(PeerSpec(peer, workload))

    def _batch_sweep(self) -> None:
        p = self.preset
        largest = max(max(8, b * p.sweep_rounds) for b in p.batch_sizes)
        pool = self.burst(largest, variable=False)
        for size in p.batch_sizes:
            workload = pool.closed_loop(size, max(8, size * p.sweep_rounds))
            for policy in [q for q in p.sweep_policies if q in self.policies]:
                self.runs.append(
                    RunSpec(
                        "batch-sweep",
                        policy,
                        workload,
                        self.settings(policy, size),
                        labels={"sweep": "batch-size"},
                    )
                )

    def _block_sweep(self) -> None:
        """Interleaved repeats (16, 32, 64, 16, ...): a few % is within one run's noise here,
        so the sweep compares each size's best run."""
        p = self.preset
        workload = self.burst(p.base_concurrency, variable=False)
        for rep in range(p.block_repeats):
            for block_size in p.block_sizes:
                for policy in [q for q in p.block_policies if q in self.policies]:
                    self.runs.append(
                        RunSpec(
                            "block-sweep",
                            policy,
                            workload,
                            self.settings(policy, block_size=block_size),
                            labels={"sweep": "block-size", "block": block_size, "rep": rep},
                        )
                    )

    def _poisson(self) -> None:
        p = self.preset
        burst = self.burst(p.base_concurrency, variable=True)
        measured = "burst" in self.suites and "continuous" in self.policies
        if not measured and p.poisson_policies:
            self.runs.append(RunSpec("probe", "continuous", burst, self.settings("continuous")))
        base = burst.head(p.poisson_requests)
        for fraction in p.poisson_rates:
            for policy in [q for q in p.poisson_policies if q in self.policies]:
                self.runs.append(
                    RunSpec(
                        "poisson",
                        policy,
                        base,
                        self.settings(policy),
                        labels={"load": fraction},
                        rate_fraction=fraction,
                    )
                )

    def _short_long(self) -> None:
        p = self.preset
        workload = wl.short_long(p.short_long_requests, p.long_share, p.scale, self.vocab, SEED)
        for policy in [q for q in p.short_long_policies if q in self.policies]:
            self.runs.append(RunSpec("short-long", policy, workload, self.settings(policy)))

    def _overload_kv(self, workload: Workload) -> int:
        return int(self.demand(workload) * self.preset.overload_kv_share)

    def _reserve(self) -> None:
        p = self.preset
        if "continuous" not in self.policies:
            return
        workload = wl.long_output(p.reserve_requests, p.scale, self.vocab, SEED)
        kv = self._overload_kv(workload)
        for reserve in p.reserves:
            self.runs.append(
                RunSpec(
                    "reserve",
                    "continuous",
                    workload,
                    self.settings("continuous", kv_tokens=kv, memory_reserve=reserve),
                    labels={"reserve": reserve},
                )
            )

    def _reclaim(self) -> None:
        p = self.preset
        if "continuous" not in self.policies:
            return
        workload = self.burst(p.base_concurrency, variable=True)
        kv = self._overload_kv(workload)
        count = max(1, round(len(workload.requests) * p.leak_share))
        leak = frozenset(range(0, len(workload.requests), len(workload.requests) // count))
        for every in (None, p.reclaim_every_s):
            self.runs.append(
                RunSpec(
                    "reclaim",
                    "continuous",
                    workload,
                    self.settings("continuous", kv_tokens=kv),
                    labels={"leak": len(leak), "reclaim_every": every},
                    hooks=Hooks(leak=leak, reclaim_every_s=every),
                )
            )

    def _capacity(self) -> None:
        """Same KV memory, padded (static, groups as large as memory allows) vs paged."""
        p = self.preset
        if not {"continuous", "static"} <= set(self.policies):
            return
        workload = self.burst(p.base_concurrency, variable=False)
        kv = self._overload_kv(workload)
        for policy in ("continuous", "static"):
            self.runs.append(
                RunSpec(
                    "capacity",
                    policy,
                    workload,
                    self.settings(policy, 256, kv_tokens=kv),
                    hooks=Hooks(watch_memory=True),
                )
            )

    def _hybrid_depths(self) -> None:
        p = self.preset
        if not {"continuous", "hybrid"} <= set(self.policies):
            return
        largest = max(p.hybrid_depths) * p.hybrid_requests_per_client
        pool = self.burst(largest, variable=False)
        for depth in p.hybrid_depths:
            workload = pool.closed_loop(depth, depth * p.hybrid_requests_per_client)
            for policy in ("hybrid", "continuous"):
                self.runs.append(RunSpec("hybrid-depth", policy, workload, self.settings(policy)))
