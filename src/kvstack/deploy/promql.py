"""The metric names a PromQL expression (or a Grafana dashboard) refers to.

Not a PromQL parser: strings, label matchers, range and subquery brackets, grouping clauses
and Grafana variables are removed; what is left is functions (an identifier before ``(``),
keywords, numbers and metric names. Enough for expressions written for dashboards, and tested
against the shapes they use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

__all__ = ["dashboard_references", "metric_names_in", "template_metric_names"]

KEYWORDS = frozenset(
    ("by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "atan2", "inf", "nan")
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*")
_TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?")
_NUMBER_UNIT = re.compile(r"\b\d+(\.\d+)?(e[+-]?\d+)?[a-z]*\b", re.I)
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{,]")


def metric_names_in(expr: str) -> set[str]:
    """Metric names an expression selects."""
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER_UNIT.sub(" ", text)
    names = set()
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token.endswith("(") or token in KEYWORDS:
            continue
        names.add(token)
    return names


def template_metric_names(query: str) -> set[str]:
    """Metric names a Grafana variable query uses: ``label_values(metric{...}, label)``."""
    match = _LABEL_VALUES.match(query)
    if match:
        return {match.group(1)}
    if query.lstrip().startswith(("label_values(", "label_names(")):
        return set()  # label_values(label) names no metric
    if query.lstrip().startswith("query_result("):
        return metric_names_in(query.strip()[len("query_result(") : -1])
    return metric_names_in(query)


def dashboard_references(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, set[str]]]:
    """``(where, query, metric names)`` for every panel target and query variable."""
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                where = f"panel {panel.get('title', '?')!r}"
                yield where, target["expr"], metric_names_in(target["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, dict) else query or ""
            if text:
                where = f"variable {variable.get('name', '?')!r}"
                yield where, text, template_metric_names(text)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))
