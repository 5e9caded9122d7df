"""Every metric a dashboard or an autoscaling query names is one that kvstack or vLLM exports."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvstack.deploy.metric_names import (
    all_exported,
    connector_metrics,
    kvstack_metric_modules,
    kvstack_metrics,
    parse_metric_list,
    vllm_metrics_from_source,
)
from kvstack.deploy.promql import dashboard_references, metric_names_in
from tests.deploy.rendered import REPO, VLLM_LIST, of_kind, rendered

STATS = REPO / "src" / "kvstack" / "integrations" / "vllm" / "stats.py"
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))
REQUIRED_DASHBOARDS = {"fleet", "kv-cache", "router", "adapters"}


@functools.cache
def known_names() -> frozenset[str]:
    return frozenset(
        all_exported([
            kvstack_metrics(),
            connector_metrics(STATS.read_text()),
            parse_metric_list(VLLM_LIST.read_text()),
        ])
    )  # fmt: skip


def unknown_references(dashboard: dict[str, Any]) -> list[str]:
    known = known_names()
    problems = []
    for where, query, names in dashboard_references(dashboard):
        if not names:
            problems.append(f"{where}: names no metric: {query}")
        problems += [f"{where}: unknown metric {n!r}" for n in sorted(names - known)]
    return problems


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_names_only_exported_metrics(path: Path) -> None:
    assert unknown_references(json.loads(path.read_text())) == []


def test_an_unknown_metric_is_reported() -> None:
    dashboard = {
        "panels": [
            {"title": "p", "targets": [{"expr": "sum(rate(vllm:no_such_metric_total[5m]))"}]}
        ],
        "templating": {"list": [{"type": "query", "name": "v",
                                 "query": "label_values(kvstack_nope, pod)"}]},
    }  # fmt: skip
    assert unknown_references(dashboard) == [
        "panel 'p': unknown metric 'vllm:no_such_metric_total'",
        "variable 'v': unknown metric 'kvstack_nope'",
    ]


def test_the_required_dashboards_exist_and_are_well_formed() -> None:
    assert {p.stem for p in DASHBOARDS} >= REQUIRED_DASHBOARDS
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        names = [v["name"] for v in board["templating"]["list"]]
        assert "datasource" in names and "namespace" in names
        assert sum(1 for _ in dashboard_references(board)) >= 10, path.name
    assert len(uids) == len(DASHBOARDS)


def test_the_chart_ships_exactly_these_dashboards() -> None:
    (config_map,) = [
        c for c in of_kind(rendered("defaults"), "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboards")
    ]  # fmt: skip
    assert config_map["data"] == {p.name: p.read_text() for p in DASHBOARDS}


def test_keda_queries_name_exported_metrics() -> None:
    queries = [
        trigger["metadata"]["query"]
        for scaled in of_kind(rendered("all-features"), "ScaledObject")
        for trigger in scaled["spec"]["triggers"]
    ]
    assert queries
    for query in queries:
        names = metric_names_in(query)
        assert names and names <= known_names()


def test_kvstack_metrics_of_every_component_are_found() -> None:
    prefixes = {name.split("_")[1] for name in kvstack_metrics()}
    missing = {"router", "kv", "index", "lora", "peer"} - prefixes
    assert not missing, f"no kvstack_{missing}_* metrics found in {kvstack_metric_modules()}"


def test_connector_metrics_are_read_from_its_stats_module() -> None:
    names = connector_metrics(STATS.read_text())
    assert names["kvstack_connector_hit_tokens"] == "counter"
    assert names["kvstack_connector_load_seconds"] == "histogram"
    assert names["kvstack_connector_tier_used_bytes"] == "gauge"
    assert names["kvstack_connector_tier_hits"] == "counter"
    assert len(names) >= 20


def test_checked_in_vllm_list_matches_the_installed_vllm() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    installed = vllm_metrics_from_source(loggers.read_text())
    assert installed == parse_metric_list(VLLM_LIST.read_text()), (
        "vLLM's metrics changed: kvstack deploy vllm-metrics > tests/deploy/vllm_metrics.txt"
    )
    assert installed["vllm:num_requests_waiting"] == "gauge"


@pytest.mark.slow
def test_connector_names_read_statically_are_the_ones_vllm_registers() -> None:
    """Import the stats module (and vLLM) and let it register into a private registry."""
    pytest.importorskip("vllm")
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from kvstack.integrations.vllm.stats import KVStackPromMetrics

    registry = CollectorRegistry()

    def bound(cls: type) -> type:
        return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **kw: cls.__init__(
            self, *a, registry=registry, **{k: v for k, v in kw.items()
                                             if k != "multiprocess_mode"})})  # fmt: skip

    types = {Counter: bound(Counter), Gauge: bound(Gauge), Histogram: bound(Histogram)}
    KVStackPromMetrics(SimpleNamespace(kv_transfer_config=None), types, ["model_name"], {0: ["m"]})  # type: ignore[arg-type]
    registered = {family.name: family.type for family in registry.collect()}
    assert registered == connector_metrics(STATS.read_text())
