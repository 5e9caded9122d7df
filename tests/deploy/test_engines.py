"""Golden checks on the engine pods: the connector config, tiers and index settings they carry
are the ones kvstack's own code accepts and the router and index expect."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kvstack.cluster.config import IndexConfig
from kvstack.config import load_config, load_section
from kvstack.deploy.chart import ChartManifest
from kvstack.integrations.settings import split_extra_config
from kvstack.kv.tiers.base import parse_tier_url
from kvstack.kv.tiers.redis.redis_url import parse_redis_url
from kvstack.kv.tiers.s3.s3_url import parse_s3_url
from kvstack.router.fleet.discovery.kubernetes import pod_backend
from kvstack.section import parse_size
from kvstack.stack.vllm_server import VLLMServerSpec, connector_config
from tests.deploy.rendered import (
    NAMESPACE,
    assert_index_reachable,
    container,
    engine_deployments,
    flag,
    of_kind,
    rendered,
)

POD = {"POD_NAME": "kv-kvstack-llama-8b-5d9c7-x2x4q", "POD_IP": "10.1.2.3"}
ROLES = {"both": "kv_both", "prefill": "kv_producer", "decode": "kv_consumer"}
SRC = Path(__file__).resolve().parents[2] / "src" / "kvstack"


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in args and env values."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text
    )


def pod_env(deployment: dict[str, Any]) -> dict[str, str]:
    """Plain env values as the kubelet would set them (secrets stand in as placeholders)."""
    env = dict(POD)
    for var in container(deployment).get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "secretKeyRef" in var.get("valueFrom", {}):
            env[var["name"]] = "secret-" + var["name"].lower()
    return env


def transfer_config(deployment: dict[str, Any]) -> dict[str, Any] | None:
    raw = flag(container(deployment)["args"], "--kv-transfer-config")
    return None if raw is None else dict(json.loads(raw))


def kv_engines(manifests: tuple[ChartManifest, ...]) -> list[dict[str, Any]]:
    return [d for d in engine_deployments(manifests) if transfer_config(d) is not None]


@pytest.fixture(autouse=True)
def _no_kvstack_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in list(os.environ):
        if var.startswith("KVSTACK_"):
            monkeypatch.delenv(var)


def test_some_values_sets_enable_the_connector() -> None:
    assert kv_engines(rendered("defaults")) and kv_engines(rendered("all-features"))


def test_connector_config_has_the_shape_kvstack_builds(
    manifests: tuple[ChartManifest, ...],
) -> None:
    for d in kv_engines(manifests):
        config = transfer_config(d)
        assert config is not None
        extra = dict(config["kv_connector_extra_config"])
        role = d["spec"]["template"]["metadata"]["labels"]["kvstack.io/role"]
        expected = connector_config(
            extra.pop("tiers"), ROLES[role], extra.pop("chunk_size"), **extra
        )
        assert {k: v for k, v in config.items() if k != "engine_id"} == expected


def test_engines_with_the_connector_drain_on_sigterm(manifests: tuple[ChartManifest, ...]) -> None:
    """vLLM's default shutdown kills the worker before the connector's queued chunk writes
    land; the chart starts engines as kvstack's own launcher does, within the pod's grace."""
    launcher = VLLMServerSpec(model="m", port=1)
    for d in kv_engines(manifests):
        drain = flag(container(d)["args"], "--shutdown-timeout")
        assert drain == str(launcher.shutdown_timeout_s)
        worker = pod_env(d)["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"]
        assert worker == str(launcher.worker_shutdown_timeout_s)
        grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > int(drain) + int(worker)
    for d in engine_deployments(manifests):
        if transfer_config(d) is None:
            assert flag(container(d)["args"], "--shutdown-timeout") is None


def test_the_connector_class_is_exported_where_the_config_points() -> None:
    config = transfer_config(kv_engines(rendered("defaults"))[0])
    assert config is not None
    module = SRC.joinpath(*config["kv_connector_module_path"].split(".")[1:], "__init__.py")
    tree = ast.parse(module.read_text())
    exported = next(
        n.value for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )  # fmt: skip
    assert config["kv_connector"] in ast.literal_eval(exported)


def test_connector_settings_and_kv_section_validate(
    manifests: tuple[ChartManifest, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    for d in kv_engines(manifests):
        env = pod_env(d)
        for name in ("KVSTACK_REDIS_PASSWORD",):
            if name in env:
                monkeypatch.setenv(name, env[name])
        extra = json.loads(expand(json.dumps(transfer_config(d)), env))["kv_connector_extra_config"]
        _, kv = split_extra_config(extra)  # raises on an unknown key or a bad value
        assert kv.tiers == extra["tiers"]


def test_every_tier_url_is_accepted_by_its_tier(
    manifests: tuple[ChartManifest, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSTACK_REDIS_PASSWORD", "placeholder")
    for d in kv_engines(manifests):
        env = pod_env(d)
        config = transfer_config(d)
        assert config is not None
        for raw in config["kv_connector_extra_config"]["tiers"]:
            url = parse_tier_url(expand(raw, env))
            check_tier(url, env)


def check_tier(url: Any, env: dict[str, str]) -> None:
    if url.scheme == "redis":
        parse_redis_url(url)  # rejects unknown parameters
        if "password_env" in url.url:
            assert "KVSTACK_REDIS_PASSWORD" in env
    elif url.scheme == "s3":
        parse_s3_url(url)
    elif url.scheme in ("cpu", "file"):
        assert set(url.params) == {"size"}
        assert parse_size(url.params["size"]) > 0
    else:
        assert url.scheme == "peer"
        assert set(url.params) == {"index", "self"}


def test_disk_tier_lives_on_a_mounted_volume(manifests: tuple[ChartManifest, ...]) -> None:
    for d in kv_engines(manifests):
        tiers = transfer_config(d)["kv_connector_extra_config"]["tiers"]  # type: ignore[index]
        mounts = {m["mountPath"] for m in container(d)["volumeMounts"]}
        for tier in tiers:
            if tier.startswith("file://"):
                assert parse_tier_url(tier).path in mounts


def test_engines_are_named_as_the_router_knows_them(manifests: tuple[ChartManifest, ...]) -> None:
    """vLLM's engine_id (the announced instance id), the peer tier's ``self`` and the announce
    setting are one name: the host:port the router's pod discovery gives the backend."""
    config_maps = [c for c in of_kind(manifests, "ConfigMap") if "config.yaml" in c["data"]]
    router = load_config(data=yaml.safe_load(config_maps[0]["data"]["config.yaml"]), env={})
    for d in kv_engines(manifests):
        env = pod_env(d)
        config = json.loads(expand(json.dumps(transfer_config(d)), env))
        backend = pod_backend(running_pod(d), router.router.discovery.kubernetes)
        assert backend is not None
        assert config["engine_id"] == urlsplit(backend.url).netloc
        for tier in config["kv_connector_extra_config"]["tiers"]:
            if tier.startswith("peer://"):
                assert parse_tier_url(tier).params["self"] == config["engine_id"]
        if "KVSTACK_INDEX_ANNOUNCE__INSTANCE_ID" in env:
            assert env["KVSTACK_INDEX_ANNOUNCE__INSTANCE_ID"] == config["engine_id"]


