"""A call for one replica that left after it was made (killed, drained) fails at once, and
the router goes on routing: before, ``FleetRouter`` answered such a call with no candidates,
Ray asked again with no await in between, and every request through that router hung."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.fleet.support import state

if TYPE_CHECKING:
    from control.fleet.local_ray import RayAccess


def test_a_call_for_a_replica_that_is_gone_fails_at_once_and_routing_goes_on(
    fleet: httpx.Client, ray_instance: RayAccess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from control.fleet.fleet import DEPLOYMENT
    from control.fleet.local_ray import connect

    live = [r["replica"] for r in state(fleet)["replicas"] if r["up"]]
    assert live
    for key, value in ray_instance.env.items():
        monkeypatch.setenv(key, value)  # connect sets them; monkeypatch restores them after
    connect(ray_instance.address, env=ray_instance.env)  # its own handle, its own FleetRouter
    import ray
    from ray import serve

    try:
        handle = serve.get_deployment_handle(DEPLOYMENT, app_name="servedeck")
        started = time.monotonic()
        with pytest.raises(Exception, match="replica no-such-replica is gone"):
            handle.options(method_name="report").remote(replica="no-such-replica").result(
                timeout_s=20
            )
        assert time.monotonic() - started < 10
        report = handle.options(method_name="report").remote(replica=live[0]).result(timeout_s=20)
        assert report.replica == live[0]  # the router's loop is free: the next call is routed
    finally:
        ray.shutdown()
