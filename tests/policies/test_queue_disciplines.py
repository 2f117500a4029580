"""Queue disciplines (issue 27): whose request goes first, composed with every batching policy.

The real engine, policies and block manager run on a fake clock (one second a step) with a
runner that computes nothing: admission order, aging, the VTC counters and their bound, the
fair queue's quota, priority preemption and a live switch fcfs -> fair -> priority.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.batch import ScheduledBatch, StepResult
from engine.config import EngineConfig, EngineLimits
from engine.errors import QueueFull, QuotaExceeded
from engine.front import QueuedPrompt
from engine.sampling_params import SamplingParams
from policies.queue import FairQueue, FcfsQueue, PriorityQueue, QueueSpec
from serving.engine import LLMEngine

POLICIES = ("static", "dynamic", "continuous", "hybrid")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class EchoRunner:
    last_forward_s = 0.0

    def execute(self, batch: ScheduledBatch) -> StepResult:
        return StepResult([7 for entry in batch.entries if entry.sample])


def make_engine(
    policy: str = "continuous",
    queue: QueueSpec | None = None,
    max_num_seqs: int = 2,
    max_wait_s: float | None = None,
    num_kv_blocks: int = 1024,
    max_waiting: int = 100_000,
) -> tuple[LLMEngine, Clock]:
    clock = Clock()
    limits = EngineLimits(
        block_size=16,
        num_kv_blocks=num_kv_blocks,
        max_model_len=1024,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
    )
    params: dict[str, object] = {"max_wait_s": max_wait_s}
    if policy in ("static", "dynamic"):
        params["max_batch_size"] = max_num_seqs
    config = EngineConfig(model="echo", max_waiting=max_waiting, memory_reserve=0.0)
    spec = {"name": policy, "params": params}
    engine = LLMEngine(config, EchoRunner(), limits, clock=clock, policy=spec, queue=queue)
    return engine, clock


def prompt(
    rid: str, priority: int = 0, tenant: str = "default", length: int = 20, out: int = 4
) -> QueuedPrompt:
    params = SamplingParams(max_tokens=out, temperature=0, ignore_eos=True)
    return QueuedPrompt([5] * length, params, rid, priority, tenant)


def run(engine: LLMEngine, clock: Clock, steps: int = 10_000) -> dict[str, float]:
    """Step until idle; each request's first scheduled time (the fake clock's second)."""
    started: dict[str, float] = {}
    for _ in range(steps):
        if not engine.has_unfinished_requests():
            return started
        for out in engine.step():
            if out.finished:
                assert out.metrics.first_scheduled_time is not None
                started[out.request_id] = out.metrics.first_scheduled_time
        clock.now += 1.0
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("policy", POLICIES)
@given(priorities=st.lists(st.integers(-5, 5), min_size=2, max_size=12))
def test_priority_order_is_respected_at_admission(policy: str, priorities: list[int]) -> None:
    engine, clock = make_engine(policy, PriorityQueue())
    engine.add_requests([prompt(f"r{i}", p) for i, p in enumerate(priorities)])
    started = run(engine, clock)
    for i, a in enumerate(priorities):
        for j, b in enumerate(priorities):
            if a < b:
                assert started[f"r{i}"] <= started[f"r{j}"], (policy, priorities)


@pytest.mark.parametrize("policy", POLICIES)
def test_fcfs_keeps_the_policys_own_order_whatever_the_priority(policy: str) -> None:
    engine, clock = make_engine(policy, FcfsQueue(), max_num_seqs=1)
    engine.add_requests([prompt(f"r{i}", priority=10 - i) for i in range(5)])
    started = run(engine, clock)
    assert sorted(started, key=started.__getitem__) == [f"r{i}" for i in range(5)]


@pytest.mark.parametrize("policy", POLICIES)
def test_aging_bounds_the_wait_of_the_lowest_priority(policy: str) -> None:
    """A stream of priority-0 requests keeps the batch full; the priority-10 request waits
    no longer than ``max_wait_s`` plus the time the batch in flight takes."""
    engine, clock = make_engine(policy, PriorityQueue(), max_num_seqs=1, max_wait_s=10.0)
    engine.add_requests([prompt("low", priority=10)])
    started: dict[str, float] = {}
    for step in range(200):
        if step < 150:
            engine.add_requests([prompt(f"hi{step}", priority=0)])
        for out in engine.step():
            if out.finished and out.metrics.first_scheduled_time is not None:
                started[out.request_id] = out.metrics.first_scheduled_time
        clock.now += 1.0
    assert "low" in started
    assert started["low"] <= 10.0 + 8.0


def test_without_aging_the_lowest_priority_waits_behind_the_stream() -> None:
    """The contrast that makes the aging test meaningful."""
    engine, clock = make_engine("continuous", PriorityQueue(), max_num_seqs=1)
    engine.add_requests([prompt("low", priority=10)])
    for step in range(60):
        engine.add_requests([prompt(f"hi{step}", priority=0)])
        assert all(out.request_id != "low" for out in engine.step())
        clock.now += 1.0


def service(engine: LLMEngine, tenant: str, cost: FairQueue) -> float:
    account = next(a for a in engine.tenants.accounts() if a.name == tenant)
    return cost.input_weight * account.input_tokens + cost.output_weight * account.output_tokens


arrivals = st.lists(
    st.tuples(
        st.integers(0, 3),  # step it arrives at
        st.sampled_from("AB"),
        st.integers(4, 120),  # prompt tokens
        st.integers(1, 24),  # output tokens
    ),
    min_size=8,
    max_size=60,
)


@given(arrivals=arrivals)
def test_fair_counters_never_decrease_and_backlogged_service_stays_within_the_vtc_bound(
    arrivals: list[tuple[int, str, int, int]],
) -> None:
    """VTC's bound (Sheng et al., Theorem 4.3): over an interval in which two tenants are both
    backlogged, their weighted services differ by at most 2 * U, U = max(w_in * L_in, w_out *
    M), L_in the longest prompt and M the most output tokens the batch can hold (here
    max_num_seqs times the longest output, every request running to its length)."""
    fair = FairQueue()
    num_seqs = 4
    engine, clock = make_engine("continuous", fair, max_num_seqs=num_seqs)
    bound = 2 * max(fair.input_weight * 120, fair.output_weight * num_seqs * 24)
    counters: dict[str, float] = {}
    since: tuple[float, float] | None = None
    for step in range(2_000):
        for i, (at, tenant, length, out) in enumerate(arrivals):
            if at == step:
                engine.add_requests([prompt(f"{tenant}{i}", 0, tenant, length, out)])
        engine.step()
        clock.now += 1.0
        accounts = {a.name: a for a in engine.tenants.accounts()}
        for name, account in accounts.items():
            assert account.counter >= counters.get(name, 0.0)
            counters[name] = account.counter
        both = len(accounts) == 2 and all(a.backlogged for a in accounts.values())
        if both and since is None:
            since = (service(engine, "A", fair), service(engine, "B", fair))
        elif both and since is not None:
            served_a = service(engine, "A", fair) - since[0]
            served_b = service(engine, "B", fair) - since[1]
            assert abs(served_a - served_b) <= bound
        elif not both:
            since = None
        if not engine.has_unfinished_requests() and step > 3:
            break


def test_fair_serves_the_light_tenant_first_and_fcfs_does_not() -> None:
    """A floods 40 requests, then B sends 4: under fair B's requests start within the first
    few admissions; under fcfs they wait behind all of A's."""

    def b_start(queue: QueueSpec) -> float:
        engine, clock = make_engine("continuous", queue, max_num_seqs=2)
        engine.add_requests([prompt(f"a{i}", tenant="A") for i in range(40)])
        engine.add_requests([prompt(f"b{i}", tenant="B") for i in range(4)])
        started = run(engine, clock)
        return max(started[f"b{i}"] for i in range(4))

    fair, fcfs = b_start(FairQueue()), b_start(FcfsQueue())
    assert fair <= 12.0
    assert fcfs >= 80.0


