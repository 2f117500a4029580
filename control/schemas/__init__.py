"""The API bodies by resource (a feature room keeps its own: control/policy/schemas.py,
control/schedules/schemas.py, control/guardrail/schemas.py, control/fleet/schemas.py)."""
