"""The setting's second axis: whose request goes first, beside how requests are batched.

A discriminated union on ``name``, one member per queue discipline; each policy admits in the
order its discipline gives (``policies/discipline.py``), aging first (``max_wait_s`` still
bounds every wait):

- ``fcfs``: first come, first served (the policy's own order).
- ``priority``: the lowest ``priority`` value first (vLLM's meaning), ties in the policy's own
  order; with ``preempt`` a waiting request may take a full batch's place from a running one
  of a higher value.
- ``fair``: the Virtual Token Counter (Sheng et al., OSDI'24): the backlogged tenant with the
  least weighted service goes first (a tenant's own requests by priority, then the policy's
  order); its share of the waiting queue is bounded by ``tenant_quota``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine.tenants import MAX_TENANT_NAME, MAX_TENANTS, ServiceCost
from policies.json_types import JsonBool, JsonNumber, json_typed

TenantName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TENANT_NAME)]
_Weight = Annotated[float, Field(gt=0, le=1000), json_typed("number")]
"""A tenant's share weight. The bounds come before the JSON type check, so that the schema
states them as JSON Schema does (``exclusiveMinimum``, ``maximum``) inside the mapping."""


def _tag_required(schema: dict[str, Any]) -> None:
    schema["required"] = ["name"]


# ``name`` is the union's tag: JSON must carry it (``{}`` is no queue), so the schema says
# required; the default is for building one in Python (``FcfsQueue()``).
_TAGGED = ConfigDict(
    extra="forbid", frozen=True, json_schema_extra=lambda schema: _tag_required(schema)
)

_COST = ServiceCost()


class _Queue(BaseModel):
    model_config = _TAGGED

    def cost(self) -> ServiceCost:
        """What a served token costs a tenant's counter under this queue (the counters are
        kept under every queue, so a switch to ``fair`` starts from the service so far)."""
        return _COST


class FcfsQueue(_Queue):
    """First come, first served (the policy's own order, aging included); no params."""

    name: Literal["fcfs"] = Field("fcfs", description="Queue order.")


class PriorityQueue(_Queue):
    """The lowest ``priority`` value first (a request's field: lower is served earlier)."""

    name: Literal["priority"] = Field("priority", description="Queue order.")
    preempt: JsonBool = Field(
        False,
        description=(
            "A waiting request whose priority value is lower than a running one's may take "
            "its place when the batch or the KV pool is full: the running one is preempted "
            "(its KV dropped and recomputed later), at most one a step."
        ),
    )


class FairQueue(_Queue):
    """Fair share between tenants by the Virtual Token Counter."""

    name: Literal["fair"] = Field("fair", description="Queue order.")
    weights: dict[TenantName, _Weight] = Field(
        default_factory=dict,
        max_length=MAX_TENANTS,
        description="Each tenant's share weight (2 gets twice the service of 1).",
    )
    default_weight: JsonNumber = Field(
        _COST.default_weight, gt=0, le=1000, description="The weight of a tenant not listed."
    )
    input_weight: JsonNumber = Field(
        _COST.input_weight,
        ge=0,
        le=100,
        description="What a prompt token costs the counter (VTC's w_p).",
    )
    output_weight: JsonNumber = Field(
        _COST.output_weight,
        ge=0,
        le=100,
        description="What an output token costs the counter (VTC's w_q).",
    )
    tenant_quota: JsonNumber = Field(
        0.5,
        gt=0,
        le=1,
        description=(
            "The share of max_waiting one tenant's waiting requests may take; past it that "
            "tenant's new requests get 429 while others' still get in."
        ),
    )

    def cost(self) -> ServiceCost:
        return ServiceCost(
            self.input_weight, self.output_weight, dict(self.weights), self.default_weight
        )

    def quota(self, max_waiting: int) -> int:
        """Waiting requests one tenant may hold."""
        return max(1, int(self.tenant_quota * max_waiting))


QueueSpec = Annotated[FcfsQueue | PriorityQueue | FairQueue, Field(discriminator="name")]
"""Every queue order by ``name``."""

QueueName = Literal["fcfs", "priority", "fair"]