def test_fair_weights_split_the_service_two_to_one() -> None:
    fair = FairQueue(weights={"A": 2.0})
    engine, clock = make_engine("continuous", fair, max_num_seqs=3)
    engine.add_requests([prompt(f"a{i}", tenant="A", out=8) for i in range(300)])
    engine.add_requests([prompt(f"b{i}", tenant="B", out=8) for i in range(300)])
    for _ in range(300):  # both stay backlogged throughout
        engine.step()
        clock.now += 1.0
    ratio = service(engine, "A", fair) / service(engine, "B", fair)
    assert 1.8 <= ratio <= 2.2


def test_a_new_tenant_starts_at_the_smallest_backlogged_counter() -> None:
    """No banked credit: B arrives late and is lifted to A's counter, so it does not take
    every slot until it has caught up with all A was served."""
    fair = FairQueue()
    engine, clock = make_engine("continuous", fair, max_num_seqs=2)
    engine.add_requests([prompt(f"a{i}", tenant="A") for i in range(60)])
    for _ in range(40):
        engine.step()
        clock.now += 1.0
    a_counter = engine.tenants.counter("A")
    assert a_counter > 0
    engine.add_requests([prompt(f"b{i}", tenant="B") for i in range(30)])
    engine.step()
    assert engine.tenants.counter("B") >= a_counter


def test_fair_quota_refuses_the_flooding_tenant_and_lets_its_neighbour_in() -> None:
    engine, _ = make_engine("continuous", FairQueue(tenant_quota=0.25), max_waiting=20)
    engine.add_requests([prompt(f"a{i}", tenant="A") for i in range(5)])
    with pytest.raises(QuotaExceeded, match="'A'"):
        engine.add_requests([prompt("a-more", tenant="A")])
    engine.add_requests([prompt(f"b{i}", tenant="B") for i in range(5)])  # B still gets in
    with pytest.raises(QueueFull):
        engine.add_requests([prompt(f"a{i}-batch", tenant="A") for i in range(2)])
    accounts = {a.name: a for a in engine.tenants.accounts()}
    assert accounts["A"].refused == 3 and accounts["B"].refused == 0
    assert accounts["A"].queued == 5 and accounts["B"].queued == 5


