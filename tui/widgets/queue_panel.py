"""Queue depths and what the scheduler is doing with them; how many running requests a
grammar constrains, where any is (issue 28)."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from tui.models import AdminState


class QueuePanel(Widget):
    state: reactive[AdminState | None] = reactive(None)

    def on_mount(self) -> None:
        self.border_title = "Queue"

    def render(self) -> Content:
        state = self.state
        if state is None:
            return Content.styled("waiting for the server…", "$text-muted")
        sched = state.scheduler
        totals = state.totals
        params = sched.get("params") or state.policy.params
        draining = state.draining_to
        constrained = sum(r.constrained and r.state == "running" for r in state.requests)
        lines = [
            Content.assemble(
                "waiting ",
                (str(state.queue.waiting), "bold"),
                "  running ",
                (str(state.queue.running), "bold"),
                *(("  constrained ", (str(constrained), "bold")) if constrained else ()),
                ("" if draining is None else f"  draining to {draining}", "bold $warning"),
            ),
            Content.assemble(
                "preempted ",
                (str(sched.get("preemptions", totals.get("preemptions", 0))), "bold"),
                "  finished ",
                (str(totals.get("requests_finished", "—")), "bold"),
            ),
            Content.assemble(
                "mode ",
                (str(sched.get("mode") or "—"), "bold"),
                "  reserve ",
                (f"{state.memory_reserve:.0%}", "bold"),
            ),
            Content.styled(
                " ".join(f"{k}={'off' if v is None else v}" for k, v in params.items())
                or "default params",
                "$text-muted",
            ),
        ]
        return Content("\n").join(lines)
