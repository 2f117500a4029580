"""OpenAI load testers against servedeck, unmodified: guidellm, the official ``openai`` client
and ``servedeck load``, each against a fresh ``servedeck serve`` of the embedded model.

    python -m bench.openai_clients --guidellm-venv /work/glvenv [--out DIR] [--concurrency 4]
        [--duration 20] [--prompt-tokens 128] [--output-tokens 64] [--model DIR]

guidellm is no dependency of servedeck: it lives in a venv of its own
(``python3 -m venv V && V/bin/pip install guidellm==0.8.1``), run with its defaults (streamed
chat, ``stream_options`` with usage) but for the load's shape: ``concurrent`` streams, a
duration, synthetic text of the given lengths counted with the model's own tokenizer; then
``stream=false``, and both again on ``/v1/completions``. The ``openai`` client does the same
four runs (closed loop, ``include_usage`` when streamed); ``servedeck load`` its own streamed
completions. Each tool's figures are its own (guidellm's JSON, the client's timings taken
here as guidellm takes them, ``servedeck load --json``), written to ``DIR/summary.json`` and
``DIR/README.md``, with the commands and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from bench.child_server import start_server, stop_server
from bench.metrics import percentile
from engine.checkpoint import default_model_dir

OUT = Path("bench/results/openai-clients")
ADMIN_TOKEN = "openai-clients-bench"
RUNS = [("chat", True), ("chat", False), ("completions", True), ("completions", False)]
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
LATENCIES = (("ttft", 50), ("ttft", 99), ("tpot", 50), ("e2e", 50))
"""The latency percentiles the table shows (``ttft_p50_ms``, ...)."""
GUIDELLM_METRICS = {
    "ttft_p50_ms": "time_to_first_token_ms p50",
    "ttft_p99_ms": "time_to_first_token_ms p99",
    "tpot_p50_ms": "time_per_output_token_ms p50",
    "itl_p50_ms": "inter_token_latency_ms p50",
    "e2e_p50_ms": "request_latency p50",
    "prompt_tokens_p50": "prompt_token_count p50",
    "output_tokens_p50": "output_token_count p50",
}
"""Our name: guidellm's metric (of its successful requests) and percentile."""


def run_guidellm(venv: Path, url: str, model_dir: Path, kind: str, stream: bool, a) -> dict:
    backend = f"kind=openai_http,target={url}"
    if kind == "completions":
        backend += ",request_format=/v1/completions"
    if not stream:
        backend += ",stream=false"
    command = [
        str(venv / "bin" / "guidellm"), "run", "--backend", backend,
        "--profile", f"kind=concurrent,streams={a.concurrency}",
        "--constraint", f"kind=max_duration,seconds={a.duration:g}",
        "--data", f"kind=synthetic_text,prompt_tokens={a.prompt_tokens},"
        f"output_tokens={a.output_tokens}",
        "--tokenizer", f"kind=huggingface_auto,model={model_dir}",
        "--disable-progress",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
        report = Path(work, "benchmarks.json")
        if done.returncode != 0 or not report.exists():
            return {"command": command, "failed": done.stderr[-2000:] or done.stdout[-2000:]}
        metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    row: dict[str, Any] = {
        "command": command,
        "requests": totals["successful"],
        "errors": totals["errored"],
        "incomplete": totals["incomplete"],
        "requests_per_s": metrics["requests_per_second"]["successful"]["mean"],
        "output_tok_per_s": metrics["output_tokens_per_second"]["total"]["mean"],
    }
    for name, where in GUIDELLM_METRICS.items():
        metric, p = where.split()
        row[name] = metrics[metric]["successful"]["percentiles"][p]
    if not stream:  # guidellm times no token of a whole answer
        for name in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms"):
            row[name] = None
    row["e2e_p50_ms"] *= 1000  # guidellm's request latency is in seconds
    row["console"] = done.stdout[done.stdout.find("\nℹ") + 1 :]
    return row


def prompt_text(model_dir: Path, tokens: int) -> str:
    """Text of ``tokens`` tokens of the model's tokenizer (as guidellm's synthetic text)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words = "the operator measures how a batching policy serves the traffic of today " * tokens
    ids = tokenizer.encode(words, add_special_tokens=False).ids[:tokens]
    return tokenizer.decode(ids)


def one_openai_request(client, served: str, kind: str, stream: bool, prompt: str, a) -> dict:
    """One request's timings as guidellm takes them: TTFT at the first chunk with text, TPOT
    from there to the last over the usage's tokens less one."""
    common: dict[str, Any] = {"model": served, "temperature": 0, "extra_body": {"ignore_eos": True}}
    if stream:
        common |= {"stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    if kind == "chat":
        answer = client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}],
            max_completion_tokens=a.output_tokens,
            **common,
        )
    else:
        answer = client.completions.create(prompt=prompt, max_tokens=a.output_tokens, **common)
    if not stream:
        return {"e2e": time.perf_counter() - start, "usage": answer.usage}
    first = last = usage = None
    for chunk in answer:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text = choice.delta.content if kind == "chat" else choice.text
            if text:
                last = time.perf_counter()
                first = first or last
    end, tokens = time.perf_counter(), usage.completion_tokens if usage else 0
    tpot = (last - first) / (tokens - 1) if first and last and tokens > 1 else None
    ttft = first - start if first else None
    return {"e2e": end - start, "ttft": ttft, "tpot": tpot, "usage": usage}


