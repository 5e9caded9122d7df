"""The hardened chart: non-root engines without privileges, the cluster secret in every
component, router auth on by default, vLLM's API key whenever LoRA is on, the Valkey password
off every command line (the rendered command run for real against redis-server), and network
policies that limit egress as well as ingress."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kvstack.deploy.chart import ChartManifest
from kvstack.router.http.auth import parse_keys_file
from kvstack.section import load_section
from kvstack.security import MIN_SECRET_BYTES, SecurityConfig
from kvstack.stack.ports import free_port
from tests.deploy.rendered import container, engine_deployments, of_kind, render, rendered
from tests.deploy.test_wiring import router_config, workloads

LORA = {"engine": {"lora": {"enabled": True}}}


def _component(
    manifests: tuple[ChartManifest, ...] | list[ChartManifest], name: str
) -> dict[str, Any]:
    (found,) = [w for w in workloads(tuple(manifests)) if w["metadata"]["name"].endswith(name)]
    return found


def _present(manifests: tuple[ChartManifest, ...], *names: str) -> list[dict[str, Any]]:
    """The router and index workloads a values set renders (some switch one off)."""
    return [w for w in workloads(manifests) if w["metadata"]["name"].endswith(names)]


def _env(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(workload).get("env", [])}


def _secret(
    manifests: tuple[ChartManifest, ...] | list[ChartManifest], name: str
) -> dict[str, str]:
    (secret,) = [s for s in of_kind(manifests, "Secret") if s["metadata"]["name"] == name]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_engines_run_unprivileged(manifests: tuple[ChartManifest, ...]) -> None:
    for engine in engine_deployments(manifests):
        pod = engine["spec"]["template"]["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        box = container(engine)["securityContext"]
        assert box["allowPrivilegeEscalation"] is False
        assert box["capabilities"] == {"drop": ["ALL"]}
        assert box["seccompProfile"] == {"type": "RuntimeDefault"}
        assert _env(engine)["HOME"]["value"] == "/home/vllm"  # writable whatever the image
    for workload in _present(manifests, "-router", "-index"):
        box = container(workload)["securityContext"]
        assert box["capabilities"] == {"drop": ["ALL"]} and box["readOnlyRootFilesystem"]


def test_the_cluster_secret_is_mounted_into_every_component(
    manifests: tuple[ChartManifest, ...],
) -> None:
    components = _present(manifests, "-router", "-index") + engine_deployments(manifests)
    for workload in components:
        path = _env(workload)["KVSTACK_SECURITY_CLUSTER_SECRET_FILE"]["value"]
        env = {"KVSTACK_SECURITY_CLUSTER_SECRET_FILE": path}
        assert load_section("security", SecurityConfig, env=env).cluster_secret_file == path
        mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
        assert path.startswith(mounts["cluster-secret"]["mountPath"] + "/")
        assert mounts["cluster-secret"]["readOnly"] is True
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        source = volumes["cluster-secret"]["secret"]
        assert [i["path"] for i in source["items"]] == [path.rsplit("/", 1)[1]]
        rendered_secrets = {x["metadata"]["name"] for x in of_kind(manifests, "Secret")}
        if source["secretName"] in rendered_secrets:  # generated: long enough to be accepted
            value = _secret(manifests, source["secretName"])[source["items"][0]["key"]]
            assert len(value) >= MIN_SECRET_BYTES


def test_a_named_cluster_secret_is_used_and_none_generated() -> None:
    manifests = render({"security": {"clusterSecret": {"name": "kv-shared", "key": "s"}}})
    assert "kv-kvstack-cluster-secret" not in {
        s["metadata"]["name"] for s in of_kind(manifests, "Secret")
    }
    router = _component(manifests, "-router")  # the index is in Valkey by default
    assert (
        _env(router)["KVSTACK_SECURITY_CLUSTER_SECRET_FILE"]["value"]
        == "/etc/kvstack/cluster-secret/s"
    )
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cluster-secret"]["secret"]["secretName"] == "kv-shared"


def test_router_auth_is_on_by_default_with_a_generated_key() -> None:
    manifests = rendered("defaults")
    auth_file = router_config(manifests).router.auth.api_keys_file
    assert auth_file == "/etc/kvstack/auth/api-keys"
    router = _component(manifests, "-router")
    mounts = {m["name"]: m["mountPath"] for m in container(router)["volumeMounts"]}
    assert auth_file.startswith(mounts["api-keys"] + "/")
    keys = parse_keys_file(_secret(manifests, "kv-kvstack-api-keys")["api-keys"])
    assert list(keys.values()) == ["default"]
    off = render({"router": {"auth": {"enabled": False}}})
    assert router_config(tuple(off)).router.auth.api_keys_file is None


def test_vllm_api_key_is_set_whenever_lora_is_enabled() -> None:
    plain = rendered("defaults")
    assert all("VLLM_API_KEY" not in _env(e) for e in engine_deployments(plain))
    for values in (LORA, {"models": [{"name": "m", "model": "x", "lora": {"enabled": True}}]}):
        manifests = render(values)
        router_key = _env(_component(manifests, "-router"))["KVSTACK_ROUTER_AUTH__UPSTREAM_API_KEY"]
        for engine in engine_deployments(manifests):
            engine_key = _env(engine)["VLLM_API_KEY"]
            assert engine_key["valueFrom"] == router_key["valueFrom"]  # the router holds it
        assert _secret(manifests, "kv-kvstack-engine-api-key")["api-key"]


def test_valkey_password_is_never_on_a_command_line(manifests: tuple[ChartManifest, ...]) -> None:
    for workload in workloads(manifests):
        for box in workload["spec"]["template"]["spec"]["containers"]:
            line = " ".join([*box.get("command", []), *box.get("args", [])])
            assert "$(REDIS_PASSWORD)" not in line and "--requirepass" not in line


def _valkey_script() -> list[str]:
    (valkey,) = of_kind(rendered("defaults"), "StatefulSet")
    box = container(valkey)
    return [*box["command"], *box["args"]]


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@pytest.mark.parametrize("password", ['pl4nted-"quote\\back slash'])
def test_the_rendered_valkey_command_requires_the_password_and_hides_it(
    password: str, tmp_path: Path
) -> None:
    """The chart's own command, run with redis-server (the same config language) in place of
    valkey-server: clients need the password, and neither the server's command line nor its
    environment shows it."""
    port = free_port()
    argv = [a.replace("/run/valkey", str(tmp_path)).replace("valkey-server", "redis-server")
            for a in _valkey_script()]  # fmt: skip
    argv[-1] = argv[-1].rstrip() + f" --port {port} --bind 127.0.0.1 --dir {tmp_path}"
    env = {"PATH": os.environ["PATH"], "REDIS_PASSWORD": password}
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        assert _command(port, ["PING"]).startswith(b"-NOAUTH")
        assert _command(port, ["AUTH", password, "PING"]).endswith(b"+PONG\r\n")
        proc = Path(f"/proc/{server.pid}")
        assert password.encode() not in (proc / "cmdline").read_bytes()
        assert password.encode() not in (proc / "environ").read_bytes()
        assert (tmp_path / "auth.conf").stat().st_mode & 0o077 == 0
    finally:
        server.terminate()
        server.wait(10)


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("redis-server did not start")


def _command(port: int, words: list[str]) -> bytes:
    """RESP commands (AUTH then PING, or PING) and the raw replies."""
    parts = [words[:2], words[2:]] if words[0] == "AUTH" else [words]
    payload = b""
    for part in (p for p in parts if p):
        payload += f"*{len(part)}\r\n".encode()
        for word in part:
            raw = word.encode()
            payload += f"${len(raw)}\r\n".encode() + raw + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        time.sleep(0.2)
        return conn.recv(4096)


def _policy(manifests: tuple[ChartManifest, ...], suffix: str) -> dict[str, Any]:
    (found,) = [
        p for p in of_kind(manifests, "NetworkPolicy") if p["metadata"]["name"].endswith(suffix)
    ]
    return found


def _egress_targets(policy: dict[str, Any]) -> set[tuple[str, int | str]]:
    out = set()
    for rule in policy["spec"]["egress"]:
        for peer in rule.get("to", []):
            component = (
                peer.get("podSelector", {})
                .get("matchLabels", {})
                .get("app.kubernetes.io/component", "dns" if "k8s-app" in str(peer) else "?")
            )
            out |= {(component, p["port"]) for p in rule["ports"]}
    return out


def test_network_policies_limit_egress_to_what_each_component_calls() -> None:
    manifests = rendered("defaults")
    engine = _policy(manifests, "-engine")
    assert engine["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # The index lives in the chart's Valkey by default: engines and the router reach it there.
    assert _egress_targets(engine) == {("dns", 53), ("engine", 8400), ("redis", 6379)}
    router = _policy(manifests, "-router")
    assert "Egress" in router["spec"]["policyTypes"]
    assert _egress_targets(router) == {
        ("dns", 53),
        ("engine", 8000),
        ("engine", 5557),
        ("redis", 6379),
    }
    served = tuple(render({"index": {"backend": "service"}}))  # the index server instead
    assert ("index", 8300) in _egress_targets(_policy(served, "-engine"))
    assert ("index", 8300) in _egress_targets(_policy(served, "-router"))
    assert ("redis", 6379) not in _egress_targets(_policy(served, "-router"))
    for policy in (_policy(served, "-index"), _policy(manifests, "-redis")):
        assert "Egress" in policy["spec"]["policyTypes"]
        assert _egress_targets(policy) <= {("dns", 53)}
    # Rules without `to` are exactly the configured extras (HTTPS, the Kubernetes API).
    for policy in (engine, router):
        open_rules = [r for r in policy["spec"]["egress"] if "to" not in r]
        assert all({p["port"] for p in r["ports"]} <= {443, 6443} for r in open_rules)
    air_gapped = render({"networkPolicy": {"engineExtraEgress": [], "routerExtraEgress": []}})
    for suffix in ("-engine", "-router"):
        assert all("to" in r for r in _policy(tuple(air_gapped), suffix)["spec"]["egress"])


def test_the_metrics_namespace_reaches_only_the_metrics_ports_of_its_scrapers() -> None:
    served = tuple(render({"index": {"backend": "service"}}))
    for manifests, suffix in ((rendered("defaults"), "-engine"), (served, "-index")):
        for rule in _policy(manifests, suffix)["spec"]["ingress"]:
            for peer in rule["from"]:
                if "namespaceSelector" in peer:
                    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
                    assert peer["podSelector"] == {
                        "matchLabels": {"app.kubernetes.io/name": "prometheus"}
                    }
