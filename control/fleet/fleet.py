"""The fleet: the ``EngineService`` of a server with ``--replicas`` (imports ray). It launches
the replicas on a local or given Ray instance, queues requests through ``FleetEngine``, pushes
policy versions to every replica, converges the ones that missed one, sweeps each pool, and
reports each replica (``ReplicaControl``: the replicas and rolling restarts). The control plane
holds only a tokenizer-only ``EngineFront``: the weights load in the replicas alone.

Policy versions: ``InForce.apply`` calls ``Fleet.apply``; it returns once every live
replica acknowledged the version at its own step boundary (the store marks it ``applied``),
raises ``TimeoutError`` when one has not within the timeout (``pending``: the store's reconcile
job retries, and a replica still working on it waits on the same commands), or the replica's
error (``failed``). The ``fleet_converge`` job (every ``CONVERGE_INTERVAL_S``) reads the
version each replica reports in its routing stats and pushes the version in force to any
replica behind it: one Ray restarted, or one partitioned while the change was made.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from control.core.config import Settings
from control.fleet.deployment import DEPLOYMENT, application
from control.fleet.deployment import scaling as scaling  # where it was defined first
from control.fleet.local_ray import LocalRay, connect
from control.fleet.metrics import install
from control.fleet.restart import RollingRestarts
from control.fleet.schemas import ReplicaReport, ReplicaView, RestartView
from control.fleet.score import ROUTING_STATS_PERIOD_S
from control.fleet.state import merged_integrity, merged_snapshot
from control.metrics import ControlMetrics
from control.policy.schemas import PolicySettings
from control.service.protocol import EngineService, PeriodicJob, ReplicaControl
from engine.config import EngineConfig
from engine.front import EngineFront, QueuedPrompt
from engine.kv_stats import KVIntegrity, ReclaimResult
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.timeline import RequestTimeline
from serving.loop_health import LoopHealth
from serving.snapshot import EngineSnapshot

if TYPE_CHECKING:  # the modules importing ray load once connect() set Ray's environment
    from control.fleet.client import FleetEngine, FleetStream
    from control.fleet.registry import LiveRouter

log = logging.getLogger(__name__)

CONVERGE_JOB_ID = "fleet_converge"
CONVERGE_INTERVAL_S = 0.5
REPORT_TIMEOUT_S = 2.0
READY_TIMEOUT_S = 120.0


@dataclass(eq=False)
class Fleet(EngineService, ReplicaControl):
    settings: Settings
    engine: FleetEngine
    app_name: str
    in_force: PolicySettings
    version: int
    config: EngineConfig
    local: LocalRay | None = None
    """The Ray instance this server started (none with ``--ray-address``)."""
    applied_at: float = 0.0
    """When the last version was acknowledged by every replica (monotonic)."""
    restarts: RollingRestarts = field(default_factory=RollingRestarts)
    """Rolling restarts (``POST /admin/fleet/restart``): the one running or the last one."""

    @classmethod
    def launch(
        cls,
        settings: Settings,
        config: EngineConfig,
        front: EngineFront,
        in_force: PolicySettings,
        version: int,
        on_finished: Callable[[RequestOutput], None],
        metrics: ControlMetrics,
    ) -> Fleet:
        threads = settings.num_threads or 1
        most = settings.max_replicas or settings.replicas or 1
        local = None if settings.ray_address else LocalRay(max(os.cpu_count() or 1, most * threads))
        try:
            # local is None only when ray_address is given
            connect(settings.ray_address or local.address, local)  # type: ignore[union-attr]
            from ray import serve

            from control.fleet.client import FleetEngine

            serve.start(proxy_location="Disabled")
            app = application(settings, config, in_force, version)
            name = settings.ray_app_name
            log.info("deploying %s: %s replicas of %s on Ray", name, most, config.model)
            handle = serve.run(app, name=name, route_prefix=None)
            fleet = cls(
                settings,
                FleetEngine(
                    handle, DEPLOYMENT, front, on_finished, settings.prefix_probe_timeout_s
                ),
                name,
                in_force,
                version,
                config,
            )
            fleet.local = local
            handle.options(method_name="report").remote().result(timeout_s=READY_TIMEOUT_S)
            install(metrics, fleet.snapshots)
        except BaseException:
            if local is not None:
                local.stop()
            raise
        return fleet

    def router(self) -> LiveRouter | None:
        from control.fleet.registry import router_of

        return router_of(self.engine.deployment)

    # -- policy versions -----------------------------------------------------------------

    def apply(self, settings: PolicySettings, version: int, timeout: float) -> None:
        results = self.engine.call_each(
            "apply", settings.model_dump(mode="json"), version, timeout=timeout
        )
        if not results:
            raise TimeoutError("no replica is up")
        for replica, result in sorted(results.items()):
            if isinstance(result, TimeoutError):
                raise TimeoutError(f"replica {replica} has not taken it yet")
            if isinstance(result, Exception):
                raise RuntimeError(f"replica {replica}: {result}") from result
        self.in_force, self.version = settings, version
        self.applied_at = time.monotonic()
        self.front.config.memory_reserve = settings.memory_reserve  # admission reads it

    def converge(self) -> None:
        """Push the version in force to every replica that reports another one."""
        router = self.router()
        if router is None or time.monotonic() - self.applied_at < 2 * ROUTING_STATS_PERIOD_S:
            return  # stats older than the last change would show it missing everywhere
        for replica, load in router.loads().items():
            if load is not None and load.version is not None and load.version != self.version:
                log.info(
                    "replica %s runs version %s: pushing %d", replica, load.version, self.version
                )
                self.engine.handle.options(method_name="apply").remote(
                    self.in_force.model_dump(mode="json"), self.version, replica=replica
                )

    def jobs(self) -> Sequence[PeriodicJob]:
        return (
            PeriodicJob(
                CONVERGE_JOB_ID,
                "push the version in force to replicas behind it",
                self.converge,
                CONVERGE_INTERVAL_S,
            ),
        )

    # -- requests ------------------------------------------------------------------------

    @property
    def front(self) -> EngineFront:
        return self.engine.front

    @property
    def is_running(self) -> bool:
        return self.engine.is_running

    def start(self) -> None:
        """Nothing to start: ``launch`` waited for the replicas."""

    def add_request(
        self, token_ids: list[int], params: SamplingParams, request_id: str
    ) -> FleetStream:
        return self.add_requests([QueuedPrompt(token_ids, params, request_id)])[0]

    def add_requests(self, batch: Sequence[QueuedPrompt]) -> list[FleetStream]:
        return self.engine.add_requests(batch)

    def in_flight(self) -> bool:
        router = self.router()
        return router is not None and sum(router.in_flight().values()) > 0

    def cut_off(self, reason: str) -> int:
        return self.engine.cut_off_all(reason)

    def loop_health(self) -> LoopHealth:
        """The control plane runs no engine loop: each replica's loop is its own (Ray restarts
        a replica whose health check fails). Never busy here, so the watchdog never fires."""
        return LoopHealth(
            alive=self.is_running,
            busy=False,
            seconds_since_progress=0.0,
            step=0,
            current_step=None,
        )

    # -- maintenance and state -----------------------------------------------------------

    def reclaim(self) -> Future[ReclaimResult]:
        """The sweep on every replica (each records its own run); the fleet's sum for the
        control plane's record. A replica that fails it fails the run."""
        future: Future[ReclaimResult] = Future()
        try:
            results = self.engine.call_each("reclaim", timeout=REPORT_TIMEOUT_S * 5)
            errors = [f"{r}: {e}" for r, e in results.items() if isinstance(e, Exception)]
            if errors:
                raise RuntimeError("; ".join(errors))
            runs: list[ReclaimResult] = list(results.values())
            future.set_result(ReclaimResult.total(runs))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def reports(self, timeout: float = REPORT_TIMEOUT_S) -> dict[str, ReplicaReport | Exception]:
        return self.engine.call_each("report", timeout=timeout)

    def snapshot(self, timeout: float | None = REPORT_TIMEOUT_S) -> EngineSnapshot:
        """Every replica's snapshot summed (``state.merged_snapshot``); ``TimeoutError`` when
        no replica answered."""
        reports = self.reports(REPORT_TIMEOUT_S if timeout is None else timeout)
        snaps = {r: rep.snapshot for r, rep in reports.items() if isinstance(rep, ReplicaReport)}
        if not snaps:
            raise TimeoutError("no replica answered")
        return merged_snapshot(snaps)

    def check_kv_integrity(self, timeout: float) -> KVIntegrity:
        results = self.engine.call_each("check_kv_integrity", timeout=timeout)
        errors = [f"{r}: {e}" for r, e in results.items() if isinstance(e, Exception)]
        if errors:
            raise RuntimeError("; ".join(errors))
        if not results:
            raise TimeoutError("no replica is up")
        return merged_integrity(results)

    def timeline(
        self, seq_id: str, timeout: float | None = REPORT_TIMEOUT_S
    ) -> RequestTimeline | None:
        """The request's timeline from the replica that served it (None: no replica knows it);
        ``TimeoutError`` when no replica answered."""
        wait = REPORT_TIMEOUT_S if timeout is None else timeout
        results = self.engine.call_each("timeline", seq_id, timeout=wait)
        found = [t for t in results.values() if isinstance(t, RequestTimeline)]
        if not found and results and all(isinstance(r, Exception) for r in results.values()):
            raise TimeoutError("no replica answered")
        return found[0] if found else None

    def snapshots(self) -> dict[str, EngineSnapshot]:
        return {
            r: rep.snapshot
            for r, rep in self.reports(1.0).items()
            if isinstance(rep, ReplicaReport)
        }

    def views(self) -> list[ReplicaView]:
        router = self.router()
        in_flight = router.in_flight() if router is not None else {}
        return [
            ReplicaView.of(replica, report, in_flight.get(replica, 0))
            for replica, report in sorted(self.reports().items())
        ]

    def restart(self) -> RestartView:
        """Start a rolling restart (``restart.py``); ``RestartRefused`` while one runs."""
        return self.restarts.start(self)

    def restart_view(self) -> RestartView | None:
        return self.restarts.view()

    def replicas(self) -> ReplicaControl:
        return self

    def close(self) -> None:
        """This driver leaves first (else it logs a failed push to Ray every second until the
        process ends); then a local instance is ended whole (its replicas with it), or on a
        cluster the application is deleted."""
        import ray
        from ray import serve

        self.engine.close()
        if self.local is None:
            try:
                serve.delete(self.app_name)
            except Exception:
                log.exception("could not delete the Ray Serve application %s", self.app_name)
        started = time.monotonic()
        ray.shutdown()
        if self.local is not None:
            self.local.stop()
        log.info("left Ray in %.1f s", time.monotonic() - started)
