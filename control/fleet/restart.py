"""Rolling restarts of the fleet (``POST /admin/fleet/restart``, ``servedeck fleet restart``).

The restart deploys the application again (``fleet.application``, built with the policy
version in force): Ray Serve rolls it one replica at a time. The replica it stops leaves the
router's list at once (no new request goes there), finishes its requests for up to
``fleet_drain_timeout_s`` (then Ray ends it, and its streams end with ``EngineStopped``
naming the restart), and a new one starts; the next goes only once the new one is up and
passed its health check. This module follows it through the router's list of replicas and
logs each step; ``view`` is ``/admin/state``'s ``restart``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from control.fleet.schemas import RestartState, RestartView

if TYPE_CHECKING:
    from control.core.config import Settings
    from control.fleet.client import FleetEngine
    from control.policy.schemas import PolicySettings
    from engine.config import EngineConfig


class Fleet(Protocol):
    """What a restart reads of the fleet it redeploys (``control.fleet.fleet.Fleet``)."""

    settings: Settings
    config: EngineConfig
    in_force: PolicySettings
    version: int
    app_name: str
    engine: FleetEngine


log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often the restart reads the router's list of replicas."""
START_TIMEOUT_S = 120.0
"""How long one new replica may take to come up (each replica: its drain, then this)."""


class RestartRefused(RuntimeError):
    """A restart is already running, or no replica is up to restart."""


@dataclass
class RollingRestart:
    id: int
    app_name: str
    replicas: list[str]
    version: int
    drain_timeout_s: float
    started_at: float = field(default_factory=time.time)
    state: RestartState = "running"
    finished_at: float | None = None
    error: str | None = None
    left: list[str] = field(default_factory=list)
    """Old replicas out of routing, in order (the last one drains while Ray stops one)."""
    started: list[str] = field(default_factory=list)
    """New replicas up, in order."""

    @property
    def lost_note(self) -> str:
        """What a request it stopped is told."""
        return (
            f"the replica serving this request was stopped by a rolling restart "
            f"(its requests had {self.drain_timeout_s:g} s to finish); retry the request"
        )


class RollingRestarts:
    """The fleet's restarts: at most one at a time; the last one stays visible."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self.current: RollingRestart | None = None

    def start(self, fleet: Fleet) -> RestartView:
        with self._lock:
            if self.current is not None and self.current.state == "running":
                raise RestartRefused(f"restart {self.current.id} is still running")
            replicas = fleet.engine.replica_ids()
            if not replicas:
                raise RestartRefused("no replica is up to restart")
            self._count += 1
            restart = RollingRestart(
                self._count,
                fleet.app_name,
                replicas,
                fleet.version,
                fleet.settings.fleet_drain_timeout_s,
            )
            self.current = restart
        log.info(
            "rolling restart %d of %s (policy version %d, drain timeout %g s)",
            restart.id,
            ", ".join(replicas),
            restart.version,
            restart.drain_timeout_s,
        )
        threading.Thread(
            target=self._run, args=(fleet, restart), name="fleet-restart", daemon=True
        ).start()
        return self._view_of(restart)

    def _run(self, fleet: Fleet, restart: RollingRestart) -> None:
        fleet.engine.lost_note = restart.lost_note
        try:
            self._follow(fleet, restart, _deploy(fleet))
            restart.state = "done"
            log.info("rolling restart %d done: %s", restart.id, ", ".join(restart.started))
        except Exception as exc:
            restart.state, restart.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("rolling restart %d failed", restart.id)
        finally:
            restart.finished_at = time.time()
            fleet.engine.lost_note = None

    def _follow(self, fleet: Fleet, restart: RollingRestart, deployed: Future[None]) -> None:
        old = set(restart.replicas)
        seen = set(old)
        deadline = time.monotonic() + len(old) * (restart.drain_timeout_s + START_TIMEOUT_S)
        while True:
            routed = set(fleet.engine.replica_ids())
            for rid in sorted(routed - seen):
                restart.started.append(rid)
                log.info("rolling restart %d: replica %s is up", restart.id, rid)
            for rid in sorted(old - routed - set(restart.left)):
                restart.left.append(rid)
                log.info("rolling restart %d: replica %s draining", restart.id, rid)
                drained_by = time.monotonic() + restart.drain_timeout_s
                fleet.engine.cut_off(rid, drained_by, restart.lost_note)
            seen |= routed
            if deployed.done():
                deployed.result()  # Ray's error, if the deploy failed
                if not routed & old:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"still running after {deadline:.0f} s")
            time.sleep(POLL_S)

    def view(self, restart: RollingRestart | None = None) -> RestartView | None:
        restart = restart or self.current
        return None if restart is None else self._view_of(restart)

    def _view_of(self, restart: RollingRestart) -> RestartView:
        states = _replica_states(restart) if restart.state == "running" else {}
        return RestartView(
            id=restart.id,
            state=restart.state,
            replicas=list(restart.replicas),
            version=restart.version,
            drain_timeout_s=restart.drain_timeout_s,
            started_at=restart.started_at,
            finished_at=restart.finished_at,
            left=list(restart.left),
            started=list(restart.started),
            draining=restart.left[-1] if restart.left and states.get("STOPPING") else None,
            replica_states=states,
            error=restart.error,
        )


def _deploy(fleet: Fleet) -> Future[None]:
    """Deploy the application again, on a thread (``serve.run`` returns once it runs)."""
    from ray import serve

    from control.fleet.deployment import application

    app = application(fleet.settings, fleet.config, fleet.in_force, fleet.version)
    done: Future[None] = Future()

    def run() -> None:
        try:
            serve.run(app, name=fleet.app_name, route_prefix=None)
            done.set_result(None)
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name="fleet-redeploy", daemon=True).start()
    return done


def _replica_states(restart: RollingRestart) -> dict[str, int]:
    """Ray Serve's count of the deployment's replicas by state (STARTING, RUNNING, STOPPING)."""
    try:
        from ray import serve

        from control.fleet.deployment import DEPLOYMENT

        app = serve.status().applications.get(restart.app_name)
        status = app.deployments.get(DEPLOYMENT) if app is not None else None
        states = status.replica_states if status is not None else {}
        return {getattr(k, "value", str(k)): int(v) for k, v in (states or {}).items()}
    except Exception:
        log.debug("no replica states from Ray Serve", exc_info=True)
        return {}
