"""What schedules cost the rest of the server (issue 23, defect 1): a probe of the control
plane's own job, so it lives here rather than in bench/ (which may not import control/).

    python -m control.schedules.probe tick --schedules 1 100 --cron "0 9 * * *"
    python -m control.schedules.probe load --out bench/results/reliability/schedule-load.json

``tick``: in this process, on a migrated SQLite file of its own, the schedule job's ``tick()``
and ``GET /admin/schedules``'s ``list()`` timed with N stored schedules (rows written directly,
so a cron the API now refuses can be measured too); median of ``--ticks`` calls after one
warm-up call.

``load``: a real ``servedeck serve`` on 127.0.0.1 (the ``tiny`` checkpoint) and one bystander
client streaming completions back to back, first with no schedules, then with ``--schedules``
of them (created through the API, each a daily window of a few minutes that is not in force),
``--repeats`` times alternated; TTFT p50 and TPOT p50 of each phase, the ratios of their
medians, and how long ``GET /admin/schedules`` and ``/health`` took after each phase. Every
loop is bounded by its phase's ``--phase-s``.

The code measured is the one in the current folder (the server child gets it first on its
``PYTHONPATH``), so the same script measures another checkout when run from its root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

TOKEN = "schedule-load-admin-token-0123"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


# -- tick ------------------------------------------------------------------------------------


def tick_cost(count: int, cron: str, ticks: int) -> dict[str, float]:
    """Median ms of ``tick()`` and ``list()`` with ``count`` schedules of ``cron``."""
    from sqlmodel import Session

    from control import migrate
    from control.core.db import make_engine
    from control.metrics import ControlMetrics
    from control.models import Schedule
    from control.policy.rows import seed
    from control.policy.store import PolicyStore
    from control.schedules.store import Schedules
    from engine.config import EngineLimits

    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "ticks.db"
        migrate.upgrade(path)
        db = make_engine(path)
        with Session(db) as session:
            seed(session)
            for i in range(count):
                session.add(
                    Schedule(
                        cron=cron,
                        until="00:05",
                        timezone="UTC",
                        policy_name="dynamic",
                        reason=f"bench {i}",
                        actor="bench",
                    )
                )
            session.commit()
        metrics = ControlMetrics()
        store = PolicyStore(EngineLimits(16, 128, 512, 64, 2048), lambda *a, **k: None, metrics)
        schedules = Schedules(db, store, metrics)

        def timed(call: Callable[[], object]) -> float:
            call()  # warm-up: the first call searches every schedule's firings
            spans = []
            for _ in range(ticks):
                started = time.perf_counter()
                call()
                spans.append((time.perf_counter() - started) * 1e3)
            return round(statistics.median(spans), 2)

        def listed() -> None:
            with Session(db) as session:
                schedules.list(session)

        figures = {"schedules": count, "tick_ms": timed(schedules.tick), "list_ms": timed(listed)}
        db.dispose()
        return figures


# -- load ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Phase:
    schedules: int
    requests: int
    ttft_p50_s: float
    tpot_p50_ms: float
    list_ms_p50: float
    health_ms_p50: float


def _stream(http: httpx.Client, max_tokens: int) -> tuple[float, float] | None:
    """One streamed completion: (TTFT s, TPOT ms) or None when it failed."""
    body = {"prompt": "the quick brown fox", "max_tokens": max_tokens, "stream": True}
    body |= {"temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    stamps: list[float] = []
    with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return None
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return None
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return stamps[0] - started, tpot * 1e3


def _ms(http: httpx.Client, path: str, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    response = http.get(path, headers=headers)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1e3


PROBES = 20
"""``GET /admin/schedules`` and ``/health`` calls timed after each phase's streams."""


def _phase(
    http: httpx.Client, count: int, seconds: float, max_tokens: int, rounds: list[Phase]
) -> None:
    """Stream back to back for ``seconds`` (nothing else sent meanwhile), then time the probes;
    the figures are appended to ``rounds``."""
    ttfts, tpots = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        figures = _stream(http, max_tokens)
        if figures is not None:
            ttfts.append(figures[0])
            tpots.append(figures[1])
    lists = [_ms(http, "/admin/schedules", ADMIN) for _ in range(PROBES)]
    healths = [_ms(http, "/health", {}) for _ in range(PROBES)]
    rounds.append(
        Phase(
            schedules=count,
            requests=len(ttfts),
            ttft_p50_s=round(statistics.median(ttfts), 4),
            tpot_p50_ms=round(statistics.median(tpots), 2),
            list_ms_p50=round(statistics.median(lists), 2),
            health_ms_p50=round(statistics.median(healths), 2),
        )
    )


