"""The SLO guardrail: a job that tunes the policy within operator bounds (``schemas`` the
types, ``plan`` the pure choice, ``service`` the rows and the job)."""
