"""The vLLM CPU peer's pure parts (issue 26): result files, summary, ratio, roofline, commands,
and the one-line refusal of a missing or broken peer venv. No vLLM and no model run here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from bench.vllm import side_by_side
from bench.vllm.hf_model import MARKER, REQUIRED, Source, is_made
from bench.vllm.summary import (
    ENGINES,
    BenchResult,
    Engine,
    ModelShape,
    Probe,
    ResultError,
    RunRecord,
    Settings,
    Summary,
    WorkloadSpec,
    ceiling_tok_s,
    markdown,
    read_result,
    summarize_workload,
    workload_flop,
    workloads,
)

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
BURST = WorkloadSpec("burst-64", 64, None, 1)


def _results() -> dict[Engine, BenchResult]:
    return {e: read_result(FIXTURES / f"burst-64-{e}-0.json") for e in ENGINES}


def _one_run_each() -> dict[Engine, list[BenchResult]]:
    return {engine: [result] for engine, result in _results().items()}


def test_a_result_file_reads_the_keys_vllm_writes() -> None:
    vllm = _results()["vllm"]
    assert vllm.request_rate is None  # "inf": a burst
    assert (vllm.num_prompts, vllm.completed, vllm.failed) == (64, 64, 0)
    assert vllm.total_output_tokens == 8237  # 128 ± 25 % each
    assert vllm.output_throughput == pytest.approx(8237 / 44.28)
    assert (vllm.median_ttft_ms, vllm.p99_ttft_ms) == (11843.2, 22307.9)
    assert (vllm.median_tpot_ms, vllm.p99_itl_ms) == (263.41, 1520.4)


def test_a_result_without_a_figure_is_refused_by_name(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "burst-64-vllm-0.json").read_text())
    del data["p99_itl_ms"]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultError, match="p99_itl_ms"):
        read_result(path)
    path.write_text("not json")
    with pytest.raises(ResultError, match=r"cut\.json"):
        read_result(path)


def test_the_summary_gives_medians_spreads_and_the_ratio() -> None:
    base = _results()
    slower = dataclasses.replace(base["vllm"], output_throughput=150.0, median_ttft_ms=14000.0)
    faster = dataclasses.replace(base["vllm"], output_throughput=190.0, median_ttft_ms=11000.0)
    results: dict[Engine, list[BenchResult]] = {
        "vllm": [base["vllm"], slower, faster],
        "servedeck": [base["servedeck"]],
    }
    spec = dataclasses.replace(BURST, runs=3)
    summary = summarize_workload(spec, results, ModelShape.from_config(SMOLLM2_CONFIG), _probe())
    vllm = summary.vllm.output_throughput
    assert vllm.median == pytest.approx(8237 / 44.28)
    assert (vllm.low, vllm.high) == (150.0, 190.0)
    assert summary.vllm.median_ttft_ms.median == 11843.2
    assert summary.vllm.runs == 3 and summary.vllm.completed == 192
    assert summary.ratio == pytest.approx((8237 / 83.59) / (8237 / 44.28))
    assert summary.servedeck.p99_itl_ms.median == 574.2


def test_smollm2s_parameters_from_its_config() -> None:
    shape = ModelShape.from_config(SMOLLM2_CONFIG)
    assert shape.head_dim == 64
    # per layer: q 576·576, k and v 576·192 each, o 576·576, MLP 3·576·1536
    assert shape.layer_params == 331_776 + 2 * 110_592 + 331_776 + 2_654_208
    assert shape.params_without_lm_head == 30 * 3_538_944 == 106_168_320
    assert shape.lm_head_params == 49152 * 576
    assert shape.params_with_lm_head == 134_479_872


def test_the_roofline_arithmetic() -> None:
    shape = ModelShape.from_config(SMOLLM2_CONFIG)
    flop = workload_flop(shape, prompt_tokens=16_400, output_tokens=8_192)
    assert flop == 2 * (16_400 * 106_168_320 + 8_192 * 134_479_872)
    assert flop / 1e12 == pytest.approx(5.686, abs=1e-3)
    # at 200 GFLOP/s the burst's products take flop / 2e11 s for 8192 output tokens
    assert ceiling_tok_s(flop, 8_192, 200.0) == pytest.approx(8_192 / (flop / 2e11))
    assert ceiling_tok_s(flop, 8_192, 200.0) == pytest.approx(288.1, abs=0.1)


def test_the_workloads_roofline_uses_both_probes() -> None:
    shape = ModelShape.from_config(SMOLLM2_CONFIG)
    results = _one_run_each()
    roofline = summarize_workload(BURST, results, shape, _probe()).roofline
    flop = workload_flop(shape, 16_398, 8_237)
    assert (roofline.prompt_tokens, roofline.output_tokens, roofline.flop) == (16_398, 8_237, flop)
    assert roofline.ceiling_tok_s_before == pytest.approx(ceiling_tok_s(flop, 8_237, 210.0))
    assert roofline.ceiling_tok_s_after == pytest.approx(ceiling_tok_s(flop, 8_237, 190.0))
    assert roofline.ceiling_tok_s == pytest.approx(ceiling_tok_s(flop, 8_237, 200.0))
    assert roofline.vllm_fraction == pytest.approx((8237 / 44.28) / roofline.ceiling_tok_s)


def test_workloads_alternate_names_and_rates() -> None:
    specs = workloads(3, 64, [2.0, 4.0], 200, 2)
    assert [(s.name, s.num_prompts, s.rate_arg, s.runs) for s in specs] == [
        ("burst-64", 64, "inf", 3),
        ("poisson-2", 200, "2", 2),
        ("poisson-4", 200, "4", 2),
    ]


def test_the_markdown_and_json_hold_every_figure() -> None:
    summary = _summary()
    text = markdown(summary)
    assert "| burst-64 | servedeck | 1 | 98.5 (98.5–98.5) | **0.53** |" in text
    assert "| burst-64 | vllm | 1 | 186.0 (186.0–186.0) |" in text
    assert "210.0 GFLOP/s before, 190.0 after" in text
    assert "- vllm_version: `0.32.0+cpu`" in text
    assert "load average at start [1.0, 0.9, 0.8], at end [1.9, 1.5, 1.0]" in text
    record = json.loads(summary.to_json())
    assert record["settings"]["dtype"] == "float32"
    assert record["shape"]["params_with_lm_head"] == 134_479_872
    assert record["workloads"][0]["workload"]["request_rate"] is None
    assert record["workloads"][0]["ratio"] == pytest.approx(summary.workloads[0].ratio)


def test_the_commands_name_the_briefs_flags(tmp_path: Path) -> None:
    peer = side_by_side.PeerVenv(tmp_path, "0.32.0+cpu", "2.13.0+cpu")
    serve = side_by_side.vllm_serve_command(peer, tmp_path / "m", "bfloat16", 8123)
    assert serve[:3] == [str(tmp_path / "bin" / "vllm"), "serve", str(tmp_path / "m")]
    assert _after(serve, "--dtype") == "bfloat16" and _after(serve, "--max-model-len") == "2048"
    env = side_by_side.vllm_env(2)
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and side_by_side.omp_bind(1) == "0"
    ours = side_by_side.servedeck_serve_command(tmp_path / "m", "float32", 2, 8124, tmp_path)
    assert ours[:4] == [sys.executable, "-m", "control.cli", "serve"]
    assert _after(ours, "--num-threads") == "2" and _after(ours, "--max-model-len") == "2048"
    spec = WorkloadSpec("poisson-2", 200, 2.0, 2)
    client = side_by_side.bench_command(
        peer, "http://127.0.0.1:8124", "smol", tmp_path / "m", spec, tmp_path, "f.json"
    )
    assert client[1:3] == ["bench", "serve"] and "--ignore-eos" in client
    for flag, value in [
        ("--backend", "openai"),
        ("--endpoint", "/v1/completions"),
        ("--model", "smol"),
        ("--dataset-name", "random"),
        ("--random-input-len", "256"),
        ("--random-range-ratio", "0.25"),
        ("--random-output-len", "128"),
        ("--seed", "42"),
        ("--num-prompts", "200"),
        ("--request-rate", "2"),
        ("--result-filename", "f.json"),
    ]:
        assert _after(client, flag) == value, flag


def test_a_missing_peer_venv_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert side_by_side.main(["--peer-venv", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no peer venv" in err and "bench/vllm/venv.sh" in err


def test_a_broken_peer_venv_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "vllm", "exit 1")
    assert side_by_side.main(["--peer-venv", str(venv)]) == 2
    assert "no python command" in capsys.readouterr().err
    _script(venv / "bin" / "python", "exit 3")
    assert side_by_side.main(["--peer-venv", str(venv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exit 3" in err
    _script(venv / "bin" / "python", 'printf "\\n2.13.0+cpu\\n"')  # no vllm metadata
    assert side_by_side.main(["--peer-venv", str(venv)]) == 2
    assert "no vllm metadata" in capsys.readouterr().err
    _script(venv / "bin" / "python", 'printf "0.32.0\\n2.13.0+cpu\\n"')  # the METADATA fix missing
    assert side_by_side.main(["--peer-venv", str(venv)]) == 2
    assert "0.32.0, not a +cpu build" in capsys.readouterr().err


def test_a_good_peer_venv_gives_its_versions(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "vllm", "exit 0")
    _script(venv / "bin" / "python", 'printf "0.32.0+cpu\\n2.13.0+cpu\\n"')
    peer = side_by_side.check_peer_venv(venv)
    assert (peer.vllm_version, peer.torch_version) == ("0.32.0+cpu", "2.13.0+cpu")


def test_a_made_model_folder_is_known_by_its_marker(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "hf"
    out.mkdir()
    source = Source.of(gguf)
    assert not is_made(out, source)
    for name in REQUIRED:
        (out / name).write_text("{}")
    assert not is_made(out, source)  # no marker yet: a half-made folder
    (out / MARKER).write_text(json.dumps(dataclasses.asdict(source)))
    assert is_made(out, source)
    gguf.write_bytes(b"GGUF, another one")
    assert not is_made(out, Source.of(gguf))
    (out / MARKER).write_text("{broken")
    assert not is_made(out, source)


def _probe() -> Probe:
    return Probe(before_gflops=210.0, after_gflops=190.0)


def _summary() -> Summary:
    shape = ModelShape.from_config(SMOLLM2_CONFIG)
    results = _one_run_each()
    settings = Settings(
        model_dir="/m",
        servedeck_model="/m",
        dtype="float32",
        threads=2,
        max_model_len=2048,
        input_len=256,
        range_ratio=0.25,
        output_len=128,
        seed=42,
        vllm_kvcache_space_gib=4,
        vllm_omp_threads_bind="0-1",
        vllm_serve="vllm serve /m",
        servedeck_serve="servedeck serve --model /m",
        bench_serve="vllm bench serve",
        peer_venv="/v",
        vllm_version="0.32.0+cpu",
        peer_torch_version="2.13.0+cpu",
        servedeck_commit="abc1234",
    )
    return Summary(
        settings=settings,
        shape=shape,
        probe=_probe(),
        load_average_start=[1.0, 0.9, 0.8],
        load_average_end=[1.9, 1.5, 1.0],
        workloads=[summarize_workload(BURST, results, shape, _probe())],
        runs=[RunRecord("burst-64", "vllm", 0, 91.0, "raw/burst-64-vllm-0.json", "vllm bench")],
    )


def _after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    os.chmod(path, 0o755)


FAKE_VLLM = '''
"""A stand-in for the peer venv's ``vllm``: ``serve`` answers /health, /ready and /v1/models;
``bench serve`` writes a recorded result file, as vLLM 0.32.0's client does."""
import json, sys, urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