def test_fcfs_has_no_quota() -> None:
    engine, _ = make_engine("continuous", FcfsQueue(), max_waiting=20)
    engine.add_requests([prompt(f"a{i}", tenant="A") for i in range(20)])
    with pytest.raises(QueueFull) as refused:
        engine.add_requests([prompt("a-more", tenant="A")])
    assert not isinstance(refused.value, QuotaExceeded)


def test_tenant_names_are_bounded_in_number() -> None:
    engine, _ = make_engine("continuous", FairQueue())
    engine.tenants.max_tenants = 3
    engine.add_requests([prompt(f"r{i}", tenant=f"t{i}") for i in range(6)])
    names = [a.name for a in engine.tenants.accounts()]
    assert names == ["t0", "t1", "t2", "other"]


@pytest.mark.parametrize("policy", ["continuous", "hybrid"])
def test_priority_preemption_lets_an_urgent_request_take_a_full_batchs_place(
    policy: str,
) -> None:
    engine, clock = make_engine(policy, PriorityQueue(preempt=True), max_num_seqs=1)
    engine.add_requests([prompt("batch", priority=10, out=50)])
    for _ in range(5):
        engine.step()
        clock.now += 1.0
    engine.add_requests([prompt("urgent", priority=0, out=3)])
    finished: dict[str, float] = {}
    outputs: dict[str, int] = {}
    for _ in range(200):
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = clock.now
                outputs[out.request_id] = len(out.token_ids)
        clock.now += 1.0
        if not engine.has_unfinished_requests():
            break
    assert finished["urgent"] < finished["batch"]
    assert finished["urgent"] <= 5 + 6  # not behind the 50-token request
    assert engine.policy.num_preemptions == 1
    assert outputs == {"batch": 50, "urgent": 3}  # the preempted one lost nothing


def test_without_preempt_the_urgent_request_waits_for_the_batch() -> None:
    engine, clock = make_engine("continuous", PriorityQueue(), max_num_seqs=1)
    engine.add_requests([prompt("batch", priority=10, out=50)])
    engine.step()
    engine.add_requests([prompt("urgent", priority=0, out=3)])
    started = run(engine, clock)
    assert started["urgent"] >= 45  # after the 50-token request, not beside it


def test_under_memory_pressure_the_victim_is_the_lowest_priority() -> None:
    """A dry pool preempts the running sequence with the highest priority value, not the
    newest one."""
    engine, clock = make_engine("continuous", PriorityQueue(), max_num_seqs=3, num_kv_blocks=12)
    engine.add_requests([prompt("low", priority=9, length=40, out=60)])
    engine.step()
    engine.add_requests([prompt(f"hi{i}", priority=0, length=40, out=60) for i in range(2)])
    preempted: set[str] = set()
    for _ in range(400):
        engine.step()
        preempted |= {r.id for r in engine.snapshot().requests if r.preemptions}
        clock.now += 1.0
        if not engine.has_unfinished_requests():
            break
    assert preempted == {"low"}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_live_switch_fcfs_fair_priority_under_load_loses_nothing(policy: str) -> None:
    engine, clock = make_engine(policy, FcfsQueue(), max_num_seqs=3)
    queues: list[QueueSpec] = [FairQueue(weights={"A": 3.0}), PriorityQueue(preempt=True)]
    sent: dict[str, int] = {}
    got: dict[str, int] = {}
    counters: dict[str, float] = {}
    for step in range(400):
        if step < 60:
            for tenant in "AB":
                rid = f"{tenant}{step}"
                sent[rid] = 1 + step % 7
                engine.add_requests([prompt(rid, step % 3, tenant, 10 + step % 50, sent[rid])])
        if step in (20, 40):
            engine.set_policy(engine.policy_spec, queue=queues.pop(0))
        for out in engine.step():
            assert out.finish_reason in (None, "length")
            if out.finished:
                got[out.request_id] = len(out.token_ids)  # every token so far
        for account in engine.tenants.accounts():
            assert account.counter >= counters.get(account.name, 0.0)
            counters[account.name] = account.counter
        clock.now += 1.0
        if step > 60 and not engine.has_unfinished_requests():
            break
    assert engine.queue_spec == PriorityQueue(preempt=True)
    assert got == sent
    assert engine.kv_stats().used == 0
    tenants = {t.name: t for t in engine.snapshot().tenants}
    assert tenants["A"].output_tokens == sum(n for r, n in sent.items() if r[0] == "A")
    assert all(t.waiting == 0 and t.running == 0 for t in tenants.values())
