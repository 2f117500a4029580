"""The Ray Serve application of the engine replicas: the deployment's options (routing,
health checks, draining, rolling updates, scaling) and its arguments (imports ray at call
time)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from control.core.config import Settings
from control.fleet.replica import EngineReplica
from control.fleet.score import ROUTING_STATS_PERIOD_S
from control.policy.schemas import PolicySettings
from engine.config import EngineConfig

if TYPE_CHECKING:
    from ray.serve import Application

DEPLOYMENT = "engine"
MAX_ONGOING_PER_REPLICA = 1024
"""Ray Serve's own cap per replica; the engine's waiting queue (429) is the real bound."""
DRAIN_POLL_S = 0.5
"""How often a draining replica checks whether its requests are done."""
ROLL_FRACTION = 0.01
"""Ray Serve's ``rolling_update_percentage``: rounded down with a floor of one replica, so a
rolling update replaces one replica at a time in any fleet under 100."""


def application(
    settings: Settings, config: EngineConfig, in_force: PolicySettings, version: int
) -> Application:
    """The Ray Serve application of the replicas, built with the policy version in force.

    Deploying it again is a rolling update (Ray Serve gives every deploy a new code version):
    one replica at a time (``ROLL_FRACTION``) stops taking requests, drains them for up to
    ``fleet_drain_timeout_s`` (then Ray ends it), and is replaced; the next one goes once the
    new one passed its health check."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from control.fleet.router import FleetRouter

    # Any: mypy reads Ray's RequestRouterConfig (pydantic-compat fields) as taking dicts only
    router: dict[str, Any] = {
        "request_router_class": FleetRouter,
        "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
        "request_routing_stats_timeout_s": 5,
    }
    rolling = serve.deployment(rolling_update_percentage=ROLL_FRACTION)  # not in options()
    deployment = rolling(EngineReplica).options(
        name=DEPLOYMENT,
        max_ongoing_requests=MAX_ONGOING_PER_REPLICA,
        ray_actor_options={
            "num_cpus": settings.num_threads or 1,
            "num_gpus": 1 if config.device.startswith("cuda") else 0,
        },
        request_router_config=RequestRouterConfig(**router),
        health_check_period_s=1,
        graceful_shutdown_timeout_s=settings.fleet_drain_timeout_s,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        **scaling(settings),
    )
    return deployment.bind(config, in_force.model_dump(mode="json"), version)


def scaling(settings: Settings) -> dict[str, Any]:  # Any: Ray's options() keyword arguments
    """A fixed number of replicas, or Ray Serve's autoscaling by ongoing requests."""
    if settings.max_replicas is None:
        return {"num_replicas": settings.replicas}
    return {
        "autoscaling_config": {
            "min_replicas": settings.min_replicas or 1,
            "initial_replicas": settings.replicas,
            "max_replicas": settings.max_replicas,
            "target_ongoing_requests": settings.target_ongoing_requests,
        }
    }