def run_openai(url: str, model_dir: Path, kind: str, stream: bool, a) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    served = client.models.list().data[0].id
    prompt = prompt_text(model_dir, a.prompt_tokens)
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    deadline = time.perf_counter() + a.duration

    def loop() -> None:
        while time.perf_counter() < deadline:
            try:
                results.append(one_openai_request(client, served, kind, stream, prompt, a))
            except openai.OpenAIError as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    started = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        for future in [pool.submit(loop) for _ in range(a.concurrency)]:
            future.result()
    wall = time.perf_counter() - started
    client.close()

    def ms(key: str, p: float) -> float | None:
        values = [r[key] for r in results if r.get(key) is not None]
        value = percentile(values, p)
        return None if value is None else value * 1000

    outputs = [r["usage"].completion_tokens for r in results if r["usage"] is not None]
    return {
        "command": f"openai {openai.__version__}: {PATHS[kind]} stream={stream}, "
        f"{a.concurrency} threads for {a.duration:g} s",
        "requests": len(results),
        "errors": len(errors),
        "error_samples": errors[:3],
        "usage_reported": len(outputs),
        "requests_per_s": len(results) / wall,
        "output_tok_per_s": sum(outputs) / wall,
        **{f"{key}_p{p}_ms": ms(key, p) for key, p in LATENCIES},
        "output_tokens_p50": percentile(outputs, 50) if outputs else None,
    }


