"""What the guardrail screen draws, as pure functions of the API's shapes: its config, bounds
and status panels, one decision's table row and its detail."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.content import Content

from tui.formatting import LEVEL_STYLES, Level, clock_time, level, policy_text, seconds
from tui.models import Decision, Figures, GuardrailConfig, GuardrailStatus, PolicySettings

MODE_STYLES = {
    "on": "bold $text-success",
    "shadow": "bold $text-warning",
    "off": "bold $text-error",
}
MODE_MEANING = {
    "on": "applies its changes",
    "shadow": "records only",
    "off": "kill switch: changes nothing",
}
OUTCOME_STYLES = {
    "applied": "bold green",
    "shadow": "yellow",
    "window_active": "yellow",
    "rate_limited": "yellow",
    "conflict": "red",
    "failed": "bold red",
}
ERROR_NAMES = {"ttft_p99_s": "TTFT p99", "tpot_p99_s": "TPOT p99", "output_tokens_per_s": "tok/s"}
TABLE_STYLES: dict[Level, str] = {"ok": "green", "warn": "yellow", "crit": "red", "none": "dim"}
"""``LEVEL_STYLES`` for table cells (rich text, which knows no theme variables)."""


def margin_level(margin: float | None) -> str:
    """Red when an objective is missed (negative), yellow within 10 % of one."""
    if margin is None:
        return LEVEL_STYLES["none"]
    return LEVEL_STYLES["crit" if margin < 0 else "warn" if margin < 0.1 else "ok"]


def margin_text(margin: float | None) -> str:
    return "—" if margin is None else f"{margin * 100:+.0f}%"


def error_level(ratio: float) -> Level:
    """How far observed ÷ predicted is from exact (1.0): within 25 % ok, 50 % warn."""
    return level(abs(ratio - 1.0), 0.25, 0.5)


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def mode_content(mode: str) -> Content:
    return Content.assemble(
        (mode.upper(), MODE_STYLES.get(mode, "bold")), f" ({MODE_MEANING.get(mode, mode)})"
    )


def config_panel(config: GuardrailConfig) -> Content:
    """The objectives, then how often and how far it may act (the mode is in the title)."""
    goals = config.objectives
    lines = []
    if goals.ttft_p99_s is not None:
        lines.append(Content.assemble("TTFT p99 ≤ ", (seconds(goals.ttft_p99_s), "bold")))
    if goals.tpot_p99_s is not None:
        lines.append(Content.assemble("TPOT p99 ≤ ", (seconds(goals.tpot_p99_s), "bold")))
    if goals.goodput_min_rps is not None:
        lines.append(Content.assemble("goodput ≥ ", (f"{goals.goodput_min_rps:g} req/s", "bold")))
    lines += [
        Content.styled(
            f"every {config.interval_s or 0:g}s, over {config.window_s or 0:g}s", "$text-muted"
        ),
        Content.styled(f"≤ 1 change per {config.min_change_interval_s or 0:g}s", "$text-muted"),
        Content.styled(f"hysteresis {(config.hysteresis or 0) * 100:g}%", "$text-muted"),
        Content.styled(f"≤ {config.max_candidates or 0} candidates", "$text-muted"),
    ]
    return Content("\n").join(lines)


def bounds_panel(config: GuardrailConfig) -> Content:
    bounds = config.bounds
    lines = [Content.assemble("policies ", (", ".join(bounds.policies) or "—", "bold"))]
    for knob, span in bounds.knobs().items():
        if span is None:
            lines.append(Content.styled(f"{knob} not moved", "$text-muted"))
        else:
            lines.append(Content.assemble(f"{knob} ", (f"{span.min:g} – {span.max:g}", "bold")))
    return Content("\n").join(lines)


def figures_text(figures: Figures | None) -> str:
    if figures is None:
        return "—"
    return (
        f"TTFT p99 {seconds(figures.ttft_p99_s)} · TPOT p99 {seconds(figures.tpot_p99_s)}"
        f" · {rate(figures.output_tokens_per_s)} tok/s"
    )


def status_panel(status: GuardrailStatus) -> Content:
    if status.active:
        head = Content.styled("● evaluating", "bold $text-success")
    else:
        # the server's reason says it whole ("off: the server has no cost model (...)")
        head = Content.styled(f"○ {status.reason or 'not evaluating'}", "bold $text-warning")
    correction = "—" if status.correction is None else f"×{status.correction:.2f}"
    observed = status.observed
    lines = [
        head,
        Content(f"cost model {status.cost_model or '—'}"),
        Content.assemble(
            f"correction {correction}  margin ",
            (margin_text(status.margin), f"bold {margin_level(status.margin)}"),
            (" objective missed", margin_level(status.margin)) if (status.margin or 0) < 0 else "",
        ),
    ]
    if observed is not None:
        span = f"{clock_time(observed.since)}–{clock_time(observed.until)}"
        lines += [
            Content(f"observed {observed.requests} requests {span}"),
            Content(f"  {figures_text(observed)}"),
        ]
        if observed.goodput_rps is not None:
            lines.append(Content(f"  goodput {observed.goodput_rps:g} req/s"))
    lines.append(
        Content.styled(
            f"evaluated {clock_time(status.last_evaluation_at)}"
            f" · changed {clock_time(status.last_change_at)}",
            "$text-muted",
        )
    )
    if status.window_active is not None:
        lines.append(
            Content.styled(
                f"schedule {status.window_active}'s window is in force: it wins", "$text-warning"
            )
        )
    return Content("\n").join(lines)


def _versus(
    predicted: float | None,
    observed: float | None,
    error: float | None,
    fmt: Callable[[float | None], str],
) -> Text:
    """``410 ms → 460 ms ×1.12``: predicted, observed after (… until measured), the error."""
    text = Text(f"{fmt(predicted)} → {fmt(observed) if observed is not None else '…'}")
    if error is not None:
        text.append(f" ×{error:.2f}", TABLE_STYLES[error_level(error)])
    return text


def in_force_after(decision: Decision) -> Figures | None:
    """The prediction the observed figures after a decision are compared with: the chosen
    setting's when it was applied, else the setting that stayed."""
    return decision.predicted if decision.outcome == "applied" else decision.predicted_current


