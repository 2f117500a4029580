"""``servedeck bench --preset quick`` end to end on the tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cli
from bench.plan import PeerSpec, Plan
from bench.presets import PRESETS
from bench.report import REQUIRED_RUN_KEYS
from bench.runner import EngineFactory
from bench.suite import Bench


@pytest.fixture(scope="module")
def quick_out(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-quick")
    code = cli.run(
        ["--preset", "quick", "--model", str(tiny_model_dir), "--out", str(out), "--threads", "1"]
    )
    assert code == 0
    return out


def test_quick_writes_results_with_the_documented_keys(quick_out: Path):
    doc = json.loads((quick_out / "results.json").read_text())
    assert doc["preset"] == "quick"
    assert doc["machine"]["torch_threads"] == 1
    assert {"runs", "ratios", "claims", "targets"} <= set(doc)
    for run in doc["runs"]:
        missing = [k for k in REQUIRED_RUN_KEYS if k not in run]
        assert not missing, f"{run['id']} lacks {missing}"
        assert run["completed"] + run["refused"] + run.get("leaked", 0) == run["num_requests"]
    policies = {r["policy"] for r in doc["runs"]}
    assert {"static", "dynamic", "continuous", "hybrid"} <= policies
    sweeps = {r["sweep"] for r in doc["runs"]}
    assert {"batch-size", "block-size"} <= sweeps
    assert any(r["rate"] for r in doc["runs"])
    assert "continuous/dynamic" in doc["ratios"]["burst-fixed@16"]


def test_quick_checks_the_engine_against_the_peers(quick_out: Path):
    doc = json.loads((quick_out / "results.json").read_text())
    peers = [r for r in doc["runs"] if r["policy"].startswith("hf-")]
    if not peers:
        pytest.skip("transformers is not installed")
    for run in peers:
        assert run["outputs_equal_to_continuous"] == 1.0, run["policy"]


def test_quick_shares_are_fractions(quick_out: Path):
    doc = json.loads((quick_out / "results.json").read_text())
    for run in doc["runs"]:
        for key in ("kv_utilization", "padding_waste", "engine_overhead"):
            value = run.get(key)
            assert value is None or 0.0 <= value <= 1.0, (run["id"], key, value)


def test_quick_report_has_every_claim_with_a_verdict(quick_out: Path):
    report = (quick_out / "report.md").read_text()
    assert "## The article's claims" in report
    claims = json.loads((quick_out / "results.json").read_text())["claims"]
    assert [c["number"] for c in claims] == list(range(1, 12))
    for c in claims:
        assert c["verdict"] in (
            "holds",
            "holds in shape only",
            "does not hold here",
            "not measured",
        )
        assert f"| {c['number']} | {c['claim']} |" in report


def test_quick_draws_the_plots(quick_out: Path):
    pytest.importorskip("matplotlib")
    for name in ("throughput_vs_concurrency", "ttft_cdf", "kv_utilization", "batch_tradeoff"):
        assert (quick_out / f"{name}.png").stat().st_size > 1000


def test_peers_are_skipped_with_a_message_without_transformers(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("bench.suite.transformers_available", lambda: False)
    preset = PRESETS["quick"]
    factory = EngineFactory(tiny_model_dir)
    plan = Plan(preset, ("continuous",), ("hf-static",), factory.vocab_size, ("mixed",)).build()
    assert any(isinstance(s, PeerSpec) for s in plan)
    output = Bench(preset, factory, plan).run()
    assert any("transformers is not installed" in s for s in output.skipped)
    assert [r["policy"] for r in output.runs] == ["continuous"]
