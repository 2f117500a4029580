"""The HTTP client against recorded responses: what it sends and how it reads refusals."""

from __future__ import annotations

import httpx
import pytest

from tests.tui.recorded import URL, RecordedServer, reply
from tui.client import ApiError, Conflict, ConsoleClient, HttpClient, ReadOnlyError, Unreachable


async def test_reads_every_admin_view_and_sends_the_token(recorded: RecordedServer) -> None:
    client = recorded.client()
    assert isinstance(client, ConsoleClient)
    state = await client.state()
    jobs = await client.jobs()
    view = await client.policy()
    schema = await client.schema()
    history = await client.history()
    assert (state.version, state.policy.name, state.queue.waiting) == (3, "dynamic", 7)
    assert len(state.block_map) == state.kv.total == 512
    assert jobs.jobs[0].id == "kv_reclaim"
    assert view.etag == '"3"' and view.sources["policy.params.length_window"] == "default"
    assert set(schema.policies) == {"static", "dynamic", "continuous", "hybrid"}
    assert schema.memory_reserve.maximum == 0.5
    assert [v.version for v in history.items] == [3, 2, 1]
    assert all(r.headers["authorization"] == "Bearer T" for r in recorded.requests)
    await client.aclose()


async def test_update_sends_if_match_dry_run_and_actor(recorded: RecordedServer) -> None:
    client = HttpClient(URL, "T", actor="carol", transport=httpx.MockTransport(recorded.handle))
    update = {"policy": {"name": "dynamic", "params": {"max_batch_size": 24}}, "reason": "r"}
    preview = await client.update_policy(update, if_match=3, dry_run=True)
    result = await client.update_policy(update, if_match=3)
    dry, real = recorded.requests
    assert dry.url.params["dry_run"] == "true" and "dry_run" not in real.url.params
    assert dry.headers["if-match"] == real.headers["if-match"] == '"3"'
    assert real.headers["x-servedeck-actor"] == "carol"
    assert preview.dry_run and not preview.applied
    assert result.applied and result.version == 4
    assert result.diff[0].field == "policy.params.max_batch_size"


async def test_conflict_and_validation_errors_are_typed(recorded: RecordedServer) -> None:
    client = recorded.client()
    recorded.routes["PUT", "/admin/policy"] = reply("update_409", status=409)
    with pytest.raises(Conflict, match="version is 5, not 3"):
        await client.update_policy({"reason": "r"}, if_match=3)
    recorded.routes["PUT", "/admin/policy"] = reply("update_422", status=422)
    with pytest.raises(ApiError) as caught:
        await client.update_policy({"reason": "r"}, if_match=3)
    assert caught.value.status == 422
    assert caught.value.field_errors == {
        "policy.params.max_batch_size": (
            "Value error, must be <= the engine cap max_num_seqs=256, got 300"
        )
    }


async def test_unreachable_on_refused_connection_and_5xx(recorded: RecordedServer) -> None:
    client = recorded.client()
    recorded.down = True
    with pytest.raises(Unreachable, match="ConnectError"):
        await client.state()
    recorded.down = False
    recorded.routes["GET", "/admin/state"] = lambda r: httpx.Response(
        503, json={"status": "loading"}
    )
    with pytest.raises(Unreachable, match="503"):
        await client.state()


async def test_a_timeout_says_no_answer(recorded: RecordedServer) -> None:
    """httpx's ReadTimeout has an empty message (a server whose steps outlast the timeout)."""

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("", request=request)

    recorded.routes["GET", "/admin/state"] = slow
    with pytest.raises(Unreachable, match=r"^ReadTimeout: no answer$"):
        await recorded.client().state()


async def test_read_only_client_never_sends_a_change(recorded: RecordedServer) -> None:
    client = recorded.client(read_only=True)
    with pytest.raises(ReadOnlyError):
        await client.update_policy({"reason": "r"}, if_match=3, dry_run=True)
    with pytest.raises(ReadOnlyError):
        await client.rollback(2, "r", if_match=3)
    with pytest.raises(ReadOnlyError):
        await client.reclaim()
    assert recorded.requests == []
    await client.state()
    assert len(recorded.requests) == 1
