"""Schemathesis against the live server's own OpenAPI schema (issue 11: defect 5, "Fuzzing in the
suite"): the API holds its schema, for every operation, with and without the admin token.

A real ``servedeck serve`` child (tiny checkpoint, ``--max-model-len 96``, 64 KV blocks, a request
held to 192 tokens and 8 prompts, the admin token) is fuzzed through schemathesis' pytest
integration with the configuration of ``bench.fuzz.fuzz_config``: every response check (``--checks
all``: not_a_server_error, status_code_conformance, content_type_conformance,
response_schema_conformance, response_headers_conformance, positive_data_acceptance,
negative_data_rejection, missing_required_header, ignored_auth, unsupported_method, use_after_free,
...), schema-valid and schema-violating cases, a fixed seed, and up to 10 drawn cases per operation
and auth in the fuzzing phase (``SERVEDECK_FUZZ_EXAMPLES`` raises it: ``python -m bench.fuzz`` is
the longer run) plus the deterministic ``examples`` and ``coverage`` phases (boundary values, wrong
types, missing fields: the cases that found defect 5). Each case is booked, never raised, so one
run lists every distinct failure; ``test_fuzz_found_no_failures`` then asserts there is none. With
the token, schemathesis' own auth for the admin security scheme sends it where the schema asks for
it and leaves it out of the cases that test a missing or wrong credential; without it, no token is
configured (schemathesis still generates wrong ones).

Left out, on purpose (``bench.fuzz.EXCLUDED_PATHS`` / ``NOT_CHECKED``):
- ``/admin/testing/*``: test-only fault-injection routes, mounted only with
  ``SERVEDECK_TESTING=1``; this server runs without them, and the schema is filtered anyway.
- SSE event bodies are checked event by event only as far as the ``text/event-stream`` schema
  the operation declares goes (``schema``/``itemSchema``, ``contentSchema`` for the JSON data);
  tests/control/test_completions.py checks the events themselves.
- ``max_response_time``: no limit set (timing on a shared 2-core machine is noise).
- The stateful phase: the schema declares no OpenAPI links to chain calls by.
Tolerated, and counted apart (``bench.fuzz.DOCUMENTED_REFUSALS``): a schema-valid completion
refused with 400 and ``error.code == "context_length_exceeded"`` (prompt tokens + max_tokens past
``max_model_len`` or the KV pool depend on the tokenized prompt, which no JSON Schema can say),
or with ``request_too_large`` (the request's whole cost past ``max_request_tokens`` or
``max_logprob_entries``, which depends on the tokenized prompt too);
every other refusal of schema-valid input fails ``positive_data_acceptance``.
The three tests run in file order and share one server and one recorder (module fixtures).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis

from bench.fuzz import (
    ADMIN_SCHEME,
    AUTHS,
    DEFAULT_SEED,
    ENV_EXAMPLES,
    ENV_OUT,
    ENV_SEED,
    EXCLUDED_REGEX,
    SUITE_EXAMPLES,
    FuzzRecorder,
    FuzzSummary,
    fuzz_config,
    load_schema,
)
from tests.control.support import TOKEN, ServerProcess

EXAMPLES = int(os.environ.get(ENV_EXAMPLES, SUITE_EXAMPLES))
SEED = int(os.environ.get(ENV_SEED, DEFAULT_SEED))


@pytest.fixture(scope="module")
def fuzz_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tiny_model_dir,
        tmp_path_factory.mktemp("fuzz-server"),
        [
            "--admin-token",
            TOKEN,
            # Each case's whole cost bounded, so the cases, not the tokens, take the time: a
            # request without max_tokens generates up to max_model_len, and the default limits let
            # one drawn batch hold 32,768 tokens. Every limit is still fuzzed (past it, a
            # documented 400).
            "--max-model-len",
            "96",
            "--num-kv-blocks",
            "64",
            "--max-request-tokens",
            "192",
            "--max-batch-prompts",
            "8",
            "--max-logprob-entries",
            "4096",
        ],
        {},
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin_schema(fuzz_server: ServerProcess) -> schemathesis.BaseSchema:
    return load_schema(fuzz_server.url, fuzz_config(SEED, EXAMPLES, admin_token=TOKEN))


@pytest.fixture(scope="module")
def anonymous_schema(fuzz_server: ServerProcess) -> schemathesis.BaseSchema:
    return load_schema(fuzz_server.url, fuzz_config(SEED, EXAMPLES))


@pytest.fixture(scope="module")
def recorder(fuzz_server: ServerProcess) -> FuzzRecorder:
    return FuzzRecorder(fuzz_server.url, TOKEN, FuzzSummary(SEED, EXAMPLES))


# The exclusion again on the lazy schemas: a filter of the fixture's schema is not carried over.
with_token = schemathesis.pytest.from_fixture("admin_schema").exclude(path_regex=EXCLUDED_REGEX)
without_token = schemathesis.pytest.from_fixture("anonymous_schema").exclude(
    path_regex=EXCLUDED_REGEX
)


@with_token.parametrize()
def test_fuzz_with_admin_token(case: schemathesis.Case, recorder: FuzzRecorder) -> None:
    recorder.send(case, "admin")


@without_token.parametrize()
def test_fuzz_without_token(case: schemathesis.Case, recorder: FuzzRecorder) -> None:
    recorder.send(case, "anonymous")


def test_fuzz_found_no_failures(
    recorder: FuzzRecorder, anonymous_schema: schemathesis.BaseSchema, fuzz_server: ServerProcess
) -> None:
    summary = recorder.finish()
    if out := os.environ.get(ENV_OUT):
        recorder.write(Path(out))
    schemes = anonymous_schema.raw_schema["components"]["securitySchemes"]
    assert ADMIN_SCHEME in schemes, (
        f"the admin token was never sent: no {ADMIN_SCHEME} in {schemes}"
    )
    live = sorted(result.ok().label for result in anonymous_schema.get_all_operations())
    wanted = [f"{label} [{auth}]" for label in live for auth in AUTHS]
    missing = [key for key in wanted if key not in summary.cases_by_operation]
    assert not missing, f"operations never fuzzed (run the whole module): {missing}"
    assert fuzz_server.proc is not None and fuzz_server.proc.poll() is None, "server died"
    assert httpx.get(f"{fuzz_server.url}/health", timeout=10).status_code == 200
    assert not summary.failures, (
        f"{len(summary.failures)} distinct failures in {summary.failing_cases} of "
        f"{summary.cases} cases ({summary.failures_by_check}):\n\n{summary.describe()}"
    )
