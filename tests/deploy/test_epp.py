"""The chart's endpoint-picker mode: it renders, lints and validates (the InferencePool and the
HTTPRoute against the hand-written GIE / Gateway API schemas), and its objects fit together."""

from __future__ import annotations

import copy
import functools
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvstack.config import load_config
from kvstack.deploy.chart import ChartManifest, lint_chart, load_values
from kvstack.deploy.validate import DEFAULT_KUBE_VERSION, validate_manifests
from tests.deploy.rendered import NAMESPACE, REPO, container, engine_deployments, of_kind, render

EXAMPLE = REPO / "deploy" / "examples" / "epp" / "kgateway.yaml"


@functools.cache
def manifests(extra: str = "") -> tuple[ChartManifest, ...]:
    values = load_values([EXAMPLE])
    if extra:
        values = {**values, "epp": {**values["epp"], **yaml.safe_load(extra)}}
    return tuple(render(values))


def one(kind: str, suffix: str = "") -> dict[str, Any]:
    (doc,) = [d for d in of_kind(manifests(), kind) if d["metadata"]["name"].endswith(suffix)]
    return doc


def test_lint_is_clean() -> None:
    report = lint_chart(load_values([EXAMPLE]), namespace=NAMESPACE)
    assert report.errors == [] and report.warnings == []


@pytest.mark.parametrize(
    "kube", sorted({DEFAULT_KUBE_VERSION, kubernetes_validate.latest_version()})
)
def test_every_manifest_validates(kube: str) -> None:
    kinds = {m.kind for m in manifests()}
    assert {"InferencePool", "HTTPRoute", "Deployment", "Service", "Role"} <= kinds
    assert validate_manifests(manifests(), kube) == []


def test_the_pool_selects_the_engines_and_points_at_the_epp() -> None:
    pool = one("InferencePool")
    labels = pool["spec"]["selector"]["matchLabels"]
    (engine,) = engine_deployments(manifests())
    assert labels.items() <= engine["spec"]["template"]["metadata"]["labels"].items()
    http = next(p for p in container(engine)["ports"] if p["name"] == "http")
    assert pool["spec"]["targetPorts"] == [{"number": http["containerPort"]}]
    ref = pool["spec"]["endpointPickerRef"]
    service = one("Service", "-epp")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert ref["name"] == service["metadata"]["name"] and ref["port"]["number"] == grpc["port"]
    route = one("HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == pool["metadata"]["name"]
    assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"


def test_the_epp_config_is_valid_and_names_its_pool() -> None:
    config_map = one("ConfigMap", "-epp")
    config = load_config(data=yaml.safe_load(config_map["data"]["config.yaml"]), env={})
    assert config.epp.pool.name == one("InferencePool")["metadata"]["name"]
    assert config.epp.pool.namespace == NAMESPACE and config.epp.tls.self_signed
    assert config.router.admission.name == "priority"
    deployment = one("Deployment", "-epp")
    c = container(deployment)
    assert c["args"] == ["epp", "--config", "/etc/kvstack/config.yaml"]
    assert c["readinessProbe"]["grpc"] == {"port": config.epp.health_port, "service": "readiness"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == config.epp.port and ports["metrics"] == config.epp.metrics_port


def test_rbac_reads_pools_objectives_and_pods_in_its_namespace() -> None:
    role = one("Role", "-epp")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"pods", "inferencepools", "inferenceobjectives", "inferencemodels"} <= resources
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in role["rules"])
    binding = one("RoleBinding", "-epp")
    assert (
        binding["subjects"][0]["name"]
        == one("Deployment", "-epp")["spec"]["template"]["spec"]["serviceAccountName"]
    )


def test_the_gateway_reaches_the_engines_and_the_epp_only_on_their_ports() -> None:
    engine = one("NetworkPolicy", "-engine")
    gateway = [r for r in engine["spec"]["ingress"] if r["from"] == [{"namespaceSelector": {}}]]
    assert gateway and gateway[0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    epp = one("NetworkPolicy", "-epp")
    assert epp["spec"]["ingress"][0]["ports"] == [{"port": "grpc", "protocol": "TCP"}]


def test_a_tls_secret_replaces_the_self_signed_certificate() -> None:
    docs = manifests("tls: {existingSecret: epp-tls}")
    (config_map,) = [
        d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-epp")
    ]
    tls = yaml.safe_load(config_map["data"]["config.yaml"])["epp"]["tls"]
    assert tls == {"cert_file": "/etc/kvstack/tls/tls.crt", "key_file": "/etc/kvstack/tls/tls.key"}
    assert validate_manifests(docs) == []


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        ("InferencePool", lambda d: d["spec"].update(targetPorts=[])),
        ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].update(failureMode="Maybe")),
        ("InferencePool", lambda d: d["spec"].update(targetPortNumber=8000)),  # the v1alpha2 field
        ("HTTPRoute", lambda d: d["spec"]["rules"][0].update(timeout="5s")),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["timeouts"].update(request="5 seconds")),
    ],
)
def test_the_crd_schemas_reject_broken_objects(kind: str, edit: Any) -> None:
    doc = copy.deepcopy(one(kind))
    edit(doc)
    assert validate_manifests([ChartManifest("test", doc)])
