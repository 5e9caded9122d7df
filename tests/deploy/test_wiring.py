"""Golden checks on how the parts find each other: the router's config and discovery, RBAC,
autoscaling, network policies, secrets, and the template checks that refuse unsafe values."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from kvstack.config import load_config
from kvstack.deploy.chart import ChartError, ChartManifest
from kvstack.deploy.metric_names import parse_metric_list
from kvstack.deploy.promql import metric_names_in
from tests.deploy.rendered import (
    NAMESPACE,
    VLLM_LIST,
    assert_index_reachable,
    container,
    engine_deployments,
    flag,
    of_kind,
    render,
    rendered,
)

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|ADMIN_KEY|REGISTRY_URL|ACCESS_KEY")
# The Secrets the chart generates when the values name none (random, never from values).
GENERATED = ("-cluster-secret", "-api-keys", "-engine-api-key", "-redis-password")


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def workloads(manifests: tuple[ChartManifest, ...]) -> list[dict[str, Any]]:
    return of_kind(manifests, "Deployment") + of_kind(manifests, "StatefulSet")


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors (what the chart renders)."""
    pairs = [term.split("=", 1) for term in selector.split(",")]
    return all(labels.get(key) == value for key, value in pairs)


def router_config(manifests: tuple[ChartManifest, ...]) -> Any:
    maps = [c for c in of_kind(manifests, "ConfigMap") if "config.yaml" in c.get("data", {})]
    assert len(maps) == 1
    data = yaml.safe_load(maps[0]["data"]["config.yaml"])
    return load_config(data=data, env={})  # kvstack's own validation: unknown keys are errors


def test_router_config_validates_and_discovers_this_releases_engines(
    manifests: tuple[ChartManifest, ...],
) -> None:
    kube = router_config(manifests).router.discovery
    assert kube.kind == "kubernetes"
    assert kube.kubernetes.namespace == NAMESPACE
    for w in workloads(manifests):
        is_engine = w in engine_deployments(manifests)
        assert selects(kube.kubernetes.label_selector, pod_labels(w)) == is_engine
    for d in engine_deployments(manifests):
        c = container(d)
        http = {"name": "http", "containerPort": kube.kubernetes.port, "protocol": "TCP"}
        assert http in c["ports"]
        assert int(flag(c["args"], "--port") or 0) == kube.kubernetes.port
        assert kube.kubernetes.role_label in pod_labels(d)


def test_router_finds_the_index_and_the_engines_kv_events(
    manifests: tuple[ChartManifest, ...],
) -> None:
    prefix = router_config(manifests).router.prefix
    services = {s["metadata"]["name"]: s for s in of_kind(manifests, "Service")}
    if prefix.index_url:
        (router,) = [w for w in workloads(manifests) if w["metadata"]["name"].endswith("-router")]
        env = {v["name"]: "" for v in container(router).get("env", [])}
        assert_index_reachable(prefix.index_url, services, env)
        is_service = prefix.index_url.startswith("http://")
        assert any(name.endswith("-index") for name in services) == is_service
    else:
        assert not any(name.endswith("-index") for name in services)
    for d in engine_deployments(manifests):
        ports = {p["name"]: p["containerPort"] for p in container(d)["ports"]}
        if "kv-events" in ports:
            assert prefix.events.port == ports["kv-events"]


def test_router_reads_its_config_and_may_list_pods_in_its_namespace_only(
    manifests: tuple[ChartManifest, ...],
) -> None:
    assert not of_kind(manifests, "ClusterRole") and not of_kind(manifests, "ClusterRoleBinding")
    (router,) = [
        w for w in workloads(manifests) if pod_labels(w)["app.kubernetes.io/component"] == "router"
    ]
    spec = router["spec"]["template"]["spec"]
    (role,) = of_kind(manifests, "Role")
    (binding,) = of_kind(manifests, "RoleBinding")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    ]
    args = container(router)["args"]
    assert args[0] == "router" and flag(args, "--config") == "/etc/kvstack/config.yaml"