def running_pod(deployment: dict[str, Any]) -> Any:
    """A Ready pod of the Deployment, shaped like the Kubernetes client's objects."""
    meta = deployment["spec"]["template"]["metadata"]
    return SimpleNamespace(
        metadata=SimpleNamespace(name=POD["POD_NAME"], namespace=NAMESPACE,
                                 labels=meta["labels"], deletion_timestamp=None),
        status=SimpleNamespace(pod_ip=POD["POD_IP"], phase="Running",
                               conditions=[SimpleNamespace(type="Ready", status="True")]),
    )  # fmt: skip


def test_index_settings_validate_and_point_at_the_index_service(
    manifests: tuple[ChartManifest, ...],
) -> None:
    services = {s["metadata"]["name"]: s for s in of_kind(manifests, "Service")}
    for d in kv_engines(manifests):
        env = pod_env(d)
        index = load_section("index", IndexConfig, env=env)
        args = container(d)["args"]
        if not index.announce.index_url:
            assert not any(t.startswith("peer://") for t in _tiers(d))
            continue
        assert_index_reachable(index.announce.index_url, services, env)
        assert index.announce.served_model_names == [flag(args, "--served-model-name")]
        for tier in _tiers(d):
            if tier.startswith("peer://"):
                assert parse_tier_url(tier).params["index"] == index.announce.index_url
        if index.peer.enabled:
            ports = {p["containerPort"] for p in container(d)["ports"]}
            assert index.peer.port in ports
            assert index.announce.peer_address == f"{POD['POD_IP']}:{index.peer.port}"


def _tiers(deployment: dict[str, Any]) -> list[str]:
    config = transfer_config(deployment)
    return [] if config is None else list(config["kv_connector_extra_config"]["tiers"])


def test_kv_role_follows_the_pod_role(manifests: tuple[ChartManifest, ...]) -> None:
    for d in kv_engines(manifests):
        role = d["spec"]["template"]["metadata"]["labels"]["kvstack.io/role"]
        assert transfer_config(d)["kv_role"] == ROLES[role]  # type: ignore[index]


def test_pd_example_has_both_roles() -> None:
    roles = {
        d["spec"]["template"]["metadata"]["labels"]["kvstack.io/role"]
        for d in engine_deployments(rendered("example:pd-disaggregated"))
    }
    assert roles == {"prefill", "decode"}


def test_kv_events_use_the_router_key_space(manifests: tuple[ChartManifest, ...]) -> None:
    for d in engine_deployments(manifests):
        args, c = container(d)["args"], container(d)
        raw = flag(args, "--kv-events-config")
        if raw is None:
            continue
        events = json.loads(raw)
        assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
        port = int(events["endpoint"].rsplit(":", 1)[1])
        assert {"name": "kv-events", "containerPort": port, "protocol": "TCP"} in c["ports"]
        # The simulator and router hash blocks as vLLM's sha256_cbor (kvstack.sim.hashing).
        assert flag(args, "--prefix-caching-hash-algo") == "sha256_cbor"


def test_lora_runtime_updates_only_with_lora(manifests: tuple[ChartManifest, ...]) -> None:
    for d in engine_deployments(manifests):
        c = container(d)
        runtime = [v for v in c.get("env", []) if v["name"] == "VLLM_ALLOW_RUNTIME_LORA_UPDATING"]
        assert bool(runtime) == ("--enable-lora" in c["args"])
        if runtime:
            assert flag(c["args"], "--max-loras") and flag(c["args"], "--max-cpu-loras")


def test_gpu_requests_match_tensor_parallel_size(manifests: tuple[ChartManifest, ...]) -> None:
    for d in engine_deployments(manifests):
        c = container(d)
        gpus = c["resources"]["limits"].get("nvidia.com/gpu", 0)
        assert c["resources"]["requests"].get("nvidia.com/gpu", 0) == gpus
        assert int(flag(c["args"], "--tensor-parallel-size") or 0) == max(1, gpus)


def test_probes_leave_headroom_for_model_load(manifests: tuple[ChartManifest, ...]) -> None:
    for d in engine_deployments(manifests):
        startup = container(d)["startupProbe"]
        assert startup["httpGet"]["path"] == "/health"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
