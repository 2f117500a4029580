"""One engine replica: the Ray Serve deployment class (an ``AsyncEngine`` built as
``control.compose.build_runtime`` builds one, without the store, schedules or metrics, which
stay single in the control plane).

Every method but ``generate`` takes a ``replica`` keyword: ``router.FleetRouter`` sends such a
call to that replica alone, which is how the control plane pushes a policy version, asks for a
state or a sweep, or probes the prefix cache of each replica. Methods are ``async`` (the engine
work runs on the engine thread or a worker thread) so the replica's event loop keeps streaming.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from control.fleet.schemas import ReplicaReport
from control.policy.schemas import PolicySettings
from engine.config import EngineConfig
from engine.front import QueuedPrompt
from engine.kv_stats import KVIntegrity, ReclaimResult
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT
from engine.timeline import RequestTimeline

log = logging.getLogger(__name__)

APPLY_WAIT_S = 3600.0
"""How long a replica's call waits for its engine's step boundary (the control plane's own
timeout answers the client long before; the replica's call just finishes)."""


def replica_id() -> str:
    from ray import serve

    return serve.get_replica_context().replica_id.unique_id


class EngineReplica:
    """The deployment's class: ``serve.deployment(EngineReplica)`` in ``runtime.py``."""

    # settings: the policy version in force as JSON (Ray ships it as plain data), read back by
    # PolicySettings; Any as in its model_dump
    def __init__(self, config: EngineConfig, settings: dict[str, Any], version: int) -> None:
        """``settings`` and ``version``: the version in force when the fleet was deployed. Ray
        restarts a dead replica with these same arguments; the control plane's reconcile job
        then pushes the active version to it (it reports the version it runs)."""
        from control.service.local import LocalEngine  # the model code loads in the replica only
        from serving.engine import LLMEngine

        in_force = PolicySettings.model_validate(settings)
        self.id = replica_id()
        self.engine = LLMEngine.from_config(config)
        self.engine.set_policy(in_force.policy, version=version, queue=in_force.queue).result()
        self.engine.set_memory_reserve(in_force.memory_reserve).result()
        self.version: int | None = version
        self.started_at = time.time()
        self.last_reclaim: ReclaimResult | None = None
        self._apply_lock = threading.Lock()
        self.local = LocalEngine(self.engine, in_force)
        """The replica's engine as one server's (its loop, versions put in force)."""
        self.local.start()
        log.info("replica %s serving with policy version %d", self.id, version)

    # -- requests ------------------------------------------------------------------------

    async def generate(
        self,
        token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        priority: int = DEFAULT_PRIORITY,
        tenant: str = DEFAULT_TENANT,
        route: object = None,
    ) -> AsyncIterator[RequestOutput | str]:
        """This replica's id once the engine admitted the request (``QueueFull`` comes before
        it: the control plane still answers 429), then its outputs (``route``: the router's
        hint). Its priority and tenant are the front's (the fair queue's ledger is each
        replica's own)."""
        prompt = QueuedPrompt(token_ids, params, request_id, priority, tenant)
        stream = self.local.add_requests([prompt])[0]
        try:
            yield self.id
            async for output in stream:
                yield output
        finally:
            await stream.aclose()  # a cancelled call aborts the request, freeing its blocks

    async def match_prefix(self, token_ids: list[int], replica: str | None = None) -> int:
        """Blocks of this prompt's prefix cached here (read between steps without waiting for a
        boundary: a routing hint, never a promise)."""
        return len(self.engine.blocks.match_prefix(token_ids))

    # -- the control plane's calls -------------------------------------------------------

    async def apply(
        self,
        settings: dict[str, Any],  # the policy version's JSON, as in __init__
        version: int,
        replica: str | None = None,
    ) -> int:
        """Put a policy version into force at the next step boundary; returns the version. A
        retry of the version still pending waits on the same commands."""
        return await asyncio.to_thread(
            self._apply, PolicySettings.model_validate(settings), version
        )

    def _apply(self, settings: PolicySettings, version: int) -> int:
        with self._apply_lock:
            if self.version == version:
                return version
            self.local.apply(settings, version, APPLY_WAIT_S)
            self.version = version
        log.info("replica %s: policy version %d in force", self.id, version)
        return version

    async def report(self, replica: str | None = None) -> ReplicaReport:
        snapshot = await asyncio.to_thread(self.local.snapshot)
        return ReplicaReport(
            replica=self.id,
            pid=os.getpid(),
            version=self.version,
            started_at=self.started_at,
            snapshot=snapshot,
            last_reclaim=self.last_reclaim,
        )

    async def check_kv_integrity(self, replica: str | None = None) -> KVIntegrity:
        return await asyncio.to_thread(self.local.check_kv_integrity, APPLY_WAIT_S)

    async def timeline(self, seq_id: str, replica: str | None = None) -> RequestTimeline | None:
        return await asyncio.to_thread(self.local.timeline, seq_id)

    async def reclaim(self, replica: str | None = None) -> ReclaimResult:
        self.last_reclaim = await asyncio.wrap_future(self.local.reclaim())
        return self.last_reclaim

    async def record_routing_stats(self) -> dict[str, int | None]:
        """Ray Serve asks this every ``ROUTING_STATS_PERIOD_S``: the router's inputs."""

        def read() -> dict[str, int | None]:
            scheduler, kv = self.engine.policy.snapshot(), self.engine.blocks.stats()
            return {
                "waiting": scheduler.waiting,
                "running": scheduler.running,
                "free_blocks": max(0, kv.free + kv.cached - kv.reserved),
                "version": self.version,
            }

        return await asyncio.wrap_future(self.engine.commands.submit(read))

    def __del__(self) -> None:
        local = getattr(self, "local", None)
        if local is not None:
            local.close()