args = sys.argv[1:]
def after(flag):
    return args[args.index(flag) + 1]

if args[0] == "serve":
    name = Path(args[1]).name

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": name}]}).encode()
            self.send_response(200 if self.path in ("/health", "/ready", "/v1/models") else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(after("--port"))), Handler).serve_forever()
else:
    assert args[:2] == ["bench", "serve"], args
    with urllib.request.urlopen(after("--base-url") + "/v1/models") as answer:
        assert json.load(answer)["data"][0]["id"] == after("--model")
    result = json.loads(Path(RECORDED).read_text())
    result["num_prompts"] = result["completed"] = int(after("--num-prompts"))
    rate = after("--request-rate")
    result["request_rate"] = rate if rate == "inf" else float(rate)
    Path(after("--result-dir"), after("--result-filename")).write_text(json.dumps(result))
'''


def test_the_runs_alternate_on_fresh_servers_and_the_summary_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    recorded = FIXTURES / "burst-64-vllm-0.json"
    vllm = venv / "bin" / "vllm"
    vllm.write_text(f"#!{sys.executable}\nRECORDED = {str(recorded)!r}\n{FAKE_VLLM}")
    os.chmod(vllm, 0o755)
    _script(venv / "bin" / "python", 'printf "0.32.0+cpu\\n2.13.0+cpu\\n"')
    model = tmp_path / "SmolLM2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))

    def fake_servedeck(model: Path, dtype: str, threads: int, port: int, work: Path) -> list[str]:
        return [str(vllm), "serve", str(model), "--port", str(port)]

    monkeypatch.setattr(side_by_side, "servedeck_serve_command", fake_servedeck)
    monkeypatch.setattr(side_by_side, "probe_gflops", lambda threads, dtype: 200.0)
    plan = side_by_side.Plan(
        peer=side_by_side.check_peer_venv(venv),
        model_dir=model,
        servedeck_model=model,
        dtype="float32",
        threads=2,
        out=tmp_path / "out",
        work=tmp_path / "work",
    )
    for folder in (plan.raw, plan.logs, plan.work):
        folder.mkdir(parents=True)
    summary = side_by_side.run_all(plan, workloads(2, 64, [3.0], 10, 1))
    assert [(r.workload, r.engine, r.index) for r in summary.runs] == [
        ("burst-64", "vllm", 0),
        ("burst-64", "servedeck", 0),
        ("burst-64", "vllm", 1),
        ("burst-64", "servedeck", 1),
        ("poisson-3", "vllm", 0),
        ("poisson-3", "servedeck", 0),
    ]
    burst, poisson = summary.workloads
    assert burst.vllm.runs == 2 and burst.ratio == pytest.approx(1.0)
    assert poisson.servedeck.completed == 10
    assert "--request-rate 3" in summary.runs[-1].command
    assert summary.probe == Probe(200.0, 200.0)
    text = side_by_side.write_summary(plan.out, summary)
    assert (plan.out / "summary.md").read_text() == text
    assert json.loads((plan.out / "summary.json").read_text())["settings"]["threads"] == 2
    assert len(list(plan.raw.glob("*.json"))) == 6
