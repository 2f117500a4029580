"""The preemption victim in the order docs/fairness.md gives, under every discipline (issue 42).

The lowest priority first (the highest value), then the tenant most over its share (the most
weighted service: VTC's counter), then the latest arrival; among sequences equal in all three,
the last in the running list. A property test over running sets with tied priorities, tenants
of tied service and tied arrival times: the discipline's choice is the documented order's first.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.tenants import ServiceCost, TenantLedger
from policies.discipline import make_discipline
from policies.queue import FairQueue, FcfsQueue, PriorityQueue, QueueSpec

TENANTS = ("a", "b", "c")
WEIGHTS = (0.5, 1.0, 2.0, 4.0)
"""Powers of two: the ledger's per-token sums are exact, so tied service stays tied."""
QUEUES: tuple[QueueSpec, ...] = (
    FcfsQueue(),
    PriorityQueue(),
    PriorityQueue(preempt=True),
    FairQueue(),
)

running_sets = st.lists(
    st.tuples(
        st.integers(-2, 2),  # priority
        st.sampled_from(TENANTS),
        st.sampled_from((0.0, 1.0, 2.0, 3.0)),  # arrival time
    ),
    min_size=1,
    max_size=10,
)
services = st.fixed_dictionaries(
    {t: st.tuples(st.integers(0, 3), st.integers(0, 3), st.sampled_from(WEIGHTS)) for t in TENANTS}
)
"""Per tenant: prompt tokens and output tokens served (in tens), and its share weight."""


def ledger_of(service: dict[str, tuple[int, int, float]]) -> TenantLedger:
    """A ledger that has served each tenant as ``service`` says, under its weights."""
    ledger = TenantLedger()
    ledger.configure(ServiceCost(weights={t: w for t, (_, _, w) in service.items()}))
    for account in ledger.admit(list(service), None):
        prompt, output, _ = service[account.name]
        ledger.charge_prompt(account, 10 * prompt)
        for _ in range(10 * output):
            account.charge_output()
    return ledger


def documented_victim(
    running: list[Sequence], service: dict[str, tuple[int, int, float]]
) -> Sequence:
    """docs/fairness.md's order, worked out from the raw service, not the ledger's counter."""
    cost = ServiceCost()

    def over_share(tenant: str) -> float:
        prompt, output, weight = service[tenant]
        return 10 * (cost.input_weight * prompt + cost.output_weight * output) / weight

    lowest = max(s.priority for s in running)
    left = [s for s in running if s.priority == lowest]
    most = max(over_share(s.tenant) for s in left)
    left = [s for s in left if over_share(s.tenant) == most]
    latest = max(s.arrival_time for s in left)
    return [s for s in left if s.arrival_time == latest][-1]


@settings(max_examples=300, deadline=None)
@given(running_sets, services)
def test_the_victim_is_the_documented_orders_first_under_every_discipline(
    rows: list[tuple[int, str, float]], service: dict[str, tuple[int, int, float]]
) -> None:
    running = [
        Sequence(f"s{i}", [1, 2, 3], SamplingParams(), arrival, priority=priority, tenant=tenant)
        for i, (priority, tenant, arrival) in enumerate(rows)
    ]
    expected = documented_victim(running, service)
    for queue in QUEUES:
        discipline = make_discipline(queue, ledger_of(service))
        assert discipline.victim(list(running)) is expected, queue


def test_priority_comes_before_the_tenant_and_the_tenant_before_arrival() -> None:
    """The three keys in their order, one pair at a time, under every discipline."""
    service = {"a": (3, 3, 1.0), "b": (0, 0, 1.0), "c": (0, 0, 1.0)}  # a is far over its share
    params = SamplingParams()
    late_b = Sequence("late-b", [1], params, 9.0, priority=0, tenant="b")
    greedy_a = Sequence("greedy-a", [1], params, 1.0, priority=0, tenant="a")
    low_c = Sequence("low-c", [1], params, 0.0, priority=5, tenant="c")
    for queue in QUEUES:
        discipline = make_discipline(queue, ledger_of(service))
        assert discipline.victim([low_c, greedy_a, late_b]) is low_c, queue
        assert discipline.victim([greedy_a, late_b]) is greedy_a, queue
        early_b = Sequence("early-b", [1], params, 0.0, priority=0, tenant="b")
        assert discipline.victim([late_b, early_b]) is late_b, queue