def test_engines_do_not_mount_kubernetes_credentials(manifests: tuple[ChartManifest, ...]) -> None:
    for d in engine_deployments(manifests):
        assert d["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_services_select_their_pods(manifests: tuple[ChartManifest, ...]) -> None:
    for service in of_kind(manifests, "Service"):
        selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
        matched = [w for w in workloads(manifests) if selects(selector, pod_labels(w))]
        assert len(matched) == 1, service["metadata"]["name"]
        ports = {p["name"] for p in container(matched[0])["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


# -- autoscaling -----------------------------------------------------------------------------------
def test_keda_scales_engines_on_a_queue_metric_vllm_exports(
    manifests: tuple[ChartManifest, ...],
) -> None:
    vllm = parse_metric_list(VLLM_LIST.read_text())
    engines = {d["metadata"]["name"]: d for d in engine_deployments(manifests)}
    for scaled in of_kind(manifests, "ScaledObject"):
        target = engines[scaled["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"], "KEDA owns the replica count"
        (trigger,) = scaled["spec"]["triggers"]
        query = trigger["metadata"]["query"]
        assert metric_names_in(query) == {"vllm:num_requests_waiting"} <= set(vllm)
        engine_label = pod_labels(target)["kvstack.io/engine"]
        assert f'kvstack_io_engine="{engine_label}"' in query
        assert f'namespace="{NAMESPACE}"' in query


def test_pod_monitor_exports_the_labels_dashboards_filter_on(
    manifests: tuple[ChartManifest, ...],
) -> None:
    for monitor in of_kind(manifests, "PodMonitor"):
        assert set(monitor["spec"]["podTargetLabels"]) >= {"kvstack.io/engine", "kvstack.io/role"}
        for d in engine_deployments(manifests):
            assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels(d).items()


def test_router_hpa_targets_the_router(manifests: tuple[ChartManifest, ...]) -> None:
    for hpa in of_kind(manifests, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        assert target["name"].endswith("-router") and target["kind"] == "Deployment"
        assert hpa["spec"]["minReplicas"] >= 2 or not of_kind(manifests, "PodDisruptionBudget")


# -- network policies ------------------------------------------------------------------------------
def test_only_router_and_prometheus_reach_the_engines_http_port(
    manifests: tuple[ChartManifest, ...],
) -> None:
    policies = [
        p for p in of_kind(manifests, "NetworkPolicy") if p["metadata"]["name"].endswith("-engine")
    ]
    if not engine_deployments(manifests):
        return
    (policy,) = policies
    router_labels = {"app.kubernetes.io/component": "router"}
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "a rule without `from` admits everyone"
        if {"port": "http", "protocol": "TCP"} not in rule["ports"]:
            continue
        for peer in rule["from"]:
            pods = peer.get("podSelector", {}).get("matchLabels", {})
            # the router, or the scrapers: a namespace selector (narrowed by a pod selector)
            assert router_labels.items() <= pods.items() or "namespaceSelector" in peer


# -- secrets ---------------------------------------------------------------------------------------
def test_secrets_only_come_from_secret_refs(manifests: tuple[ChartManifest, ...]) -> None:
    for secret in of_kind(manifests, "Secret"):  # only the chart's generated ones, kept
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert secret["metadata"]["name"].endswith(GENERATED), secret["metadata"]["name"]
    for w in workloads(manifests):
        for var in container(w).get("env", []):
            if SECRET_NAME.search(var["name"]) and not var["name"].endswith("_FILE"):
                assert "secretKeyRef" in var.get("valueFrom", {}), var["name"]
    for config_map in of_kind(manifests, "ConfigMap"):
        text = yaml.safe_dump(config_map.get("data", {}))
        assert not re.search(r"(api_keys|admin_key|upstream_api_key|password)\s*:", text)


def test_secrets_reach_the_processes_that_need_them() -> None:
    manifests = rendered("all-features")
    env = {v["name"] for w in workloads(manifests) for v in container(w).get("env", [])}
    assert {"KVSTACK_ROUTER_AUTH__UPSTREAM_API_KEY", "VLLM_API_KEY", "HF_TOKEN",
            "KVSTACK_REDIS_PASSWORD", "REDIS_PASSWORD", "KVSTACK_LORA_REGISTRY_URL",
            "KVSTACK_LORA_ADMIN_KEY", "AWS_SECRET_ACCESS_KEY"} <= env  # fmt: skip
    config = router_config(manifests)
    assert config.router.auth.api_keys_file and not config.router.auth.api_keys


# -- template checks refuse unsafe or inconsistent values ----------------------------------------
SQLITE = {"adapters": {"enabled": True, "registry": {"type": "sqlite"}}}
POSTGRES = {"enabled": True, "registry": {"type": "postgresql", "urlSecret": {"name": "pg"}}}


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (SQLITE, "sqlite allows one router replica"),
        ({**SQLITE, "router": {"replicas": 3, "autoscaling": {"enabled": False}}}, "up to 3"),
        ({"adapters": {"enabled": True, "registry": {"type": "postgresql"}}}, "urlSecret"),
        ({"redis": {"mode": "external"}}, "needs redis.url"),
        ({"kv": {"chunkSize": 100}, "engine": {"blockSize": 16}}, "not a multiple"),
        ({"models": [{"name": "a", "model": "m"}, {"name": "a", "model": "n"}]}, "used twice"),
        ({"router": {"extraConfig": {"auth": {"api_keys": []}}}}, "API keys are secrets"),
        ({"adapters": {**POSTGRES, "extraConfig": {"admin_key": "x"}}}, "holds a secret"),
        ({"index": {"enabled": False}}, "kv.peer.enabled needs index.enabled"),
        ({"kv": {"s3": {"enabled": True}}}, "needs kv.s3.bucket"),
        ({"router": {"mountWeights": True}}, "needs engine.weights.existingClaim"),
    ],
)
def test_template_checks_refuse(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ChartError, match=re.escape(complaint)):
        render(values)


def test_a_single_router_with_sqlite_is_accepted() -> None:
    values = {**SQLITE, "router": {"replicas": 1, "autoscaling": {"enabled": False}}}
    manifests = tuple(render(values))
    assert not of_kind(manifests, "PodDisruptionBudget"), "minAvailable 1 of 1 blocks drains"
    (router,) = [w for w in workloads(manifests) if w["metadata"]["name"].endswith("-router")]
    assert router["spec"]["strategy"] == {"type": "Recreate"}
    assert router_config(manifests).lora.registry_url.startswith("sqlite:////var/lib/kvstack/")


def test_router_settings_the_schema_passes_are_still_checked_by_kvstack() -> None:
    from kvstack.errors import ConfigError

    manifests = tuple(render({"router": {"policy": "fastest", "extraConfig": {"retries": 2}}}))
    with pytest.raises(ConfigError, match=r"router\.(policy|retries)"):
        router_config(manifests)


def test_the_router_default_policy_applies_unless_one_is_set() -> None:
    assert "policy" not in yaml.safe_load(_config_text(rendered("defaults")))["router"]
    gpu = yaml.safe_load(_config_text(rendered("example:gpu-fleet")))
    assert gpu["router"]["policy"] == "least_load"


def _config_text(manifests: tuple[ChartManifest, ...]) -> str:
    (config_map,) = [c for c in of_kind(manifests, "ConfigMap") if "config.yaml" in c["data"]]
    return str(config_map["data"]["config.yaml"])


@pytest.mark.parametrize("password", ["", "redis-auth"])
def test_valkey_keeps_freed_reply_pages_for_large_values(password: str) -> None:
    manifests = render({"redis": {"passwordSecret": {"name": password}}})
    (valkey,) = of_kind(manifests, "StatefulSet")
    env = {e["name"]: e for e in container(valkey)["env"]}
    assert env["JE_MALLOC_CONF"]["value"] == env["MALLOC_CONF"]["value"] == "dirty_decay_ms:-1"
    source = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]  # a password either way
    assert source == (password or "kv-kvstack-redis-password")


def _eviction(valkey: dict[str, Any]) -> str:
    """The ``--maxmemory-policy`` in Valkey's start script."""
    match = re.search(r"--maxmemory-policy (\S+)", " ".join(container(valkey)["args"]))
    assert match, container(valkey)["args"]
    return match.group(1)


# -- the cluster KV index: in Valkey by default, the index server on request --------------------
def _tiers(deployment: dict[str, Any]) -> list[str]:
    raw = flag(container(deployment)["args"], "--kv-transfer-config")
    return [] if raw is None else list(json.loads(raw)["kv_connector_extra_config"]["tiers"])


def _index_urls(manifests: tuple[ChartManifest, ...]) -> set[str]:
    """Every index URL the release's processes use: the router's, each engine's announce
    setting and each peer tier's ``index`` parameter."""
    urls = {router_config(manifests).router.prefix.index_url or ""}
    for d in engine_deployments(manifests):
        for var in container(d).get("env", []):
            if var["name"] == "KVSTACK_INDEX_ANNOUNCE__INDEX_URL":
                urls.add(var["value"])
        urls |= {parse_qs(urlsplit(t).query)["index"][0] for t in _tiers(d) if "peer:" in t}
    return urls


def test_the_index_is_in_valkey_whenever_valkey_is_enabled() -> None:
    manifests = rendered("defaults")
    (url,) = _index_urls(manifests)
    # The chart's Valkey always has a password (generated unless named).
    assert (
        url
        == "redis://kv-kvstack-redis:6379/0?prefix=kvstack:index:&password_env=VALKEY_INDEX_PASSWORD"
    )
    assert not [
        d for d in of_kind(manifests, "Deployment") if d["metadata"]["name"].endswith("-index")
    ]
    (valkey,) = of_kind(manifests, "StatefulSet")
    assert _eviction(valkey) == "volatile-lru"
    tiers = [t for d in engine_deployments(manifests) for t in _tiers(d) if t.startswith("redis:")]
    assert tiers and all(parse_qs(urlsplit(t).query)["ttl_s"] == ["604800"] for t in tiers)
    policies = {p["metadata"]["name"]: p for p in of_kind(manifests, "NetworkPolicy")}
    froms = policies["kv-kvstack-redis"]["spec"]["ingress"][0]["from"]
    components = {f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in froms}
    assert components == {"engine", "router"}


def test_the_index_server_on_request_or_without_valkey() -> None:
    for values in ({"index": {"backend": "service"}}, {"redis": {"mode": "none"}}):
        manifests = tuple(render(values))
        (url,) = _index_urls(manifests)
        assert url == "http://kv-kvstack-index:8300"
        assert [
            d for d in of_kind(manifests, "Deployment") if d["metadata"]["name"].endswith("-index")
        ]
        for valkey in of_kind(manifests, "StatefulSet"):
            assert _eviction(valkey) == "allkeys-lru"


def test_the_valkey_index_reads_its_password_from_a_secret() -> None:
    manifests = rendered("all-features")
    (url,) = _index_urls(manifests)
    assert url.endswith("&password_env=VALKEY_INDEX_PASSWORD")
    for w in workloads(manifests):
        if pod_labels(w)["app.kubernetes.io/component"] in ("router", "engine"):
            env = {v["name"]: v for v in container(w)["env"]}
            ref = env["VALKEY_INDEX_PASSWORD"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "redis-auth", "key": "password"}


def test_an_external_valkey_keeps_the_index_parameters_apart_from_the_tiers() -> None:
    values = {"redis": {"mode": "external", "url": "redis://v1:7000,v2:7001/0?cluster=true&prefix=kv:&ttl_s=60"},
              "index": {"valkey": {"params": "buckets=32"}}}  # fmt: skip
    (url,) = _index_urls(tuple(render(values)))
    assert url == "redis://v1:7000,v2:7001/0?prefix=kvstack:index:&cluster=true&buckets=32"


def test_the_router_may_reach_the_valkey_holding_the_index_and_it_has_a_password() -> None:
    """The hardened chart limits the router's egress and always sets a Valkey password: with
    the index in the chart's Valkey the router reaches it and authenticates."""
    manifests = rendered("defaults")
    policies = {p["metadata"]["name"]: p for p in of_kind(manifests, "NetworkPolicy")}
    egress = policies["kv-kvstack-router"]["spec"]["egress"]
    targets = [
        to["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        for rule in egress
        for to in rule.get("to", [])
        if "podSelector" in to and "matchLabels" in to["podSelector"]
    ]
    assert "redis" in targets and "index" not in targets
    (url,) = _index_urls(manifests)
    assert "password_env=VALKEY_INDEX_PASSWORD" in url
    router = next(
        w for w in workloads(manifests) if pod_labels(w)["app.kubernetes.io/component"] == "router"
    )
    env = {v["name"]: v for v in container(router)["env"]}
    assert (
        env["VALKEY_INDEX_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
        == "kv-kvstack-redis-password"
    )
