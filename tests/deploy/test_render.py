"""The chart renders, lints and validates against Kubernetes' schemas for every values set;
the values schema covers every value; the validators really reject broken manifests."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvstack.deploy.chart import CHART_DIR, ChartError, ChartManifest, lint_chart
from kvstack.deploy.validate import DEFAULT_KUBE_VERSION, validate_manifests
from tests.deploy.rendered import VALUE_SETS, container, engine_deployments, of_kind, rendered

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
CHART = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
MIN_KUBE_VERSION = re.search(r"\d+\.\d+\.\d+", CHART["kubeVersion"]).group(0)  # type: ignore[union-attr]


def test_lint_is_clean(values_set: str) -> None:
    report = lint_chart(
        VALUE_SETS[values_set], namespace="llm", kube_version="v" + MIN_KUBE_VERSION
    )
    assert report.errors == [] and report.warnings == []


# The chart's oldest supported release, the default, and the newest kubernetes-validate knows.
KUBE_VERSIONS = sorted(
    {MIN_KUBE_VERSION, DEFAULT_KUBE_VERSION, kubernetes_validate.latest_version()}
)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_manifests_match_kubernetes_schemas(
    manifests: tuple[ChartManifest, ...], kube_version: str
) -> None:
    assert manifests, "nothing rendered"
    assert validate_manifests(manifests, kube_version) == []


def test_every_rendered_object_is_named_and_labelled(manifests: tuple[ChartManifest, ...]) -> None:
    names = [(m.kind, m.name) for m in manifests]
    assert len(names) == len(set(names)), "two objects of one kind share a name"
    for m in manifests:
        assert len(m.name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", m.name)
        labels = m.doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "kv"
        assert labels["app.kubernetes.io/part-of"] == "kvstack"


def test_all_features_renders_every_kind() -> None:
    kinds = {m.kind for m in rendered("all-features")}
    assert kinds >= {
        "Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
        "HorizontalPodAutoscaler", "PodDisruptionBudget", "StatefulSet", "NetworkPolicy",
        "PersistentVolumeClaim", "ScaledObject", "ServiceMonitor", "PodMonitor",
    }  # fmt: skip


# -- the validators are not rubber stamps --------------------------------------------------------
def _broken(kind: str, edit: Any) -> list[str]:
    manifests = rendered("all-features")
    doc = copy.deepcopy(next(m.doc for m in manifests if m.kind == kind))
    edit(doc)
    return validate_manifests([ChartManifest("test", doc)])


def test_validation_rejects_an_unknown_field() -> None:
    assert _broken("Deployment", lambda d: d["spec"].update(replicaz=2))


def test_validation_rejects_a_wrong_type() -> None:
    assert _broken("Deployment", lambda d: container(d).update(ports="http"))


def test_validation_rejects_a_keda_threshold_that_is_not_a_string() -> None:
    assert _broken(
        "ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=5)
    )


def test_validation_rejects_an_unknown_podmonitor_field() -> None:
    assert _broken("PodMonitor", lambda d: d["spec"].update(podTargetLabel=["x"]))


def test_validation_rejects_a_kind_without_schema() -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert validate_manifests([ChartManifest("test", doc)])


# -- values.schema.json ----------------------------------------------------------------------------
def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _leaves(values: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        return [leaf for key, value in values.items() for leaf in _leaves(value, (*path, key))]
    return [path]


def _schema_at(path: tuple[str, ...]) -> dict[str, Any]:
    node = _resolve(SCHEMA)
    for key in path:
        if key.isdigit():
            node = _resolve(node["items"])
            continue
        if "properties" not in node:
            return node  # a free-form map (resources, nodeSelector, extraConfig...)
        props = node["properties"]
        assert key in props, f"{'.'.join(path)}: no schema for {key!r}"
        node = _resolve(props[key])
    return node


def _with_list_items(values: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Leaves of values, descending into the first item of lists of mappings."""
    if isinstance(values, list) and values and isinstance(values[0], dict):
        return _with_list_items(values[0], (*path, "0"))
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in _with_list_items(v, (*path, k))]
    return [path]


def test_every_default_value_has_a_described_schema() -> None:
    for path in _with_list_items(DEFAULTS):
        node = _schema_at(path)
        assert node.get("description"), f"{'.'.join(path)} has no description in the schema"


def test_every_schema_object_forbids_unknown_keys() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, value in node.items():
                walk(value, f"{where}/{key}")

    walk(SCHEMA, "")


def test_model_entries_accept_the_engine_keys_a_model_may_override() -> None:
    engine = set(SCHEMA["definitions"]["engine"]["properties"])
    model = set(SCHEMA["definitions"]["model"]["properties"])
    global_only = {"port", "apiKeySecret"}  # one port and one key for the router to use
    entry_only = {"name", "model", "servedModelName", "replicas", "role", "kv"}
    assert model - entry_only == engine - global_only


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"models": [{"name": "a", "model": "m", "gpu": 1}]}, "additional properties 'gpu'"),
        ({"router": {"policy": "Fastest!"}}, "/router/policy"),
        ({"kv": {"cpu": {"size": "lots"}}}, "/kv/cpu/size"),
        ({"models": [{"name": "Big_Model", "model": "m"}]}, "/models/0/name"),
        ({"redis": {"url": "redis://:hunter2@cache:6379/0"}}, "/redis/url"),
        ({"engine": {"hfTokenSecret": "hf_abcdef"}}, "/engine/hfTokenSecret"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ChartError, match=re.escape(complaint)):
        rendered_with(values)


def rendered_with(values: dict[str, Any]) -> list[ChartManifest]:
    from tests.deploy.rendered import render

    return render(values)


def test_engine_deployments_exist_for_every_model(values_set: str) -> None:
    models = VALUE_SETS[values_set].get("models", DEFAULTS["models"])
    assert len(engine_deployments(rendered(values_set))) == len(models)
    assert len(of_kind(rendered(values_set), "ConfigMap")) >= 1
