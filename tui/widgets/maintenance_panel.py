"""The KV reclaim job: when it runs next, whether it keeps time, and its last sweeps."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.formatting import clock_time
from tui.models import Job, ReclaimRun

SHOWN_RUNS = 3


class MaintenancePanel(Widget):
    job: reactive[Job | None] = reactive(None)
    runs: reactive[tuple[ReclaimRun, ...]] = reactive(())

    def __init__(
        self, run_key: str | None, *, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.run_key = run_key

    def on_mount(self) -> None:
        self.border_title = "Maintenance"
        if self.run_key:
            self.border_subtitle = f"{self.run_key} sweep now"

    def render(self) -> Content:
        job = self.job
        if job is None:
            head = Content.styled("no reclaim job reported", "$text-muted")
        else:
            every = f"every {job.interval_s:g}s" if job.interval_s is not None else ""
            head = Content.assemble(
                (job.id, "bold"),
                f" {every}  next ",
                (clock_time(job.next_run_at), "bold"),
                "  ",
                ("on time", "$text-success") if job.on_time else ("LATE", "bold $text-error"),
            )
        lines = [head]
        for run in self.runs[:SHOWN_RUNS]:
            outcome = (
                ("ok", "$text-success")
                if run.outcome == "ok"
                else (f"error {run.error or ''}".strip(), "$text-error")
            )
            lines.append(
                Content.assemble(
                    f"{clock_time(run.at)} {run.trigger[:5]:5} ",
                    outcome,
                    f" freed {run.freed} evicted {run.evicted} {run.free_before}→{run.free_after}",
                    (" breach", "$text-warning") if run.reserve_breached else "",
                )
            )
        if not self.runs:
            lines.append(Content.styled("no sweeps yet", "$text-muted"))
        return Content("\n").join(lines)
