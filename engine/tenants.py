"""Who a request belongs to and how much service each tenant has had: the tenant ledger.

A request carries a tenant name (the API key that authenticated it, else the OpenAI ``user``
field, else ``default``) and a priority (vLLM's meaning: lower is served earlier). The engine
keeps one ``TenantAccount`` per tenant name in its ``TenantLedger``; the queue disciplines
(``policies/discipline.py``) read it to decide whose request goes first. The ledger belongs
to the engine, not to a policy, so a policy or queue switch carries every counter across.

The counter is the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language
Models" (OSDI'24): a tenant's weighted service, ``(input_weight * prompt tokens +
output_weight * output tokens) / weight``. A prompt is charged whole when its request is first
scheduled, an output token when it is sampled. A tenant that becomes backlogged (its first
request waiting) is lifted to the smallest counter among the backlogged tenants (to the counter
of the last one to leave the backlog when there is none), so idleness banks no credit.
Counters never decrease.

Names are bounded: at most ``MAX_TENANT_NAME`` characters (longer ones are refused where the
request comes in) and ``MAX_TENANTS`` distinct names; a request of a name beyond that counts
as ``OTHER_TENANT``.

Threads: ``admit`` and ``release`` (the per-tenant count of requests not yet scheduled, which
the fair queue's quota reads) run under the ledger's lock, from the adding thread and the
engine's; every counter changes on the engine's thread only (``join``, ``charge_prompt``, the
step's output charges).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.errors import QuotaExceeded

DEFAULT_TENANT = "default"
"""The tenant of a request that names none (no named API key, no ``user``)."""
OTHER_TENANT = "other"
"""Where requests of tenants beyond ``MAX_TENANTS`` distinct names are counted."""
MAX_TENANT_NAME = 64
MAX_TENANTS = 1024
DEFAULT_PRIORITY = 0
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
"""A request's priority bounds (lower is served earlier, as in vLLM)."""


@dataclass(frozen=True, slots=True)
class ServiceCost:
    """What a served token costs a tenant's counter: VTC's input and output token weights,
    divided by the tenant's share weight (``weights``, else ``default_weight``)."""

    input_weight: float = 1.0
    output_weight: float = 2.0
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)


@dataclass(slots=True, eq=False)
class TenantAccount:
    """One tenant's service so far. ``output_cost`` and ``input_cost`` are the counter's
    increments per token under the cost in force (set by ``TenantLedger.configure``)."""

    name: str
    weight: float = 1.0
    input_cost: float = 1.0
    output_cost: float = 2.0
    counter: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    queued: int = 0
    """Requests added and not yet scheduled once (the fair queue's quota counts these)."""
    backlogged: int = 0
    """Of those, the ones the engine's policy holds (engine thread: the VTC lift reads it)."""
    refused: int = 0
    """Requests refused with a full queue (429)."""

    def charge_output(self) -> None:
        """One sampled token (the step's hot loop: two adds)."""
        self.counter += self.output_cost
        self.output_tokens += 1

    def configure(self, cost: ServiceCost) -> None:
        self.weight = cost.weight(self.name)
        self.input_cost = cost.input_weight / self.weight
        self.output_cost = cost.output_weight / self.weight


class TenantLedger:
    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self.max_tenants = max_tenants
        self.cost = ServiceCost()
        self._accounts: dict[str, TenantAccount] = {}
        self._lock = threading.Lock()
        self._last_left = 0.0
        """The counter of the last tenant whose backlog emptied (the lift with none left)."""

    # -- the adding thread and the engine's, under the lock --------------------------------

    def admit(self, tenants: list[str], quota: int | None) -> list[TenantAccount]:
        """The accounts of a batch's requests (by name, bounded), each counted as queued; with
        ``quota``, ``QuotaExceeded`` when a tenant would then hold more than that many queued
        requests (nothing is counted, the refusal is)."""
        with self._lock:
            accounts = [self._account(name) for name in tenants]
            if quota is not None:
                asked: dict[str, int] = {}
                for account in accounts:
                    asked[account.name] = asked.get(account.name, 0) + 1
                for name, count in asked.items():
                    account = self._accounts[name]
                    if account.queued + count > quota:
                        for refused in accounts:
                            refused.refused += 1
                        raise QuotaExceeded(name, account.queued, quota)
            for account in accounts:
                account.queued += 1
            return accounts

    def refuse(self, accounts: list[TenantAccount]) -> None:
        """Undo ``admit`` for a batch refused afterwards (the queue as a whole was full)."""
        with self._lock:
            for account in accounts:
                account.queued -= 1
                account.refused += 1

    def release(self, account: TenantAccount) -> None:
        """A request of ``account`` left the queued count (first scheduled, or ended)."""
        with self._lock:
            account.queued -= 1

    def _account(self, name: str) -> TenantAccount:
        account = self._accounts.get(name)
        if account is None:
            if len(self._accounts) >= self.max_tenants and name != OTHER_TENANT:
                return self._account(OTHER_TENANT)
            account = self._accounts[name] = TenantAccount(name)
            account.configure(self.cost)
        return account

    # -- the engine's thread ----------------------------------------------------------------

    def configure(self, cost: ServiceCost) -> None:
        """Put a queue's cost in force: counters stay, later tokens cost as ``cost`` says."""
        with self._lock:
            self.cost = cost
            for account in self._accounts.values():
                account.configure(cost)

    def join(self, account: TenantAccount) -> None:
        """A request of ``account`` reached the policy's queue: a tenant that was not
        backlogged is lifted (VTC) before it is."""
        if account.backlogged == 0:
            counters = [a.counter for a in self._accounts.values() if a.backlogged]
            floor = min(counters) if counters else self._last_left
            account.counter = max(account.counter, floor)
        account.backlogged += 1

    def leave(self, account: TenantAccount) -> None:
        """A backlogged request of ``account`` was scheduled, or ended, for the first time."""
        account.backlogged -= 1
        if account.backlogged == 0:
            self._last_left = account.counter

    def charge_prompt(self, account: TenantAccount, num_tokens: int) -> None:
        account.counter += account.input_cost * num_tokens
        account.input_tokens += num_tokens

    def counter(self, name: str) -> float:
        account = self._accounts.get(name)
        return account.counter if account is not None else 0.0

    def accounts(self) -> list[TenantAccount]:
        with self._lock:
            return list(self._accounts.values())
