"""Fleet tests: one Ray instance per test session (loopback, token auth, usage stats off) and
one 2-replica server on it (tiny model, one thread per replica).

Skipped when ray is not importable, except with ``CI=true`` and ``SERVEDECK_REQUIRE_RAY=1``,
where a missing ray fails them."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.control.support import TOKEN, ServerProcess

if TYPE_CHECKING:
    from control.fleet.local_ray import RayAccess

REPLICAS = 2


def ray_required() -> bool:
    return os.environ.get("CI") == "true" and os.environ.get("SERVEDECK_REQUIRE_RAY") == "1"


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[RayAccess]:
    """The session's Ray instance: its address and what a process joining it needs (its own
    token's path), so that nothing depends on ``~/.ray``."""
    if importlib.util.find_spec("ray") is None:
        if ray_required():
            pytest.fail("ray is required here (CI=true, SERVEDECK_REQUIRE_RAY=1)")
        pytest.skip("ray is not installed (pip install 'servedeck[distributed]')")
    from control.fleet.local_ray import LocalRay, connect

    local = LocalRay(num_cpus=4)
    try:
        connect(local.address, local)  # until it answers; then this process leaves it
        import ray

        ray.shutdown()
        yield local.access
    finally:
        local.stop()


def fleet_server_process(
    ray: RayAccess, model_dir: Path, workdir: Path, *extra: str
) -> ServerProcess:
    """A control plane with ``REPLICAS`` replicas on the session's Ray instance (``extra``:
    more flags, e.g. its own ``--ray-app-name``); started."""
    server = ServerProcess(
        model_dir,
        workdir,
        [
            "--admin-token",
            TOKEN,
            "--replicas",
            str(REPLICAS),
            "--ray-address",
            ray.address,
            "--served-model-name",
            "tiny",
            "--reclaim-interval-s",
            "1",
            # A rolling restart's streams must finish inside the drain: 600 tokens take ~5 s
            # here, and past 30 s (the default) on a 2-core machine loaded 5 times over.
            "--fleet-drain-timeout-s",
            "120",
            *extra,
        ],
        dict(ray.env),
    )
    server.start()
    return server


@pytest.fixture(scope="session")
def fleet_server(
    ray_instance: RayAccess, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = fleet_server_process(
        ray_instance, tiny_model_dir, tmp_path_factory.mktemp("fleet-server")
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fleet(fleet_server: ServerProcess) -> Iterator[httpx.Client]:
    with fleet_server.client() as http:
        yield http
