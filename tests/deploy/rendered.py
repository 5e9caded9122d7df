"""Values sets the deploy tests render, a per-session render cache, and manifest helpers."""

from __future__ import annotations

import functools
import os
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

from kvstack.deploy.chart import CHART_DIR, ChartManifest, load_values, render_chart
from kvstack.index.valkey.url import parse_valkey_url

REPO = CHART_DIR.parents[2]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
VLLM_LIST = REPO / "tests" / "deploy" / "vllm_metrics.txt"  # kvstack deploy vllm-metrics
NAMESPACE = "llm"
RELEASE = "kv"

# Everything optional switched on over the defaults: monitors, engine autoscaling, adapters.
ALL_FEATURES: dict[str, Any] = {
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "engine": {
        "autoscaling": {"enabled": True},
        "lora": {"enabled": True},
        "apiKeySecret": {"name": "vllm-key"},
        "hfTokenSecret": {"name": "hf"},
        "weights": {"enabled": True},
    },
    "kv": {"disk": {"size": "100GiB"}, "s3": {"enabled": True, "bucket": "b",
                                                "existingSecret": "s3"}},
    "redis": {"passwordSecret": {"name": "redis-auth"}},
    "router": {"apiKeysSecret": {"name": "keys"}},
    "adapters": {"enabled": True, "registry": {"type": "postgresql", "urlSecret": {"name": "pg"}},
                 "adminKeySecret": {"name": "admin"}, "sharedVolume": {"enabled": True}},
}  # fmt: skip

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-features": ALL_FEATURES,
    **{f"example:{p.stem}": load_values([p]) for p in EXAMPLES},
}


@functools.cache
def rendered(name: str) -> tuple[ChartManifest, ...]:
    return tuple(render_chart(VALUE_SETS[name], release=RELEASE, namespace=NAMESPACE))


def render(values: dict[str, Any]) -> list[ChartManifest]:
    return render_chart(values, release=RELEASE, namespace=NAMESPACE)


def of_kind(
    manifests: tuple[ChartManifest, ...] | list[ChartManifest], kind: str
) -> list[dict[str, Any]]:
    return [m.doc for m in manifests if m.kind == kind]


def engine_deployments(
    manifests: tuple[ChartManifest, ...] | list[ChartManifest],
) -> list[dict[str, Any]]:
    return [
        d for d in of_kind(manifests, "Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        == "engine"
    ]  # fmt: skip


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    return containers[0]


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in an argument list, or None."""
    return args[args.index(name) + 1] if name in args else None


def assert_index_reachable(
    url: str, services: dict[str, dict[str, Any]], env: dict[str, str]
) -> None:
    """The index URL names a Service of this release and a port it serves (the index server's,
    or the chart's Valkey), or an external Valkey; a Valkey URL is one kvstack accepts, and a
    password it reads from the environment is in ``env`` (the pod's variables)."""
    parts = urlsplit(url)
    if parts.scheme == "redis":
        with mock.patch.dict(os.environ, {"VALKEY_INDEX_PASSWORD": "placeholder"}):
            options = parse_valkey_url(url)
        assert (options.prefix and options.password is None) or "VALKEY_INDEX_PASSWORD" in env
        if parts.hostname not in services:
            return  # an external Valkey (index.valkey.url or redis.url)
    ports = [p["port"] for p in services[str(parts.hostname)]["spec"]["ports"]]
    assert (parts.port or 6379) in ports