def _delete_all(http: httpx.Client) -> None:
    for item in http.get("/admin/schedules", headers=ADMIN).json()["items"]:
        http.delete(f"/admin/schedules/{item['id']}", headers=ADMIN).raise_for_status()


def _pooled(rounds: list[Phase], field: str) -> float:
    values: list[float] = [getattr(r, field) for r in rounds]
    return statistics.median(values)


def _create(http: httpx.Client, count: int, cron: str | None) -> None:
    """``count`` daily windows of five minutes, none in force for the next hours (or ``cron``)."""
    later = datetime.now(UTC) + timedelta(hours=6)
    for i in range(count):
        body = {
            "cron": cron or f"{i % 60} {later.hour} * * *",
            "until": (later + timedelta(minutes=i % 60 + 5)).strftime("%H:%M"),
            "policy": {"name": "dynamic"},
            "reason": f"bench window {i}",
        }
        response = http.post("/admin/schedules", json=body, headers=ADMIN)
        if response.status_code != 201:
            raise RuntimeError(f"schedule {i}: {response.status_code} {response.text}")


def run_load(
    count: int, cron: str | None, seconds: float, max_tokens: int, repeats: int
) -> dict[str, object]:
    """``repeats`` rounds of (no schedules, ``count`` schedules), alternated so the machine's
    drift falls on both; the ratios compare the medians of the rounds' p50s."""
    from bench import child_server
    from engine.checkpoint import init_model

    here = os.getcwd()  # the checkout measured: the child imports it first
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as root:
        workdir = Path(root)
        model_dir = init_model(workdir / "tiny", "tiny", seed=0)
        args = ["--num-threads", "1"]
        proc, url = child_server.start_server(model_dir, workdir, TOKEN, args)
        try:
            quiet: list[Phase] = []
            loaded: list[Phase] = []
            with httpx.Client(base_url=url, timeout=60) as http:
                _phase(http, 0, min(5.0, seconds), max_tokens, [])  # warm-up, not reported
                for _ in range(repeats):
                    _phase(http, 0, seconds, max_tokens, quiet)
                    _create(http, count, cron)
                    _phase(http, count, seconds, max_tokens, loaded)
                    _delete_all(http)
        finally:
            child_server.stop_server(proc)
    return {
        "code": here,
        "cron": cron or "daily, 5-64 min windows, not in force",
        "phase_s": seconds,
        "max_tokens": max_tokens,
        "quiet": [asdict(r) for r in quiet],
        "loaded": [asdict(r) for r in loaded],
        "ttft_ratio": round(_pooled(loaded, "ttft_p50_s") / _pooled(quiet, "ttft_p50_s"), 3),
        "tpot_ratio": round(_pooled(loaded, "tpot_p50_ms") / _pooled(quiet, "tpot_p50_ms"), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tick = sub.add_parser("tick", help="time tick() and list() in this process")
    tick.add_argument("--schedules", type=int, nargs="+", default=[1, 100])
    tick.add_argument("--cron", default="0 9 * * *")
    tick.add_argument("--ticks", type=int, default=20)
    load = sub.add_parser("load", help="a bystander's TTFT/TPOT without and with schedules")
    load.add_argument("--schedules", type=int, default=100)
    load.add_argument("--cron", help="one cron for all (default: daily windows)")
    load.add_argument("--phase-s", type=float, default=20.0)
    load.add_argument("--repeats", type=int, default=2)
    load.add_argument("--max-tokens", type=int, default=32)
    for each in (tick, load):
        each.add_argument("--out", type=Path, help="write the result JSON here")
    args = parser.parse_args(argv)
    if args.command == "tick":
        result: dict[str, object] = {
            "code": os.getcwd(),
            "cron": args.cron,
            "runs": [tick_cost(n, args.cron, args.ticks) for n in args.schedules],
        }
    else:
        result = run_load(args.schedules, args.cron, args.phase_s, args.max_tokens, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