def decision_cells(decision: Decision) -> list[Text]:
    predicted = in_force_after(decision) or Figures()
    after = decision.observed_after or Figures()
    errors = decision.prediction_error or {}
    return [
        Text(str(decision.id), justify="right"),
        Text(clock_time(decision.at)),
        Text(decision.outcome, style=OUTCOME_STYLES.get(decision.outcome, "")),
        Text("—" if decision.version is None else f"v{decision.version}"),
        _versus(predicted.ttft_p99_s, after.ttft_p99_s, errors.get("ttft_p99_s"), seconds),
        _versus(predicted.tpot_p99_s, after.tpot_p99_s, errors.get("tpot_p99_s"), seconds),
        _versus(
            predicted.output_tokens_per_s,
            after.output_tokens_per_s,
            errors.get("output_tokens_per_s"),
            rate,
        ),
        Text(decision.reason, overflow="ellipsis", no_wrap=True),
    ]


def setting_text(settings: PolicySettings | None) -> str:
    if settings is None:
        return "—"
    return policy_text(settings.policy.name, settings.policy.params, settings.memory_reserve)


def decision_detail(decision: Decision) -> Content:
    stored = f" as version {decision.version}" if decision.version is not None else ""
    errors = decision.prediction_error
    kept = "chosen" if decision.outcome == "applied" else "kept"
    error = Content(f"observed after ÷ predicted ({kept} setting) ")
    if errors:
        for key, ratio in errors.items():
            style = LEVEL_STYLES[error_level(ratio)]
            error += Content.assemble(f"{ERROR_NAMES.get(key, key)} ", (f"×{ratio:.2f}  ", style))
    elif decision.observed_after is not None:
        error += Content.styled("none: no request finished in the interval after", "$text-muted")
    else:
        error += Content.styled("not measured yet (after the next interval)", "$text-muted")
    lines = [
        Content.assemble(
            (f"decision {decision.id}", "bold"),
            f" at {clock_time(decision.at)} · mode {decision.mode} · ",
            (f"{decision.outcome}{stored}", OUTCOME_STYLES.get(decision.outcome, "")),
        ),
        Content(decision.reason),
        Content(f"setting {setting_text(decision.current)} → {setting_text(decision.chosen)}"),
        Content(f"predicted now    {figures_text(decision.predicted_current)}"),
        Content(f"predicted chosen {figures_text(decision.predicted)}"),
        Content(f"observed before  {figures_text(decision.observed_before)}"),
        Content(f"observed after   {figures_text(decision.observed_after)}"),
        error,
        Content.styled(
            f"{len(decision.candidates)} candidates on {decision.trace_requests} recorded requests,"
            f" correction ×{decision.correction or 1:.2f}",
            "$text-muted",
        ),
    ]
    return Content("\n").join(lines)