def run_servedeck_load(url: str, a) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work, "load.json")
        command = [
            sys.executable, "-m", "control.cli", "load", "--url", url,
            "--concurrency", str(a.concurrency), "--duration", f"{a.duration:g}",
            "--prompt-tokens", str(a.prompt_tokens), "--output-tokens", str(a.output_tokens),
            "--json", str(out),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if not out.exists():
            return {"command": command, "failed": done.stderr[-2000:]}
        s = json.loads(out.read_text())
    command[command.index("--json") + 1] = "load.json"
    seconds = {f"{key}_p{p}": s.get(f"{key}_p{p}") for key, p in LATENCIES}
    return {
        "command": command,
        "requests": s["completed"],
        "errors": s["failed"],
        "requests_per_s": s["request_throughput"],
        "output_tok_per_s": s["output_throughput"],
        **{f"{name}_ms": None if v is None else v * 1000 for name, v in seconds.items()},
        "console": done.stdout,
    }


def versions(venv: Path) -> dict[str, str]:
    import openai

    def out(*command: str) -> str:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip()

    return {
        "guidellm": out(str(venv / "bin" / "guidellm"), "--version").split()[-1],
        "openai": openai.__version__,
        "servedeck": out("git", "rev-parse", "--short", "HEAD"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the end",
    }


def on_fresh_server(model_dir: Path, folder: Path, job):
    """``job(url)`` against a server of its own (its log in ``folder/server.log``)."""
    folder.mkdir(parents=True)
    proc, url = start_server(model_dir, folder, ADMIN_TOKEN, ["--num-threads", "1"])
    try:
        return job(url)
    finally:
        stop_server(proc)


COLUMNS = {
    "requests": "{:.0f} requests",
    "errors": "{:.0f} errors",
    "ttft_p50_ms": "{:.0f} TTFT p50 (ms)",
    "ttft_p99_ms": "{:.0f} TTFT p99 (ms)",
    "tpot_p50_ms": "{:.1f} TPOT p50 (ms)",
    "e2e_p50_ms": "{:.0f} e2e p50 (ms)",
    "requests_per_s": "{:.2f} req/s",
    "output_tok_per_s": "{:.1f} output tok/s",
    "output_tokens_p50": "{:.0f} usage: output tok/req",
}
"""The table's columns: the run's figure, its format and its title."""


def write_results(out: Path, versions: dict, settings: dict, runs: list[dict]) -> None:
    """``summary.json`` (every figure, the commands), ``README.md`` (the table) and each
    tool's own console summary (``<tool>-<endpoint>-<stream>.txt``)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in run.items() if k != "console"} for run in runs]
    summary = {"versions": versions, "settings": settings, "runs": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# OpenAI load testers against servedeck",
        "",
        "Written by `python -m bench.openai_clients` (every figure as the tool reports it; "
        "a fresh server per tool and run).",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "Load: " + ", ".join(f"{k} {v}" for k, v in settings.items()) + ".",
        "",
        "| tool | endpoint | stream | "
        + " | ".join(c.split(" ", 1)[1] for c in COLUMNS.values())
        + " |",
        "|---|---|---|" + "---:|" * len(COLUMNS),
    ]
    for run in runs:
        cells = [
            "-" if run.get(k) is None else c.split()[0].format(run[k]) for k, c in COLUMNS.items()
        ]
        if "failed" in run:
            cells = ["failed"] + [""] * (len(COLUMNS) - 1)
        lines.append(
            f"| {run['tool']} | `{run['endpoint']}` | {run['stream']} | " + " | ".join(cells) + " |"
        )
    lines += ["", "Commands:", ""]
    for run in runs:
        command = run["command"]
        text = command if isinstance(command, str) else " ".join(command)
        lines.append(f"- {run['tool']}, `{run['endpoint']}`, stream={run['stream']}: `{text}`")
        if run.get("console"):
            name = f"{run['tool'].replace(' ', '-')}-{run['endpoint'].strip('/').replace('/', '-')}"
            (out / f"{name}-stream-{run['stream']}.txt").write_text(run["console"])
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guidellm-venv", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    a = parser.parse_args(argv)
    model_dir = a.model or default_model_dir()
    venv = a.guidellm_venv
    jobs: list[tuple[str, str, bool, Callable[[str], dict[str, Any]]]] = [
        ("guidellm", k, s, partial(run_guidellm, venv, model_dir=model_dir, kind=k, stream=s, a=a))
        for k, s in RUNS
    ]
    jobs += [
        ("openai", k, s, partial(run_openai, model_dir=model_dir, kind=k, stream=s, a=a))
        for k, s in RUNS
    ]
    jobs.append(("servedeck load", "completions", True, partial(run_servedeck_load, a=a)))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (tool, kind, stream, job) in enumerate(jobs):
            row = on_fresh_server(model_dir, Path(tmp, str(i)), job)
            runs.append({"tool": tool, "endpoint": PATHS[kind], "stream": stream} | row)
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "console"}), flush=True)
    settings = {
        "model": model_dir.name,
        "concurrency": a.concurrency,
        "duration_s": a.duration,
        "prompt_tokens": a.prompt_tokens,
        "output_tokens": a.output_tokens,
    }
    write_results(a.out, versions(a.guidellm_venv), settings, runs)
    return 0 if all("failed" not in r and not r["errors"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
