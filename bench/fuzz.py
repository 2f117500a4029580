"""Schemathesis against a live server's own OpenAPI schema: every operation, with and without the
admin token, every response check schemathesis has (``--checks all``), seeded.

    python -m bench.fuzz --examples 200 --out bench/results/fuzz/fuzz.json

The run itself is the suite's fuzz test, ``tests/control/test_fuzz.py`` (schemathesis' pytest
integration against a ``servedeck serve`` child with the tiny checkpoint), run here with more
examples and a JSON summary; ``make test`` runs the same test with 10. This module owns what both
share: the schemathesis configuration, the operations left out and why, and the recorder.

Per operation and auth, schemathesis runs its phases: ``examples`` (from the schema), ``coverage``
(a fixed, deterministic set of boundary and type-violating cases derived from the schema) and
``fuzzing`` (up to ``examples`` drawn cases, schema-valid and schema-violating mixed), from a seed
derived from ``seed`` and the operation. Every case is sent and checked; a failing case is booked
and the run goes on (no shrinking), so the summary counts failing cases by check and lists each
distinct failure (operation, auth, check, title) once, with its first case as a curl command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests
import schemathesis
from schemathesis.errors import FailureGroup

DEFAULT_SEED = 20261130
SUITE_EXAMPLES = 10
REQUEST_TIMEOUT_S = 60.0
AUTHS = ("admin", "anonymous")
# The security scheme of the admin routes in /openapi.json (FastAPI names an HTTPBearer so).
ADMIN_SCHEME = "HTTPBearer"
# Every path left out of the run, with the reason (the schema is filtered by these regexes).
EXCLUDED_PATHS = {
    r"^/admin/testing/": "test-only fault-injection routes, mounted only with SERVEDECK_TESTING=1",
}
EXCLUDED_REGEX = "|".join(f"(?:{pattern})" for pattern in EXCLUDED_PATHS)
# Refusals of schema-valid input that no JSON Schema can express, told apart by the error code
# the server gives them: counted in ``FuzzSummary.documented_refusals``, never as failures.
DOCUMENTED_REFUSALS = {
    "context_length_exceeded": "prompt tokens + max_tokens beyond max_model_len or the KV pool: "
    "it depends on the tokenized prompt (OpenAI's code for it)",
    "request_too_large": "a request's whole cost past max_request_tokens (n × (prompt + "
    "max_tokens)) or max_logprob_entries (n × (echoed prompt + max_tokens) × (logprobs + 1)): it "
    "depends on the tokenized prompt",
    "invalid_json_schema": "response_format.json_schema.schema or structured_outputs.json that "
    "does not compile to a grammar (a keyword llguidance cannot enforce, unsatisfiable bounds, a "
    "$ref to nowhere, its parser limits): the grammar library's judgement, which no JSON Schema "
    "of the field can state",
    "invalid_grammar": "structured_outputs.regex outside Rust's regex syntax (lookaround, "
    "backreferences) or past the parser limits: the grammar library's judgement",
    "conflicting_constraints": "response_format (json_object, json_schema) and a non-empty "
    "structured_outputs in one request, or either with a forced tool call: not stated in the "
    "bodies' schemas yet",
    "unknown_function": "a chat tool_choice naming a function none of the request's tools has: "
    "a relation between two fields that no JSON Schema of them states",
    "duplicate_function": "chat tools naming one function twice: uniqueness of a key across "
    "items, which JSON Schema cannot state",
    "schedule_window": "POST /admin/schedules: a 422 naming only cron, cron_seconds, timezone "
    "or until, as value errors: the schema says they are strings; a crontab field's validity "
    "(ordered ranges, per-field bounds, names) is APScheduler's, a zone's is the server's "
    "tzdata, until is HH:MM[:SS] (no pattern stated in ScheduleCreate yet), and a cron must "
    "fire within the next five years (30 February never does)",
    "too_many_schedules": "POST /admin/schedules past max_schedules live schedules: a 422 on "
    "the body, which depends on what is stored",
    "guardrail_rule": "PUT /admin/guardrail: a 422 naming only bounds or objectives, as value "
    "errors: a range's min above its max, no objective set, a bound above the engine cap of "
    "its knob (one range type serves every knob, so no per-knob maximum is stated), a policy "
    "allowed twice, or a bounded knob no allowed policy has",
}
# The request fields whose 422 value errors count as each documented refusal: exact locations,
# or (``guardrail_rule``) anything under them.
SCHEDULE_WINDOW_FIELDS = {("body", f) for f in ("cron", "cron_seconds", "timezone", "until")}
GUARDRAIL_RULE_FIELDS = {("body", "bounds"), ("body", "objectives")}
GUARDRAIL_RULE_TYPES = {"value_error", "less_than_equal"}
"""``less_than_equal``: a bound's ``max`` above the engine cap of its knob."""
# Limits of the run itself, not exclusions: reported with the summary.
NOT_CHECKED = {
    "SSE event bodies": "each event is validated against the text/event-stream schema the "
    "operation declares (schema/itemSchema, contentSchema for the JSON data), and no further",
    "max_response_time": "no limit set: timing on a shared 2-core machine is noise",
    "stateful phase": "not run: the schema declares no OpenAPI links to chain calls by",
}
ENV_EXAMPLES = "SERVEDECK_FUZZ_EXAMPLES"
ENV_SEED = "SERVEDECK_FUZZ_SEED"
ENV_OUT = "SERVEDECK_FUZZ_OUT"
TEST_PATH = Path(__file__).resolve().parent.parent / "tests" / "control" / "test_fuzz.py"


