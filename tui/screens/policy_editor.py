"""Change the active policy safely: a form built from the server's schema, client-side bounds,
a server dry run showing the diff, confirmation with a reason, and ``If-Match`` on apply."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Button, Footer, Input, Label, Select, Static

from tui.client import ApiError, ClientError, Conflict
from tui.models import FieldChange, PolicySchema, PolicyUpdateResult, PolicyView
from tui.screens.base import ConsoleScreen
from tui.screens.confirm import ConfirmScreen
from tui.widgets.policy_form import PolicyForm
from tui.widgets.schema_field import FieldSpec, SchemaField

ENGINE_FIELDS = (
    ("memory_reserve", "Memory reserve", "Fraction of KV blocks that admission must leave free."),
    ("reclaim_interval_s", "Reclaim interval s", "Seconds between scheduled KV reclaim sweeps."),
)


def diff_content(diff: list[FieldChange]) -> Content:
    if not diff:
        return Content.styled("no changes", "$text-muted")
    width = max(len(c.field) for c in diff)
    return Content("\n").join(
        Content.assemble(
            (f"{c.field:<{width}}  ", "bold"),
            (_show(c.before), "$text-error"),
            " → ",
            (_show(c.after), "$text-success"),
        )
        for c in diff
    )


def _show(value: Any) -> str:
    return "default" if value is None else str(value)


PREDICTED = (
    ("output tok/s", "output_tokens_per_s", 1.0, "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_s", 1000.0, "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_s", 1000.0, "{:.0f}"),
    ("TPOT p50 ms", "tpot_p50_s", 1000.0, "{:.1f}"),
)
"""The dry run's predicted figures: label, field, scale, format."""


def prediction_content(prediction: dict[str, Any] | None) -> Content:
    """The server's ``prediction`` of a dry run: current vs candidate, stated as a prediction
    with its model; or why there is none. Nothing for a server without predictions."""
    if not prediction:
        return Content("")
    if not prediction.get("available"):
        return Content.styled(str(prediction.get("reason") or "no prediction"), "$text-warning")
    current, candidate = prediction.get("current") or {}, prediction.get("candidate") or {}

    def figure(side: dict[str, Any], field: str, scale: float, fmt: str) -> str:
        value = side.get(field)
        return "—" if value is None else fmt.format(value * scale)

    rows = [
        Content.assemble(
            (f"{label:<13}", "bold"),
            f"{figure(current, field, scale, fmt):>10}",
            (f"{figure(candidate, field, scale, fmt):>11}", "$text-success"),
        )
        for label, field, scale, fmt in PREDICTED
    ]
    return Content("\n").join(
        [
            Content.styled(str(prediction.get("statement", "")), "$text-muted"),
            Content.assemble((f"{'':<13}", "bold"), f"{'current':>10}", f"{'candidate':>11}"),
            *rows,
        ]
    )


def dry_run_content(diff: list[FieldChange], prediction: dict[str, Any] | None) -> Content:
    shown = prediction_content(prediction)
    return Content("\n\n").join([diff_content(diff), shown]) if shown else diff_content(diff)


def prediction_of(result: PolicyUpdateResult) -> dict[str, Any] | None:
    """The dry run's ``prediction`` (kept by the lenient model as an extra field)."""
    extra = result.model_extra or {}
    prediction = extra.get("prediction")
    return prediction if isinstance(prediction, dict) else None


