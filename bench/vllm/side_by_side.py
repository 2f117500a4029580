"""servedeck against vLLM CPU on the same real model, driven by vLLM's own benchmark client.

Issue 26's peer: both servers load the same float32 Hugging Face folder (``bench.vllm.hf_model``,
made from the shipped SmolLM2 GGUF), one server at a time, each run on a freshly started server
(the client's seeded prompts are the same in every run, and both engines cache prefixes: a
server kept across runs would serve later runs from its cache), alternated vLLM, servedeck,
vLLM, servedeck... for each workload. Every run is ``vllm bench serve`` from the peer venv
(random 256 ± 25 % prompt tokens, 128 ± 25 % output tokens, ``--ignore-eos``, seed 42), and the
summary (``summary.json``, ``summary.md`` in ``--out``) sets the two side by side with the
ratio and the roofline from this machine's own matrix probe before and after.

Runs in the project's venv (``bench.machine``'s probe needs torch; servedeck is this checkout's
``control.cli``); vLLM and its client run as commands from the peer venv
(``bench/vllm/venv.sh DIR`` makes it)::

    PYTHONPATH=. .venv/bin/python -m bench.vllm.side_by_side --peer-venv /work/.venv-vllm

A missing or broken peer venv is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.vllm.hf_model import DEFAULT_OUT, ensure_hf_model
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
    markdown,
    read_result,
    summarize_workload,
    workloads,
)

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300.0
"""vLLM CPU takes 80–100 s on this machine to be healthy; servedeck a few seconds."""
RUN_TIMEOUT_S = 3600.0
KVCACHE_SPACE_GIB = 4
MAX_MODEL_LEN = 2048
INPUT_LEN = 256
RANGE_RATIO = 0.25
OUTPUT_LEN = 128
SEED = 42
READY_PATH: dict[Engine, str] = {"vllm": "/health", "servedeck": "/ready"}


class PeerVenvError(Exception):
    """The peer venv is missing or cannot run vLLM: one line for the user."""


class ServerError(Exception):
    """A server that exited or never became ready."""


@dataclass(frozen=True, slots=True)
class PeerVenv:
    path: Path
    vllm_version: str
    torch_version: str

    @property
    def vllm(self) -> Path:
        return self.path / "bin" / "vllm"


_VERSIONS = (
    "import importlib.metadata as m\n"
    "for name in ('vllm', 'torch'):\n"
    "    try:\n"
    "        print(m.version(name))\n"
    "    except m.PackageNotFoundError:\n"
    "        print('')\n"
)


def check_peer_venv(path: Path) -> PeerVenv:
    """The venv's vLLM and torch versions, without importing vLLM (seconds, not minutes)."""
    hint = f"make it with bench/vllm/venv.sh {path}"
    python, vllm = path / "bin" / "python", path / "bin" / "vllm"
    if not path.is_dir():
        raise PeerVenvError(f"no peer venv at {path}: {hint}")
    for needed in (python, vllm):
        if not os.access(needed, os.X_OK):
            raise PeerVenvError(f"the peer venv {path} has no {needed.name} command: {hint}")
    try:
        answer = subprocess.run(
            [str(python), "-c", _VERSIONS], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise PeerVenvError(f"the peer venv's python does not run ({error}): {hint}") from error
    versions = answer.stdout.split("\n")
    if answer.returncode != 0 or len(versions) < 2:
        raise PeerVenvError(f"the peer venv's python failed (exit {answer.returncode}): {hint}")
    vllm_version, torch_version = versions[0].strip(), versions[1].strip()
    if not vllm_version.endswith("+cpu"):
        found = vllm_version or "no vllm metadata"
        raise PeerVenvError(f"the peer venv's vllm is {found}, not a +cpu build: {hint}")
    return PeerVenv(path=path, vllm_version=vllm_version, torch_version=torch_version)


def omp_bind(threads: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: cores 0..threads-1."""
    return "0" if threads == 1 else f"0-{threads - 1}"


def vllm_env(threads: int) -> dict[str, str]:
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_SPACE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": omp_bind(threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def vllm_serve_command(peer: PeerVenv, model_dir: Path, dtype: str, port: int) -> list[str]:
    return [
        str(peer.vllm), "serve", str(model_dir),
        "--dtype", dtype,
        "--max-model-len", str(MAX_MODEL_LEN),
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip


def servedeck_serve_command(
    model: Path, dtype: str, threads: int, port: int, work: Path
) -> list[str]:
    """This checkout's servedeck (``-m control.cli`` with PYTHONPATH at the root), at its
    defaults but for the model, dtype, context, threads and where it keeps its database."""
    return [
        sys.executable, "-m", "control.cli", "serve",
        "--model", str(model),
        "--dtype", dtype,
        "--max-model-len", str(MAX_MODEL_LEN),
        "--num-threads", str(threads),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--db", str(work / "servedeck.db"),
        "--log-level", "warning",
    ]  # fmt: skip


def bench_command(
    peer: PeerVenv,
    base_url: str,
    served_name: str,
    tokenizer: Path,
    spec: WorkloadSpec,
    result_dir: Path,
    result_file: str,
) -> list[str]:
    return [
        str(peer.vllm), "bench", "serve",
        "--backend", "openai",
        "--base-url", base_url,
        "--endpoint", "/v1/completions",
        "--model", served_name,
        "--tokenizer", str(tokenizer),
        "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN),
        "--random-range-ratio", str(RANGE_RATIO),
        "--random-output-len", str(OUTPUT_LEN),
        "--ignore-eos",
        "--seed", str(SEED),
        "--num-prompts", str(spec.num_prompts),
        "--request-rate", spec.rate_arg,
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir", str(result_dir),
        "--result-filename", result_file,
    ]  # fmt: skip


def free_port() -> int:
    from bench.child_server import free_port as port

    return port()


class Server:
    """One server process in its own process group (vLLM forks its engine core), its output
    in ``log``; stopped with SIGTERM to the group, SIGKILL after 60 s."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.command = command
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, url: str, timeout_s: float = STARTUP_TIMEOUT_S) -> float:
        """Seconds until ``url`` answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise ServerError(f"exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)  # a readiness probe's pace, not a synchronisation
        raise ServerError(f"not ready after {timeout_s:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def served_model_name(base_url: str) -> str:
    """The first model ``/v1/models`` lists: what the client must name."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as answer:
            name = str(json.load(answer)["data"][0]["id"])
    except (OSError, ValueError, LookupError, TypeError) as error:
        raise ServerError(f"{base_url}/v1/models did not name a model: {error}") from error
    print(f"[side-by-side] {base_url}/v1/models: {name}", flush=True)
    return name


@dataclass(frozen=True, slots=True)
class Plan:
    peer: PeerVenv
    model_dir: Path
    servedeck_model: Path
    dtype: str
    threads: int
    out: Path
    work: Path

    @property
    def raw(self) -> Path:
        return self.out / "raw"

    @property
    def logs(self) -> Path:
        return self.out / "logs"


def start(plan: Plan, engine: Engine, name: str) -> tuple[Server, str, float]:
    """The engine's server on a free port, ready; its base URL and startup seconds."""
    port = free_port()
    log = plan.logs / f"{name}.log"
    if engine == "vllm":
        command = vllm_serve_command(plan.peer, plan.model_dir, plan.dtype, port)
        env = {**os.environ, **vllm_env(plan.threads)}
        cwd = plan.work
    else:
        home = plan.work / name
        home.mkdir(parents=True, exist_ok=True)
        command = servedeck_serve_command(
            plan.servedeck_model, plan.dtype, plan.threads, port, home
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEDECK_")}
        env |= {
            "PYTHONPATH": str(ROOT),
            "SERVEDECK_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        cwd = ROOT
    url = f"http://127.0.0.1:{port}"
    server = Server(command, env, log, cwd)
    try:
        startup_s = server.wait_ready(url + READY_PATH[engine])
    except BaseException:
        server.stop()
        raise
    return server, url, startup_s


def run_once(plan: Plan, engine: Engine, spec: WorkloadSpec, index: int) -> RunRecord:
    """A fresh server, one client run against it, the server stopped. The client sends no
    warm-up (no ``--ready-check-timeout-sec``, no ``--num-warmups``): its warm-up request is
    the first prompt, which a prefix cache would then serve to the timed run; the server is
    already ready (``/health``, ``/ready``) when the client starts."""
    name = f"{spec.name}-{engine}-{index}"
    print(f"[side-by-side] {name}: starting {engine}", flush=True)
    server, url, startup_s = start(plan, engine, name)
    try:
        print(f"[side-by-side] {name}: ready in {startup_s:.0f} s", flush=True)
        command = bench_command(
            plan.peer,
            url,
            served_model_name(url),
            plan.model_dir,
            spec,
            plan.raw,
            f"{name}.json",
        )
        with (plan.logs / f"{name}.bench.log").open("wb") as log:
            subprocess.run(
                command,
                cwd=plan.work,
                env={**os.environ, **vllm_env(plan.threads)},
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
                check=True,
            )
    finally:
        server.stop()
    return RunRecord(
        spec.name, engine, index, round(startup_s, 1), f"raw/{name}.json", shlex.join(command)
    )


def smoke(plan: Plan) -> int:
    """vLLM alone, once: started, ``/v1/models`` asked, a 4-prompt burst, stopped."""
    spec = WorkloadSpec("smoke", 4, None, 1)
    started = time.monotonic()
    record = run_once(plan, "vllm", spec, 0)
    result = read_result(plan.out / record.result_file)
    print(
        f"[side-by-side] smoke: vLLM {plan.peer.vllm_version} ready in {record.startup_s:.0f} s, "
        f"{result.completed}/{result.num_prompts} completed ({result.failed} failed), "
        f"{result.output_throughput:.1f} output tok/s, TTFT p50 {result.median_ttft_ms:.0f} ms; "
        f"{time.monotonic() - started:.0f} s in all; {plan.out}"
    )
    return 0 if result.completed == result.num_prompts else 1


def git_commit() -> str:
    try:
        answer = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return answer.stdout.strip() or "unknown"


def probe_gflops(threads: int, dtype: str = "float32") -> float:
    """The matrix probe in the run's dtype, so a bfloat16 run's ceiling is bfloat16's."""
    import torch

    from bench.machine import matmul_gflops

    torch.set_num_threads(threads)
    return round(matmul_gflops(dtype=getattr(torch, dtype)), 1)


def settings_of(plan: Plan) -> Settings:
    sample = WorkloadSpec("WORKLOAD", 0, None, 0)
    return Settings(
        model_dir=str(plan.model_dir),
        servedeck_model=str(plan.servedeck_model),
        dtype=plan.dtype,
        threads=plan.threads,
        max_model_len=MAX_MODEL_LEN,
        input_len=INPUT_LEN,
        range_ratio=RANGE_RATIO,
        output_len=OUTPUT_LEN,
        seed=SEED,
        vllm_kvcache_space_gib=KVCACHE_SPACE_GIB,
        vllm_omp_threads_bind=omp_bind(plan.threads),
        vllm_serve=shlex.join(vllm_serve_command(plan.peer, plan.model_dir, plan.dtype, 0)),
        servedeck_serve=shlex.join(
            servedeck_serve_command(plan.servedeck_model, plan.dtype, plan.threads, 0, Path("HOME"))
        ),
        bench_serve=shlex.join(
            bench_command(
                plan.peer,
                "http://127.0.0.1:PORT",
                "NAME",
                plan.model_dir,
                sample,
                Path("raw"),
                "FILE",
            )
        ).replace("--num-prompts 0 --request-rate inf", "--num-prompts N --request-rate R"),
        peer_venv=str(plan.peer.path),
        vllm_version=plan.peer.vllm_version,
        peer_torch_version=plan.peer.torch_version,
        servedeck_commit=git_commit(),
    )


def run_all(plan: Plan, specs: list[WorkloadSpec]) -> Summary:
    from bench.machine import load_average

    load_start = load_average()
    before = probe_gflops(plan.threads, plan.dtype)
    records: list[RunRecord] = []
    results: dict[str, dict[Engine, list[BenchResult]]] = {}
    for spec in specs:
        results[spec.name] = {engine: [] for engine in ENGINES}
        for index in range(spec.runs):
            for engine in ENGINES:
                record = run_once(plan, engine, spec, index)
                records.append(record)
                results[spec.name][engine].append(read_result(plan.out / record.result_file))
    after = probe_gflops(plan.threads, plan.dtype)
    probe = Probe(before_gflops=before, after_gflops=after)
    shape = ModelShape.from_config(json.loads((plan.model_dir / "config.json").read_text()))
    return Summary(
        settings=settings_of(plan),
        shape=shape,
        probe=probe,
        load_average_start=load_start,
        load_average_end=load_average(),
        workloads=[summarize_workload(s, results[s.name], shape, probe) for s in specs],
        runs=records,
    )


def _rates(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--peer-venv", type=Path, required=True, help="bench/vllm/venv.sh DIR")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=DEFAULT_OUT,
        help=f"the Hugging Face folder both load, made if absent (default {DEFAULT_OUT})",
    )
    parser.add_argument("--gguf", type=Path, help="what the folder is made from (default: shipped)")
    parser.add_argument(
        "--servedeck-model",
        type=Path,
        help="what servedeck loads instead of --model-dir (the GGUF, say)",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--bursts", type=int, default=3, help="runs of the burst per engine")
    parser.add_argument("--burst", type=int, default=64, help="requests in a burst")
    parser.add_argument("--poisson-rates", type=_rates, default=[2.0, 4.0], help="req/s, a,b")
    parser.add_argument("--poisson-requests", type=int, default=200)
    parser.add_argument("--poisson-runs", type=int, default=2, help="runs per rate per engine")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="default bench/results/vllm/<dtype>")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="only check the peer: vLLM started once, 4 prompts, no servedeck, no summary",
    )
    return parser.parse_args(argv)


@contextmanager
def planned(
    peer: PeerVenv,
    model_dir: Path,
    servedeck_model: Path | None,
    dtype: str,
    threads: int,
    out: Path,
) -> Iterator[Plan]:
    """A run's plan with its folders made and a scratch folder for the servers' homes, removed
    afterwards."""
    with tempfile.TemporaryDirectory(prefix="servedeck-vllm-peer-") as tmp:
        plan = Plan(
            peer=peer,
            model_dir=model_dir.resolve(),
            servedeck_model=(servedeck_model or model_dir).resolve(),
            dtype=dtype,
            threads=threads,
            out=out.resolve(),  # the client runs in a folder of its own: a relative one misses
            work=Path(tmp),
        )
        plan.raw.mkdir(parents=True, exist_ok=True)
        plan.logs.mkdir(parents=True, exist_ok=True)
        yield plan


def run_plan(plan: Plan, run: Callable[[Plan], int], prog: str) -> int:
    """``run(plan)``'s exit code, or 1 with one line on stderr where a server or the client
    failed."""
    try:
        return run(plan)
    except (ServerError, ResultError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
    except subprocess.SubprocessError as error:
        print(f"{prog}: the client failed ({error}); see {plan.logs}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        peer = check_peer_venv(args.peer_venv)
    except PeerVenvError as error:
        print(f"side_by_side: {error}", file=sys.stderr)
        return 2
    model_dir = ensure_hf_model(args.model_dir, args.gguf)
    default_out = Path(tempfile.gettempdir()) / "servedeck-vllm-smoke" if args.smoke else None
    out: Path = args.out or default_out or ROOT / "bench" / "results" / "vllm" / args.dtype
    specs = workloads(
        args.bursts, args.burst, args.poisson_rates, args.poisson_requests, args.poisson_runs
    )
    summaries: list[Summary] = []

    def run(plan: Plan) -> int:
        if args.smoke:
            return smoke(plan)
        summaries.append(run_all(plan, specs))
        return 0

    with planned(peer, model_dir, args.servedeck_model, args.dtype, args.threads, out) as plan:
        code = run_plan(plan, run, "side_by_side")
    if summaries:
        print(write_summary(plan.out, summaries[0]))
    return code


def write_summary(out: Path, summary: Summary) -> str:
    """``summary.json`` and ``summary.md`` in ``out``; returns the markdown."""
    (out / "summary.json").write_text(summary.to_json())
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
