"""``/metrics`` with a fleet: every replica's engine figures under the same names as a single
engine's, with a ``replica`` label (latencies, refusals and policy metrics stay the control
plane's own, fleet-wide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from control.metrics import ControlMetrics, EngineCollector
from serving.snapshot import EngineSnapshot


class FleetCollector(Collector):
    def __init__(self, snapshots: Callable[[], dict[str, EngineSnapshot]]) -> None:
        self._snapshots = snapshots

    def refresh(self, latest: Callable[[], EngineSnapshot | None]) -> None:
        """Nothing to read before a scrape: ``collect`` asks each replica for its own (the
        fleet's summed snapshot would be a second fan-out to every replica, unused)."""

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for replica, snapshot in sorted(self._snapshots().items()):
            one = EngineCollector()
            one.snapshot = snapshot
            for family in one.collect():
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    labels = {**sample.labels, "replica": replica}
                    into.add_sample(sample.name, labels, sample.value)
        yield from merged.values()


def install(metrics: ControlMetrics, snapshots: Callable[[], dict[str, EngineSnapshot]]) -> None:
    """Replace the single engine's collector by the fleet's."""
    metrics.registry.unregister(metrics.engine)
    # the fleet's collector stands where the engine's stood (the same render() contract)
    metrics.engine = FleetCollector(snapshots)  # type: ignore[assignment]
    metrics.registry.register(metrics.engine)
