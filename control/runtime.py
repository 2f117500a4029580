"""What one server process holds once the model has loaded: the engine service and every part
of the control plane around it, built once, in dependency order, by ``control.compose``.

``Runtime`` is finished when it is made: no part is set or swapped afterwards. What changes
while it serves lives inside its parts (the version in force in ``in_force``, the versions in
the store's database).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from control.arrivals import ArrivalLog
from control.chat.render import ChatRenderer
from control.guardrail.prediction import Predictor
from control.guardrail.service import Guardrail
from control.jobs.maintenance import Maintenance
from control.jobs.watchdog import StallWatchdog
from control.metrics import ControlMetrics
from control.policy.in_force import InForce
from control.policy.store import PolicyStore
from control.requests_text import TextJournal
from control.schedules.store import Schedules
from control.service.protocol import EngineService, TestingHooks

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05


@dataclass(frozen=True, eq=False)
class Runtime:
    model_name: str
    """The name ``/v1/models`` lists and every answer carries."""
    service: EngineService
    in_force: InForce
    store: PolicyStore
    maintenance: Maintenance
    metrics: ControlMetrics
    arrivals: ArrivalLog
    """Recent arrivals (times and lengths), fed from the engine's finished hook."""
    predictor: Predictor
    schedules: Schedules
    guardrail: Guardrail
    renderer: ChatRenderer
    """The chat template's worker processes."""
    watchdog: StallWatchdog
    text: TextJournal | None = None
    """Recent requests' prompt and output text (``--expose-text`` only; None: none is kept)."""
    testing: TestingHooks | None = None
    """The test hooks (``SERVEDECK_TESTING=1`` with one local engine only)."""
    created: int = field(default_factory=lambda: int(time.time()))

    def wait_idle(self, timeout: float) -> bool:
        """Until the engine holds no request (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        while self.service.in_flight():
            if time.monotonic() >= deadline:
                return False
            time.sleep(DRAIN_POLL_S)
        return True

    def close(self) -> None:
        self.maintenance.shutdown()
        self.guardrail.close()
        self.service.close()
        self.predictor.close()
        self.renderer.close()
