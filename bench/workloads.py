"""Seeded request lists. Every policy and peer in one bench run gets the very same list.

Lengths are the seed article's, divided by the preset's ``scale`` (1 = unscaled, for GPUs).
Prompts are random token ids: with random weights the text carries no meaning, and random ids
never share a prefix, so the prefix cache cannot flatter any policy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from engine.tenants import DEFAULT_PRIORITY, DEFAULT_TENANT

FIRST_TOKEN_ID = 2  # ids 0 and 1 are the checkpoints' BOS and EOS


@dataclass(frozen=True, slots=True)
class Request:
    prompt: tuple[int, ...]
    max_tokens: int
    arrival: float = 0.0
    """Seconds after the run starts (open loop); ignored when the workload has clients."""
    tag: str = ""
    tenant: str = DEFAULT_TENANT
    priority: int = DEFAULT_PRIORITY


@dataclass(frozen=True, slots=True)
class Workload:
    """``clients`` set: a closed loop of that many clients, each sending its next request when
    its previous one has finished. Otherwise requests arrive at their ``arrival`` times."""

    name: str
    requests: tuple[Request, ...]
    clients: int | None = None
    rate: float | None = None

    @property
    def concurrency(self) -> int:
        return self.clients or len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.prompt) for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)

    @property
    def fixed_output(self) -> bool:
        return len({r.max_tokens for r in self.requests}) <= 1

    def with_poisson_arrivals(self, rate: float, seed: int) -> Workload:
        """The same requests arriving as a Poisson process of ``rate`` requests per second."""
        rng = random.Random(seed)
        now, timed = 0.0, []
        for request in self.requests:
            timed.append(replace(request, arrival=now))
            now += rng.expovariate(rate)
        return Workload(f"poisson-{self.name}", tuple(timed), rate=rate)

    def closed_loop(self, clients: int, num_requests: int | None = None) -> Workload:
        requests = self.requests[: num_requests or len(self.requests)]
        return Workload(self.name, requests, clients=clients)

    def head(self, num_requests: int) -> Workload:
        return replace(self, requests=self.requests[:num_requests])


@dataclass(frozen=True, slots=True)
class Span:
    """Inclusive integer range of lengths, in unscaled tokens."""

    lo: int
    hi: int

    def scaled(self, scale: float) -> Span:
        return Span(max(1, round(self.lo / scale)), max(1, round(self.hi / scale)))

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)


# The seed article's shapes (unscaled tokens).
SEED_INPUT = Span(500, 2000)
SEED_FIXED_OUTPUT = Span(200, 200)
SEED_VARIABLE_OUTPUT = Span(40, 360)
LONG_OUTPUT = Span(1000, 2000)
SHORT_INPUT = Span(50, 300)
LONG_INPUT = Span(3000, 6000)
SHORT_LONG_OUTPUT = Span(100, 100)


def _prompt(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length))


def uniform(
    name: str,
    num_requests: int,
    inputs: Span,
    outputs: Span,
    vocab_size: int,
    seed: int,
) -> Workload:
    """All requests at t=0 (a burst), lengths uniform in the given spans."""
    rng = random.Random(f"{name}:{num_requests}:{seed}")
    requests = []
    for _ in range(num_requests):
        prompt = _prompt(rng, inputs.draw(rng), vocab_size)
        requests.append(Request(prompt, outputs.draw(rng)))
    return Workload(name, tuple(requests))


def burst(
    num_requests: int, variable_output: bool, scale: float, vocab_size: int, seed: int
) -> Workload:
    """The article's experiment: input 500-2000, output 200 (or 40-360), all at t=0."""
    outputs = SEED_VARIABLE_OUTPUT if variable_output else SEED_FIXED_OUTPUT
    name = "burst-variable" if variable_output else "burst-fixed"
    return uniform(
        name, num_requests, SEED_INPUT.scaled(scale), outputs.scaled(scale), vocab_size, seed
    )


def long_output(num_requests: int, scale: float, vocab_size: int, seed: int) -> Workload:
    """The article's inputs with long outputs: under overload the decodes' growth outruns
    the blocks that finishing requests give back, which is when a reserve matters."""
    return uniform(
        "long-output",
        num_requests,
        SEED_INPUT.scaled(scale),
        LONG_OUTPUT.scaled(scale),
        vocab_size,
        seed,
    )


def short_long(
    num_requests: int, long_share: float, scale: float, vocab_size: int, seed: int
) -> Workload:
    """Mostly short prompts with a few very long ones at seeded places in the burst."""
    rng = random.Random(f"short-long:{num_requests}:{seed}")
    num_long = max(1, round(num_requests * long_share))
    long_at = set(rng.sample(range(num_requests), num_long))
    short, long, output = (s.scaled(scale) for s in (SHORT_INPUT, LONG_INPUT, SHORT_LONG_OUTPUT))
    requests = []
    for i in range(num_requests):
        is_long = i in long_at
        prompt = _prompt(rng, (long if is_long else short).draw(rng), vocab_size)
        requests.append(Request(prompt, output.draw(rng), tag="long" if is_long else "short"))
    return Workload("short-long", tuple(requests))


def mixed(
    num_requests: int, inputs: Span, output_tokens: int, vocab_size: int, seed: int
) -> Workload:
    """Issue 2's performance workload: prompts uniform in 32-512, 64 new tokens, a burst."""
    return uniform(
        "mixed", num_requests, inputs, Span(output_tokens, output_tokens), vocab_size, seed
    )
