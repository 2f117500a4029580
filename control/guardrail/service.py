"""The SLO guardrail: its stored config, its status, its decisions, and the job.

``tick`` runs every second on the maintenance scheduler and stays cheap: it reads the config
from memory (loaded once, replaced on PUT) and does nothing in mode ``off`` or without a cost
model. When ``interval_s`` has passed it starts one evaluation on a thread of its own, so a
simulation (bounded by the predictor's timeout) never holds a scheduler thread or overlaps
another evaluation. The evaluation's order is ``evaluate``'s and docs/api.md's ("Guardrail").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import Engine
from sqlmodel import Session

from control.arrivals import ArrivalLog
from control.guardrail import plan, rows
from control.guardrail.plan import Choice
from control.guardrail.prediction import PredictionUnavailable, Predictor
from control.guardrail.schemas import (
    DecisionList,
    DecisionView,
    GuardrailConfig,
    GuardrailStatus,
    GuardrailUpdate,
    GuardrailView,
    ObservedFigures,
    Outcome,
)
from control.metrics import ControlMetrics
from control.models import PolicyVersion, utcnow
from control.policy.checks import SettingsInvalid
from control.policy.schemas import PolicySettings, PolicyUpdate
from control.policy.store import PolicyStore, VersionConflict
from control.schedules.store import Schedules

log = logging.getLogger(__name__)

JOB_ID = "guardrail"
TICK_S = 1.0
MIN_REQUESTS = 5
"""Finished requests in the window below which the guardrail does not evaluate."""
KILL_SWITCH = "off: mode off (the kill switch)"
NO_COST_MODEL = "off: the server has no cost model (start it with --cost-model)"
CLOSE_WAIT_S = 1.0


def no_cost_model(command: str) -> str:
    """The status without a cost model: ``NO_COST_MODEL`` and the command that makes one (the
    server finds the calibration it stores at its next start)."""
    return f"{NO_COST_MODEL[:-1]}, or make one with `{command}` and restart it)"


@dataclass(frozen=True, slots=True)
class _Seen:
    """What the last evaluation found (the status' figures)."""

    note: str | None = None
    correction: float | None = None
    margin: float | None = None
    observed: ObservedFigures | None = None
    at: datetime | None = None


class Guardrail:
    def __init__(
        self,
        db: Engine,
        store: PolicyStore,
        predictor: Predictor,
        arrivals: ArrivalLog,
        schedules: Schedules,
        metrics: ControlMetrics,
        clock: Callable[[], datetime] = utcnow,
        engine_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._store = store
        self._predictor = predictor
        self._arrivals = arrivals
        self._schedules = schedules
        self._metrics = metrics
        self._clock = clock
        self._engine_clock = engine_clock
        self._stored: rows.StoredConfig | None = None
        self._seen = _Seen()
        self._lock = threading.Lock()
        self._deciding = threading.Lock()
        """Held while a proposal is acted on and while a config is stored."""
        self._last_run: float | None = None
        self._worker: threading.Thread | None = None
        self._closed = False

    # -- config ----------------------------------------------------------------------------

    def _current(self) -> rows.StoredConfig:
        """The config in force, from memory (one database read at the first call)."""
        with self._lock:
            if self._stored is None:
                with Session(self._db) as session:
                    self._stored = rows.newest_config(session)
            return self._stored

    def view(self, session: Session) -> GuardrailView:
        stored = self._current()
        return GuardrailView(
            config=stored.config,
            revision=stored.revision,
            actor=stored.actor,
            reason=stored.reason,
            updated_at=stored.updated_at,
            status=self._status(session, stored.config),
        )

    def _status(self, session: Session, config: GuardrailConfig) -> GuardrailStatus:
        seen = self._seen
        reason: str | None
        if config.mode == "off":
            active, reason = False, KILL_SWITCH
        elif not self._predictor.available:
            active, reason = False, no_cost_model(self._predictor.command)
        else:
            active, reason = True, seen.note
        return GuardrailStatus(
            active=active,
            reason=reason,
            cost_model=self._predictor.name,
            correction=seen.correction,
            margin=seen.margin,
            observed=seen.observed,
            last_evaluation_at=seen.at,
            last_change_at=rows.last_change(session),
            window_active=self._schedules.in_force(),
        )

    def put(self, session: Session, update: GuardrailUpdate, actor: str) -> GuardrailView:
        """Store the whole config as a new revision (audited) and put it in force; bounds
        above the engine caps or contradicting the allowed policies raise ``SettingsInvalid``
        naming them. Once it answers, no evaluation under the old config acts any more (the
        kill switch holds at once)."""
        if errors := rows.contradictions(update) + rows.cap_errors(update, self._store.limits):
            raise SettingsInvalid(errors)
        row = rows.setting_row(update, actor)
        with self._deciding:
            session.add(row)
            session.commit()
            session.refresh(row)
            with self._lock:
                self._stored = rows.stored(row)
                self._last_run = None  # the new config is evaluated at the next tick
        self._metrics.set_guardrail_mode(update.mode)
        log.info("guardrail config %d by %s: mode %s", row.id, actor, update.mode)
        return self.view(session)

    def decisions(self, session: Session, limit: int) -> DecisionList:
        return DecisionList(items=rows.decisions(session, limit))

    # -- the job ---------------------------------------------------------------------------

    def tick(self) -> None:
        """The job (every ``TICK_S``): start an evaluation when one is due. Never raises."""
        try:
            stored = self._current()
            config = stored.config
            self._metrics.set_guardrail_mode(config.mode)
            if config.mode == "off" or self._closed or not self._predictor.available:
                return
            now = self._engine_clock()
            with self._lock:
                if self._worker is not None and self._worker.is_alive():
                    return
                if self._last_run is not None and now - self._last_run < config.interval_s:
                    return
                self._last_run = now
                self._worker = threading.Thread(
                    target=self._run, args=(stored,), name="guardrail", daemon=True
                )
                self._worker.start()
        except Exception:
            log.exception("guardrail tick failed")

    def _run(self, stored: rows.StoredConfig) -> None:
        try:
            self.evaluate(stored)
        except Exception:
            log.exception("guardrail evaluation failed")

    def close(self) -> None:
        """No evaluation starts any more; one in flight gets ``CLOSE_WAIT_S`` to end."""
        self._closed = True
        worker = self._worker
        if worker is not None:
            worker.join(CLOSE_WAIT_S)

    def evaluate(self, stored: rows.StoredConfig) -> DecisionView | None:
        """One evaluation under ``stored``: the figures observed over ``window_s`` (and the
        ``observed_after`` of earlier decisions); under ``MIN_REQUESTS`` nothing more; every
        candidate simulated with the cost model corrected by the engine's recent steps
        (``Predictor.correction``: the dry run's too; the last one kept while no step is seen)
        (the simulation call may take ``interval_s``, at least the dry run's
        timeout: a full trace of many candidates takes tens of seconds); ``plan.choose``; a
        proposal becomes one decision row, its outcome by ``_act``'s precedence. A proposal
        made while the config changed is dropped."""
        config, objectives = stored.config, stored.config.objectives
        at, now = self._clock(), self._engine_clock()
        with Session(self._db) as session:
            rows.fill_after(session, self._arrivals, objectives, at, now)
            newest = self._store.newest(session)
            current = self._store.effective(newest)
            finished = self._arrivals.finished(now - config.window_s, now)
            since = at - timedelta(seconds=config.window_s)
            observed = plan.observed_figures(finished, since, at, config.window_s, objectives)
            seen = _Seen(
                None, self._seen.correction, plan.margin(observed, objectives), observed, at
            )
            self._note(seen)
            if observed.requests < MIN_REQUESTS:
                window = f"{config.window_s:g} s"
                note = f"waiting: {observed.requests} requests finished in the last {window}"
                self._note(replace(seen, note=f"{note} ({MIN_REQUESTS} needed)"))
                return None
            # The requests the observed figures are of: the load the candidates must carry.
            trace = self._arrivals.trace(self._predictor.max_requests, now - config.window_s)
            timeout = max(self._predictor.timeout_s, config.interval_s)
            try:
                # the one correction: the engine's recent steps against the model's prediction
                found = self._predictor.correction()
                correction = (seen.correction or 1.0) if found is None else found
                settings = plan.candidates(current, config, self._store.limits)
                predicted = self._predictor.evaluate(
                    trace, settings, objectives, correction, timeout
                )
            except PredictionUnavailable as exc:
                self._note(replace(seen, note=str(exc)))
                return None
            self._note(replace(seen, correction=correction))
            judged = [
                plan.assess(s, p, objectives) for s, p in zip(settings, predicted, strict=True)
            ]
            choice = plan.choose(config, judged[0], judged[1:])
            if choice is None:
                return None
            with self._deciding:
                if self._current().revision != stored.revision:
                    return None  # a PUT came in meanwhile: the next tick evaluates its config
                outcome, reason, version = self._act(session, config, newest, choice, at)
                row = rows.decision_row(
                    config, at, outcome, reason, judged, choice, observed, correction, len(trace)
                )
                row.version = version
                session.add(row)
                session.commit()
                session.refresh(row)
        self._metrics.count_guardrail_decision(outcome)
        log.info("guardrail decision %d: %s: %s", row.id, outcome, reason)
        return rows.view(row)

    def _note(self, seen: _Seen) -> None:
        self._seen = seen
        self._metrics.set_guardrail_figures(seen.margin, seen.correction)

    def _act(
        self,
        session: Session,
        config: GuardrailConfig,
        newest: PolicyVersion,
        choice: Choice,
        at: datetime,
    ) -> tuple[Outcome, str, int | None]:
        """What becomes of a proposal, by precedence; (outcome, reason, version stored)."""
        window = self._schedules.in_force(at)
        if window is not None:
            why = f"not applied: schedule {window}'s window is in force (a window wins)"
            return "window_active", f"{why}; {choice.reason}", None
        if config.mode == "shadow":
            return "shadow", f"shadow mode: recorded, not applied; {choice.reason}", None
        last = rows.last_change(session)
        if last is not None and (ago := (at - last).total_seconds()) < config.min_change_interval_s:
            why = (
                f"rate limit: the guardrail changed the setting {ago:.0f} s ago "
                f"(at most once per {config.min_change_interval_s:g} s)"
            )
            return "rate_limited", f"{why}; {choice.reason}", None
        chosen: PolicySettings = choice.candidate.settings
        update = PolicyUpdate(
            policy=chosen.policy, memory_reserve=chosen.memory_reserve, reason=choice.reason
        )
        try:
            result = self._store.update(session, update, rows.ACTOR, if_match=newest.version)
        except VersionConflict as exc:
            return "conflict", f"not applied: {exc} (next evaluation); {choice.reason}", None
        except (SettingsInvalid, ValueError) as exc:
            log.warning("guardrail proposal refused: %s", exc)
            return "failed", f"refused: {exc}; {choice.reason}", None
        if result.status is not None and result.status.state == "failed":
            why = f"version {result.version} failed: {result.status.state_reason}"
            return "failed", f"{why}; {choice.reason}", result.version
        return "applied", choice.reason, result.version