class PolicyEditorScreen(ConsoleScreen):
    COMMAND_SCOPE = "editor"

    def __init__(self, schema: PolicySchema, view: PolicyView, read_only: bool) -> None:
        super().__init__(read_only)
        self.schema = schema
        self.view = view
        self.chosen = view.settings.policy.name
        self._message = Content("")
        self._diff: list[FieldChange] | None = None
        self._prediction: dict[str, Any] | None = None

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        view = self.view
        yield Static(self._title(), id="editor-title")
        with Horizontal(id="editor-body"):
            with VerticalScroll(id="editor-form"):
                yield Label("Policy", classes="field-title")
                yield Select(
                    [(name, name) for name in self.schema.policies],
                    value=self.chosen,
                    allow_blank=False,
                    id="policy-name",
                    compact=True,
                )
                yield self._form()
                for name, title, description in ENGINE_FIELDS:
                    bounds = getattr(self.schema, name)
                    spec = FieldSpec(
                        name=name,
                        path=name,
                        title=title,
                        kind="number",
                        minimum=bounds.minimum,
                        maximum=bounds.maximum,
                        description=description,
                    )
                    value = getattr(view.settings, name)
                    yield SchemaField(spec, value, view.sources.get(name))
                yield Label("Reason", classes="field-title", id="reason-title")
                yield Input(
                    placeholder="why (required, stored with the version)", id="reason", compact=True
                )
                yield Static("", id="reason-error", classes="field-error", markup=False)
                if not self.read_only:
                    with Horizontal(id="editor-buttons"):
                        yield Button("Dry run", id="dry-run")
                        yield Button("Apply…", id="apply", variant="warning")
                        yield Button("Close", id="close")
            with Vertical(id="editor-side"):
                effective = Static(self._effective(), id="editor-effective")
                effective.border_title = "Active now"
                yield effective
                diff = Static(
                    dry_run_content(self._diff, self._prediction) if self._diff is not None else "",
                    id="editor-diff",
                )
                diff.border_title = "Dry-run diff"
                yield diff
                yield Static(self._message, id="editor-message")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#policy-name").focus()

    def _title(self) -> Content:
        v = self.view
        by = f" · by {v.actor}" if v.actor else ""
        why = f" “{v.reason}”" if v.reason else ""
        return Content.assemble(
            ("Policy editor", "bold"),
            f" · active version {v.version}: ",
            (v.settings.policy.name, "bold"),
            by,
            why,
            f" · {v.created_at}" if v.created_at else "",
        )

    def _effective(self) -> Content:
        lines = [
            Content.assemble((name, "bold"), f" = {value} ", self._source(f"policy.params.{name}"))
            for name, value in self.view.effective_params.items()
        ]
        for name, _, _ in ENGINE_FIELDS:
            value = getattr(self.view.settings, name)
            lines.append(Content.assemble((name, "bold"), f" = {value} ", self._source(name)))
        return Content("\n").join(lines)

    def _source(self, path: str) -> Content:
        source = self.view.sources.get(path)
        return Content.styled(f"({source})", "$text-muted") if source else Content("")

    def _form(self) -> PolicyForm:
        active = self.view.settings.policy
        return PolicyForm(
            self.chosen,
            self.schema.policies.get(self.chosen, {}),
            dict(active.params) if self.chosen == active.name else {},
            self.view.sources if self.chosen == active.name else {},
            self.schema.engine_limits,
        )

    async def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id != "policy-name" or event.value == self.chosen:
            return
        self.chosen = str(event.value)
        await self.query_one(PolicyForm).remove()
        await self.query_one("#editor-form").mount(self._form(), after="#policy-name")

    # -- messages -----------------------------------------------------------------------

    def say(self, text: str, style: str = "") -> None:
        self._message = Content.styled(text, style)
        if self.is_mounted:
            self.query_one("#editor-message", Static).update(self._message)

    def show_diff(
        self, diff: list[FieldChange] | None, prediction: dict[str, Any] | None = None
    ) -> None:
        self._diff, self._prediction = diff, prediction
        self.query_one("#editor-diff", Static).update(
            dry_run_content(diff, prediction) if diff is not None else ""
        )

    def _reason_error(self, message: str) -> None:
        error = self.query_one("#reason-error", Static)
        error.update(message)
        error.set_class(bool(message), "-shown")

    def _clear_errors(self) -> None:
        for field in self.query(SchemaField):
            field.error = ""
        self._reason_error("")

    # -- building and sending the change ------------------------------------------------

    def build_update(self) -> dict[str, Any] | None:
        """The PUT body, or None (with the errors shown) when a field fails client-side."""
        self._clear_errors()
        bad = [f.spec.path for f in self.query(SchemaField) if f.check()]
        reason = self.query_one("#reason", Input).value.strip()
        if not reason:
            self._reason_error("A reason is required.")
            bad.append("reason")
        if bad:
            self.say(f"Fix {len(bad)} field(s) first: {', '.join(bad)}.", "$text-error")
            return None
        current = self.view.settings
        update: dict[str, Any] = {"reason": reason}
        params = self.query_one(PolicyForm).params()
        if self.chosen != current.policy.name or params != current.policy.params:
            update["policy"] = {"name": self.chosen, "params": params}
        engine_fields = {name for name, _, _ in ENGINE_FIELDS}
        for field in self.query(SchemaField):
            name = field.spec.path
            if name in engine_fields and field.value != getattr(current, name):
                update[name] = field.value
        return update

    async def _send(self, update: dict[str, Any], dry_run: bool) -> PolicyUpdateResult | None:
        try:
            return await self.console.client.update_policy(
                update, if_match=self.view.version, dry_run=dry_run
            )
        except Conflict as exc:
            self.say(
                f"Conflict: {exc.message}. Someone changed the policy after you loaded "
                f"version {self.view.version}; nothing was applied. Reload (ctrl+l) and "
                "make the change again.",
                "bold $text-error",
            )
        except ApiError as exc:
            self._show_server_errors(exc)
        except ClientError as exc:
            self.say(f"No change: {exc}", "$text-error")
        return None

    def _show_server_errors(self, exc: ApiError) -> None:
        self.show_diff(None)
        fields = {f.spec.path: f for f in self.query(SchemaField)}
        lines = []
        for path, message in exc.field_errors.items():
            if path in fields:
                fields[path].error = message
            elif path == "reason":
                self._reason_error(message)
            lines.append(f"• {path}: {message}")
        if not lines:
            lines.append(f"• {exc.message}")
        self.say(
            f"The server refused the change (HTTP {exc.status}); nothing was changed:\n"
            + "\n".join(lines),
            "$text-error",
        )

    # -- actions ------------------------------------------------------------------------

    def action_dry_run(self) -> None:
        self.run_worker(self._dry_run(), group="editor", exclusive=True)

    def action_apply(self) -> None:
        self.run_worker(self._apply(), group="editor", exclusive=True)

    def action_reload(self) -> None:
        self.run_worker(self._reload(), group="editor", exclusive=True)

    def action_close(self) -> None:
        self.app.pop_screen()

    async def _dry_run(self) -> PolicyUpdateResult | None:
        update = self.build_update()
        if update is None:
            return None
        result = await self._send(update, dry_run=True)
        if result is not None:
            self.show_diff(result.diff, prediction_of(result))
            changes = len(result.diff)
            self.say(
                f"Dry run passed: {changes} change(s) against version {self.view.version}."
                if changes
                else f"Nothing to change: the form matches version {self.view.version}.",
                "$text-success" if changes else "$text-warning",
            )
        return result

    async def _apply(self) -> None:
        preview = await self._dry_run()
        if preview is None or not preview.diff:
            return
        reason = await self.app.push_screen_wait(
            ConfirmScreen(
                f"Apply as a new version after {self.view.version}?",
                dry_run_content(preview.diff, prediction_of(preview)),
                "Apply",
            )
        )
        if reason is None:
            self.say("Not applied.", "$text-warning")
            return
        update = self.build_update()
        if update is None:
            return
        result = await self._send(update, dry_run=False)
        if result is None:
            return
        await self._reload(keep_message=True)
        self.say(f"Applied: version {result.version} is active.", "bold $text-success")
        self.show_diff(result.diff)
        self.console.poll()

    async def _reload(self, keep_message: bool = False) -> None:
        try:
            schema, view = await self.console.client.schema(), await self.console.client.policy()
        except ClientError as exc:
            self.say(f"Could not reload: {exc}", "$text-error")
            return
        self.schema, self.view, self.chosen = schema, view, view.settings.policy.name
        self._diff, self._prediction = None, None
        if not keep_message:
            self._message = Content.styled(f"Reloaded version {view.version}.", "$text-success")
        await self.recompose()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        actions = {"dry-run": self.action_dry_run, "apply": self.action_apply}
        actions.get(event.button.id or "", self.action_close)()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "reason":
            event.stop()
            self.action_dry_run()
