"""Routing by the router's memory alone (a 2-replica server of its own, ``--prefix-probe-timeout-s
0``: no replica is asked what it caches): a long shared prefix still lands on the replica it was
first sent to, which is the one caching it. This is what stands in for a replica whose cache probe
answers late on a loaded machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.control.support import ServerProcess
from tests.fleet.conftest import fleet_server_process
from tests.fleet.support import served_by

if TYPE_CHECKING:
    from control.fleet.local_ray import RayAccess


@pytest.fixture(scope="module")
def unprobed(
    ray_instance: RayAccess, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    server: ServerProcess = fleet_server_process(
        ray_instance,
        tiny_model_dir,
        tmp_path_factory.mktemp("unprobed-fleet"),
        "--ray-app-name",
        "unprobed-fleet",
        "--prefix-probe-timeout-s",
        "0",
    )
    try:
        with server.client() as http:
            yield http
    finally:
        server.stop()


def test_without_a_probe_a_shared_prefix_follows_its_first_request(
    unprobed: httpx.Client,
) -> None:
    for start in (10, 300, 600):
        prefix = list(range(start, start + 96))  # six full blocks of 16
        home = served_by(unprobed, [*prefix, 1])
        for tail in (2, 3, 4):
            assert served_by(unprobed, [*prefix, tail]) == home