def fuzz_config(
    seed: int = DEFAULT_SEED, examples: int = SUITE_EXAMPLES, admin_token: str | None = None
) -> schemathesis.Config:
    """All checks (schemathesis' default), both generation modes, no example database; with
    ``admin_token``, schemathesis sends it wherever the schema asks for ``ADMIN_SCHEME`` (and
    leaves it out of the cases that test a missing or wrong credential)."""
    auth = {"auth": {"openapi": {ADMIN_SCHEME: {"bearer": admin_token}}}} if admin_token else {}
    return schemathesis.Config.from_dict(
        auth
        | {
            "seed": seed,
            "request-timeout": REQUEST_TIMEOUT_S,
            "generation": {"mode": "all", "max-examples": examples, "database": "none"},
            # Field names like max_tokens would be masked as secrets; the recorder itself
            # replaces the admin token wherever it appears.
            "output": {"sanitization": {"enabled": False}},
        }
    )


def load_schema(url: str, config: schemathesis.Config) -> schemathesis.BaseSchema:
    """The live ``/openapi.json`` of ``url``, less ``EXCLUDED_PATHS``."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=config)
    return schema.exclude(path_regex=EXCLUDED_REGEX)


@dataclass(slots=True)
class FuzzFailure:
    """One distinct failure: the check that failed, on which operation, with which credentials."""

    operation: str
    auth: str
    check: str
    title: str
    status_code: int | None
    message: str
    response: str
    example: str
    cases: int = 1


@dataclass(slots=True)
class FuzzSummary:
    seed: int
    examples_per_operation: int
    operations: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=lambda: dict(EXCLUDED_PATHS))
    not_checked: dict[str, str] = field(default_factory=lambda: dict(NOT_CHECKED))
    cases: int = 0
    cases_by_phase: dict[str, int] = field(default_factory=dict)
    cases_by_operation: dict[str, int] = field(default_factory=dict)
    status_codes: dict[str, dict[str, int]] = field(default_factory=dict)
    documented_refusals: dict[str, int] = field(default_factory=dict)
    failing_cases: int = 0
    failures_by_check: dict[str, int] = field(default_factory=dict)
    failures: list[FuzzFailure] = field(default_factory=list)

    def describe(self) -> str:
        """The distinct failures, one paragraph each, for a test's assertion message."""
        return "\n\n".join(
            f"{f.operation} [{f.auth}] {f.check}: {f.title} (status {f.status_code}, "
            f"{f.cases} cases)\n  {f.message[:400]}\n  answer: {f.response}\n  {f.example[:600]}"
            for f in self.failures
        )


def _cause(answer: requests.Response | None) -> str:
    """What an error answer names (field and message), so distinct causes stay apart."""
    if answer is None or answer.status_code < 400:
        return ""
    try:
        body = answer.json()
    except ValueError:
        return f"{answer.status_code} {answer.text[:80]}"
    detail = body.get("detail") if isinstance(body, dict) else None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, list):
        # The first three steps of a location (body.policy.params) name the field; deeper
        # steps are often the generated key itself.
        parts = sorted(
            {f"{'.'.join(map(str, d.get('loc', [])[:3]))}: {d.get('msg')}" for d in detail}
        )
        return f"{answer.status_code} {'; '.join(parts)}"
    if isinstance(error, dict):
        return f"{answer.status_code} {error.get('param')}: {error.get('message')}"
    return f"{answer.status_code} {json.dumps(detail if detail is not None else body)[:80]}"


def _value_error_refusal(detail: object) -> str | None:
    """The documented refusal a 422's ``detail`` is: every item a value error at one of
    ``SCHEDULE_WINDOW_FIELDS`` (``schedule_window``) or under ``GUARDRAIL_RULE_FIELDS``
    (``guardrail_rule``), or the one ``max_schedules`` refusal (``too_many_schedules``); None
    otherwise."""
    if not isinstance(detail, list) or not detail:
        return None
    if not all(isinstance(item, dict) for item in detail):
        return None
    kinds = [(item.get("type"), tuple(item.get("loc", ()))) for item in detail]
    if all(kind == "value_error" and loc in SCHEDULE_WINDOW_FIELDS for kind, loc in kinds):
        return "schedule_window"
    if kinds == [("too_many_schedules", ("body",))]:
        return "too_many_schedules"
    if all(
        kind in GUARDRAIL_RULE_TYPES and loc[:2] in GUARDRAIL_RULE_FIELDS for kind, loc in kinds
    ):
        return "guardrail_rule"
    return None


