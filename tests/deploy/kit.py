"""What the deploy-kit tests share: where the kit lives, promtool (or why it is missing), the
PromQL expressions the dashboard and the alert rules hold, and the metric names in them."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_DIR = DEPLOY / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "servedeck.json"

PROMETHEUS_OWN = {"up"}
"""Series Prometheus writes itself for every target (never in an application's /metrics)."""

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,")


def require(binary: str) -> str:
    """The path of a Prometheus binary; skip without it, except in CI (``CI=true``), where
    ``.ci/run`` installs Debian's ``prometheus`` package, so a missing one is a failure."""
    path = shutil.which(binary)
    if path is not None:
        return path
    why = f"{binary} not found (Debian: apt-get install --no-install-recommends prometheus)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {why}")
    pytest.skip(why)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left once strings, label
    matchers, range and subquery brackets, ``by (...)``-style label lists, ``offset``
    durations, function names, keywords and numbers are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _LABEL_LISTS.sub(" ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        if word.lower() in _KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    """Every panel target's and annotation's PromQL (rows' nested panels included)."""
    queries = []
    panels = list(board["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        queries.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
    queries.extend(a["expr"] for a in board["annotations"]["list"] if a.get("expr"))
    return queries


def dashboard_variable_metrics(board: dict[str, Any]) -> set[str]:
    """Metrics the template variables read (``label_values(metric, label)``)."""
    names = set()
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        names.update(_LABEL_VALUES.findall(text))
    return names


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def live_sample_names(metrics_text: str) -> set[str]:
    """Sample names in a /metrics body, suffixes included (``_total``, ``_bucket``, ``_sum``,
    ``_count``), since those are the names a query selects."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.name
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
    }
