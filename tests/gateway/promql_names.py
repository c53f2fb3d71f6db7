"""Metric names and label names in PromQL expressions, and the queries of a Grafana board and a Prometheus rules file.

Not a PromQL parser: enough of the grammar to find every series an expression reads (identifiers that are not
functions, keywords, label names or durations) and the labels it selects or groups by.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
    "inf", "nan", "atan2",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"(?<![\w:$.])[a-zA-Z_:][a-zA-Z0-9_:]*")
_GRAFANA_VARIABLE = re.compile(r"\$\{?\w+\}?")


@dataclass
class Query:
    """One expression's series and, per series, the labels its selectors match on; plus grouping labels."""

    expr: str
    source: str
    metrics: set[str] = field(default_factory=set)
    selector_labels: dict[str, set[str]] = field(default_factory=dict)
    grouping_labels: set[str] = field(default_factory=set)


def parse(expr: str, source: str) -> Query:
    query = Query(expr, source)
    text = _GRAFANA_VARIABLE.sub("1", expr)
    # Label values in selectors are strings: read the matchers before strings go.
    for match in _SELECTOR.finditer(_STRING.sub('""', text)):
        name, body = match.group(1), match.group(2)
        labels = set(_MATCHER.findall(body))
        if name:
            query.selector_labels.setdefault(name, set()).update(labels)
    text = _STRING.sub(" ", text)
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    for group in _GROUPING.findall(text):
        query.grouping_labels.update(label.strip() for label in group.split(",") if label.strip())
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    for match in _IDENTIFIER.finditer(text):
        name = match.group(0)
        if text[match.end():].lstrip().startswith("("):
            continue  # a function
        if name.lower() not in KEYWORDS:
            query.metrics.add(name)
    return query


def board_queries(path: Path) -> list[Query]:
    """Every panel target's `expr` (rows' nested panels too) and every query variable's query."""
    board = json.loads(path.read_text())
    queries = []

    def panels(items: list[dict]) -> None:
        for panel in items:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append(parse(target["expr"], f"panel {panel.get('title')!r}"))
            panels(panel.get("panels", []))

    panels(board.get("panels", []))
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", text or "")
        if match:
            parsed = parse(match.group(1), f"variable {variable['name']!r}")
            parsed.grouping_labels.add(match.group(2))
            queries.append(parsed)
    return queries


def rules(path: Path) -> tuple[list[Query], set[str], list[dict]]:
    """The rules file's expressions, the names its recording rules define, and its alert rules."""
    document = yaml.safe_load(path.read_text())
    queries, recorded, alerts = [], set(), []
    for group in document["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule.get("alert")
            queries.append(parse(rule["expr"], f"rule {name!r}"))
            if "record" in rule:
                recorded.add(rule["record"])
            else:
                alerts.append(rule)
    return queries, recorded, alerts