def _error_code(answer: requests.Response | None) -> str | None:
    """``error.code`` of a 400 in OpenAI's error shape; for a 422, the documented value-error
    refusal it is (``_value_error_refusal``); else None."""
    if answer is None or answer.status_code not in (400, 422):
        return None
    try:
        body = answer.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if answer.status_code == 422:
        return _value_error_refusal(body.get("detail"))
    error = body.get("error")
    return error.get("code") if isinstance(error, dict) else None


class FuzzRecorder:
    """Sends each case, runs every enabled check on the answer and books the outcome."""

    def __init__(self, url: str, token: str, summary: FuzzSummary) -> None:
        self.url = url
        self.token = token
        self.summary = summary
        self.session = requests.Session()
        self.session.hooks["response"].append(self._on_response)
        self._answers: list[requests.Response] = []
        self._distinct: dict[tuple[str, ...], FuzzFailure] = {}
        self._counters: dict[str, Counter[str]] = {
            name: Counter() for name in ("phase", "operation", "status", "check", "refusal")
        }

    def _on_response(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        self._answers.append(response)

    def send(self, case: schemathesis.Case, auth: str) -> None:
        """Send ``case`` (from a schema loaded with or without the admin token, ``auth`` says
        which) and book the outcome; never raises for a failed check."""
        label = case.operation.label
        self._answers.clear()
        self.summary.cases += 1
        self._counters["operation"][f"{label} [{auth}]"] += 1
        self._counters["phase"][case.meta.phase.name.value if case.meta else "unknown"] += 1
        try:
            case.call_and_validate(
                base_url=self.url, session=self.session, timeout=REQUEST_TIMEOUT_S
            )
        except FailureGroup as group:
            self._book(case, auth, list(group.exceptions))
        finally:
            # The first answer is the case's own; checks such as ignored_auth send probes after.
            if self._answers:
                self._counters["status"][f"{auth} {self._answers[0].status_code}"] += 1

    def _book(self, case: schemathesis.Case, auth: str, failures: list) -> None:
        answer = self._answers[0] if self._answers else None
        code = _error_code(answer)
        kept = []
        for failure in failures:
            check = (getattr(failure, "checks", ()) or (type(failure).__name__,))[0]
            if check == "positive_data_acceptance" and code in DOCUMENTED_REFUSALS:
                self._counters["refusal"][code] += 1
            else:
                kept.append((check, failure))
        if kept:
            self.summary.failing_cases += 1
        for check, failure in kept:
            self._counters["check"][check] += 1
            key = (case.operation.label, auth, check, failure.title, _cause(answer))
            if key in self._distinct:
                self._distinct[key].cases += 1
                continue
            sent = dict(answer.request.headers) if answer is not None else None
            self._distinct[key] = FuzzFailure(
                operation=key[0], auth=auth, check=check, title=failure.title,
                status_code=answer.status_code if answer is not None else None,
                message=self._redact(failure.message),
                response=self._redact(answer.text[:300]) if answer is not None else "",
                example=self._redact(case.as_curl_command(headers=sent)),
            )  # fmt: skip

    def _redact(self, text: str) -> str:
        return text.replace(self.token, "<admin-token>") if self.token else text

    def finish(self) -> FuzzSummary:
        """Fill the summary's tallies from what was booked so far and return it."""
        counters, summary = self._counters, self.summary
        summary.operations = sorted({key.rsplit(" [", 1)[0] for key in counters["operation"]})
        summary.cases_by_phase = dict(sorted(counters["phase"].items()))
        summary.cases_by_operation = dict(sorted(counters["operation"].items()))
        summary.status_codes = {}
        for key, count in sorted(counters["status"].items()):
            auth, status = key.split(" ")
            summary.status_codes.setdefault(auth, {})[status] = count
        summary.failures_by_check = dict(sorted(counters["check"].items()))
        summary.documented_refusals = dict(sorted(counters["refusal"].items()))
        summary.failures = list(self._distinct.values())
        return summary

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self.finish()), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Run the suite's fuzz test with ``--examples`` and write its summary to ``--out``."""
    import pytest

    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    parser.add_argument(
        "--examples", type=int, default=200, help="fuzzing-phase cases per operation"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fuzz/fuzz.json"))
    args = parser.parse_args(argv)
    os.environ[ENV_EXAMPLES] = str(args.examples)
    os.environ[ENV_SEED] = str(args.seed)
    os.environ[ENV_OUT] = str(args.out.resolve())
    code = pytest.main([str(TEST_PATH), "-q", "-p", "no:cacheprovider", "-W", "ignore"])
    if args.out.exists():
        summary = json.loads(args.out.read_text())
        brief = {k: v for k, v in summary.items() if k != "failures"}
        print(json.dumps(brief | {"distinct_failures": len(summary["failures"])}, indent=2))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
