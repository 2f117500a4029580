"""The policy version in force, and the one way a stored version is put in force.

The policy store calls ``InForce.apply`` for every version it writes (and its reconcile job for
one still pending): the engine service takes the settings at its step boundary, then the sweep
is rescheduled and the metrics relabelled. Versions are applied one at a time.
"""

from __future__ import annotations

import logging
import threading

from control.jobs.maintenance import Maintenance
from control.metrics import ControlMetrics
from control.policy.schemas import PolicySettings
from control.service.protocol import EngineService

log = logging.getLogger(__name__)


class InForce:
    def __init__(
        self,
        service: EngineService,
        maintenance: Maintenance,
        metrics: ControlMetrics,
        version: int,
        settings: PolicySettings,
        apply_timeout_s: float,
    ) -> None:
        self._service = service
        self._maintenance = maintenance
        self._metrics = metrics
        self._version = version
        self._settings = settings
        self.apply_timeout_s = apply_timeout_s
        """How long one apply waits for the engine by default (``--policy-apply-timeout-s``)."""
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        """The version in force (a newer one may still be pending)."""
        return self._version

    @property
    def settings(self) -> PolicySettings:
        return self._settings

    def apply(self, settings: PolicySettings, version: int, timeout: float | None = None) -> None:
        """Put a stored version into force: policy and reserve at the next step boundary,
        the sweep rescheduled, the metrics relabelled. ``TimeoutError`` when the engine has
        not taken it within ``timeout`` (default ``apply_timeout_s``): a retry of the same
        version waits on the commands already sent."""
        timeout = self.apply_timeout_s if timeout is None else timeout
        with self._lock:
            self._service.apply(settings, version, timeout)
            self._settings, self._version = settings, version
        self._maintenance.reschedule(settings.reclaim_interval_s)
        self._metrics.set_policy(settings.policy.name, version)
        log.info("policy version %d in force: %s", version, settings.model_dump_json())
