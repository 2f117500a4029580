"""``servedeck``: the one entry point. Every subcommand imports its floor lazily."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

if TYPE_CHECKING:
    from control.core.config import Settings


GENERATE_FLAGS = (
    "policy",
    "device",
    "dtype",
    "block_size",
    "num_kv_blocks",
    "memory_reserve",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "attention_backend",
    "native_attention",
    "packed_products",
    "tensor_parallel_size",
    "tokenizer",
)
"""EngineConfig fields ``servedeck generate`` takes as flags (defaults: EngineConfig's)."""


def add_config_flags(
    parser: argparse.ArgumentParser, names: Sequence[str], overrides: Sequence[str] = ()
) -> None:
    """A flag per EngineConfig field, with its type, choices and help from the field.

    ``overrides`` given (serve, up): every flag is None by default so the environment and the
    policy store decide; the help says which default applies. Otherwise (generate) the flag's
    default is EngineConfig's."""
    from engine.config import config_options
    from policies.base import PolicyName

    serving = bool(overrides)
    for name in names:
        option = config_options()[name]
        default = None if serving else option.default
        if name in overrides:
            note = " (default: the stored policy version's; this overrides it)"
        elif option.default is None:
            note = ""
        else:
            note = f" (default {option.default})"
        # Any: add_argument's keyword arguments
        kind: dict[str, Any] = (
            {"action": argparse.BooleanOptionalAction} if option.type is bool else {}
        )
        if option.type in (int, float):
            kind["type"] = option.type
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            default=default,
            choices=get_args(PolicyName) if name == "policy" else option.choices,
            help=option.help + note,
            **kind,
        )


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="HF model folder or GGUF file (default: the embedded one)")
    add_config_flags(parser, GENERATE_FLAGS)


