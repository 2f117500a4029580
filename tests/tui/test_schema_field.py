"""The editor says what an empty field stands for, as the params schema declares it
(``x-null``): the engine cap for a capped field, "off" for aging."""

from __future__ import annotations

from policies.registry import params_schemas
from tui.widgets.schema_field import FieldSpec


def spec(policy: str, name: str, cap=None) -> FieldSpec:
    prop = params_schemas()[policy]["properties"][name]
    return FieldSpec.from_schema(name, prop, f"policy.params.{name}", cap=cap)


def test_empty_aging_means_off() -> None:
    field = spec("dynamic", "max_wait_s")
    assert field.nullable and field.null_means == "off"
    assert field.bounds().endswith("empty = off")


def test_empty_capped_field_means_the_engine_cap() -> None:
    field = spec("continuous", "max_num_seqs", cap=256)
    assert field.null_means == "engine cap"
    assert field.bounds().endswith("empty = engine cap (256)")