def cmd_init_model(args: argparse.Namespace) -> int:
    from engine.checkpoint import PRESETS, init_model

    path = init_model(args.dir, args.preset, args.seed)
    params = PRESETS[args.preset].num_parameters()
    print(f"wrote {args.preset} checkpoint ({params / 1e6:.1f}M parameters) to {path}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.sampling_params import SamplingParams
    from serving.llm import LLM

    llm = LLM(args.model, **{name: getattr(args, name) for name in GENERATE_FLAGS})
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    for output in llm.generate(args.prompt, params):
        print(output.text)
        m = output.metrics
        print(
            f"[{len(output.token_ids)} tokens, finish={output.finish_reason}, "
            f"ttft={_ms(m.ttft)}, e2e={_ms(m.e2e)}]",
            file=sys.stderr,
        )
    return 0


def _add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Unset flags stay None so the environment and the policy store decide; the engine's
    flags come from EngineConfig's fields (``add_config_flags``)."""
    add = parser.add_argument
    add("--model", help="Hugging Face model folder or GGUF file (default: the embedded one)")
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port (default 8000)")
    add("--db", help="SQLite file (default: <cache>/servedeck.db)")
    add("--admin-token", help="admin bearer token (default: $SERVEDECK_ADMIN_TOKEN or generated)")
    add("--admin-token-file", help="file holding the admin token ($SERVEDECK_ADMIN_TOKEN_FILE)")
    add("--api-key", help="API key /v1 requires as a bearer token ($SERVEDECK_API_KEY; off)")
    add("--api-key-file", help="file holding the API key ($SERVEDECK_API_KEY_FILE)")
    add("--reclaim-interval-s", type=float, help="override of the stored sweep interval")
    add("--cors-allow-origins", help="comma-separated origins allowed by CORS (default: off)")
    add("--served-model-name", help="the model name clients use (default: the folder name)")
    add("--cost-model", help="profile (gpu/model) or calibration file dry runs predict with")
    add("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    from control.core.config import DEMO_LOAD_RATE

    add(
        "--demo-load",
        type=float,
        nargs="?",
        const=DEMO_LOAD_RATE,
        metavar="RATE",
        help=f"send a demo load to itself, RATE requests/s (default {DEMO_LOAD_RATE:g}; off)",
    )
    add(
        "--replicas",
        type=int,
        help="engine replicas on Ray Serve (pip install 'servedeck[distributed]')",
    )
    add("--ray-address", help="Ray instance to join with --replicas (default: a local one)")
    add("--ray-app-name", help="the Ray Serve application's name (default servedeck)")
    add("--min-replicas", type=int, help="autoscaling floor (with --max-replicas)")
    add(
        "--max-replicas", type=int, help="autoscaling ceiling: Ray Serve scales by ongoing requests"
    )
    add("--target-ongoing-requests", type=float, help="autoscaling: requests per replica (8)")
    from control.chat.tools import TOOL_FORMATS
    from control.core.config import ENGINE_SETTINGS, POLICY_OVERRIDES, Settings

    add(
        "--expose-text",
        action=argparse.BooleanOptionalAction,
        help=f"{Settings.model_fields['expose_text'].description} (default: off)",
    )

    add(
        "--tool-call-parser",
        choices=TOOL_FORMATS,
        help=Settings.model_fields["tool_call_parser"].description,
    )
    for name in SERVER_LIMITS:  # help and default from the setting itself, defined once there
        field = Settings.model_fields[name]
        kind = type(field.default)
        add(f"--{name.replace('_', '-')}", type=kind, help=f"{field.description} ({field.default})")
    add_config_flags(parser, (*POLICY_OVERRIDES, *ENGINE_SETTINGS), overrides=POLICY_OVERRIDES)


SERVER_LIMITS = (
    "drain_timeout_s",
    "stall_timeout_s",
    "policy_apply_timeout_s",
    "prediction_timeout_s",
    "prediction_max_requests",
    "max_body_bytes",
    "max_json_depth",
    "max_stop_strings",
    "max_stop_length",
    "max_schedules",
    "max_batch_prompts",
    "max_request_tokens",
    "max_logprob_entries",
    "chat_template_timeout_s",
    "max_chat_template_output",
    "chat_template_workers",
    "fleet_drain_timeout_s",
    "prefix_probe_timeout_s",
)
"""Server settings with a default whose flag, type and help are read from ``Settings``."""


_NOT_SETTINGS = {"command", "func", "db_command", "no_console"}


def _settings(args: argparse.Namespace) -> Settings:
    """Flags over ``SERVEDECK_*`` variables over defaults; a bad value exits with status 2."""
    from pydantic import ValidationError

    from control.core.config import Settings

    given = {k: v for k, v in vars(args).items() if v is not None and k not in _NOT_SETTINGS}
    try:
        return Settings(**given)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"servedeck {args.command}: {problems}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from control.server import serve

    settings = _settings(args)
    if settings.replicas is not None and not _has_ray():
        print(
            "servedeck serve: --replicas runs the engines on Ray Serve, which is not installed:"
            " pip install 'servedeck[distributed]'",
            file=sys.stderr,
        )
        return 2
    return serve(settings)


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None  # not ray.serve: that imports ray


def cmd_up(args: argparse.Namespace) -> int:
    from control.up import up

    return up(_settings(args), args, console=not args.no_console)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from control import migrate

    settings = _settings(args)
    path = settings.db_path()
    migrate.upgrade(path)
    print(f"{path}: at revision {migrate.current_revision(path)}")
    return 0


def cmd_tui(args: argparse.Namespace) -> int:
    from tui.app import run_console

    token = args.token or os.environ.get("SERVEDECK_ADMIN_TOKEN") or _local_admin_token(args.db)
    run_console(url=args.url, token=token, refresh=args.refresh, read_only=args.read_only)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from engine.config import EngineConfig
    from engine.shipped_models import embedded_default
    from sim.calibrate import DEFAULT_GRID, QUICK_GRID, calibrate, write
    from sim.calibrations import store

    config = EngineConfig(
        model=str(args.model or embedded_default()),
        device=args.device,
        dtype=args.dtype,
        num_threads=args.threads,
        native_attention=args.native_attention,
    )
    grid = QUICK_GRID if args.quick else DEFAULT_GRID
    print(
        f"calibrating {config.model} ({config.weights_dtype}): "
        f"{len(grid)} step shapes x {args.repeats} repeats"
    )
    data = calibrate(config, grid, args.repeats, progress=print)
    paths = [write(args.out, data)] if args.out else []
    if args.store:
        paths.append(store(data))
    fit = data["fit"]
    print(
        f"wrote {', '.join(map(str, paths)) or 'nothing (--no-store, no --out)'}: "
        f"mean |error| {fit['mean_abs_rel_error']:.1%}, max {fit['max_abs_rel_error']:.1%}; "
        + ", ".join(f"{k}={v:.3g}" for k, v in fit["coefficients"].items())
    )
    machine = data["machine"]
    print(
        f"of model {data['model']['hash']}, {machine['dtype']}, {machine['attention']} "
        f"attention, CPU {machine['cpu']}"
    )
    return 0


def _ms(seconds: float | None) -> str:
    """A latency in milliseconds (``-`` where the output has none)."""
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def cmd_admin(args: argparse.Namespace) -> int:
    """``servedeck policy|schedule|guardrail|fleet ...``: the admin API over HTTP."""
    from control.core.rest_cli import run

    return run(args, local_token=lambda: _local_admin_token(args.db))


def _local_admin_token(db: str | None) -> str | None:
    """The token a local ``servedeck serve`` saved beside its database, if there is one."""
    from control.core.config import Settings
    from control.server import token_file

    path = token_file((Settings(db=Path(db)) if db else Settings()).db_path())
    return path.read_text().strip() if path.is_file() else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servedeck", description="LLM serving with switchable batching policies."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init-model", help="write a random-weight Llama checkpoint")
    p.add_argument("dir")
    p.add_argument("--preset", default="small", choices=["tiny", "small", "llama3-8b"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_init_model)

    p = sub.add_parser("generate", help="generate offline from one or more prompts")
    _add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="repeat for several")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("serve", help="run the HTTP server (REST API, admin API, metrics)")
    _add_serve_args(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("up", help="serve in a child process and open the admin console")
    _add_serve_args(p)
    p.add_argument("--no-console", action="store_true", help="only serve, until Ctrl-C")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("tui", help="the admin console, against a running server")
    p.add_argument("--url", help="server URL (default http://127.0.0.1:8000)")
    p.add_argument("--token", help="admin token (default: $SERVEDECK_ADMIN_TOKEN or local file)")
    p.add_argument("--db", help="local server's SQLite file, to find its saved admin token")
    p.add_argument("--refresh", type=float, help="seconds between polls (default 1.0)")
    p.add_argument("--read-only", action="store_true", help="hide every action that changes")
    p.set_defaults(func=cmd_tui)

    from control.fleet import cli as fleet_cli
    from control.guardrail import cli as guardrail_cli
    from control.policy import cli as policy_cli
    from control.schedules import cli as schedule_cli

    for admin_cli in (policy_cli, schedule_cli, guardrail_cli, fleet_cli):
        admin_cli.add_parser(sub, cmd_admin)

    from bench.cli import DEFAULT_THREADS
    from bench.cli import add_parser as add_bench_parser

    add_bench_parser(sub)

    from bench.simulate import add_parser as add_simulate_parser

    add_simulate_parser(sub)

    from bench.load_cli import add_parser as add_load_parser

    add_load_parser(sub)

    p = sub.add_parser("calibrate", help="fit a step cost model to this engine on this machine")
    p.add_argument("--model", help="model folder or GGUF file (default: the embedded one)")
    p.add_argument(
        "--threads", type=int, default=DEFAULT_THREADS, help="torch threads (default: bench's)"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="auto", help="as serve's --dtype (default auto)")
    p.add_argument(
        "--native-attention",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as serve's: the native paged decode kernel on CPU (default on)",
    )
    p.add_argument("--repeats", type=int, default=5, help="timings per step shape (median)")
    p.add_argument("--quick", action="store_true", help="a small grid (seconds, for tests)")
    p.add_argument("--out", help="also write the calibration JSON here")
    p.add_argument(
        "--store",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store it under $SERVEDECK_HOME/calibrations, where serve finds it (default on)",
    )
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("db", help="database maintenance")
    db_sub = p.add_subparsers(dest="db_command", required=True)
    p = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    p.add_argument("--db", help="SQLite file (default: <cache>/servedeck.db)")
    p.set_defaults(func=cmd_db_upgrade)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
