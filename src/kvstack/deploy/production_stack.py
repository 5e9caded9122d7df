"""production-stack's Helm values, as the values of kvstack's chart.

``kvstack deploy import-production-stack VALUES.yaml`` reads a production-stack values file
(``servingEngineSpec.modelSpec[]``, each with ``vllmConfig`` and ``lmcacheConfig``;
``routerSpec``; ``cacheserverSpec``) and writes the kvstack values that deploy the same fleet:
one ``models[]`` entry per model spec (served under its ``modelURL``, as production-stack serves
it), the LMCache offload buffers as kvstack tiers, the router's routing logic as a policy, the
LMCache cache server as the chart's Valkey. What has no equivalent is listed, one line per
value with the reason, never dropped in silence. ``docs/migrating.md`` has the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstack.errors import ConfigError

__all__ = ["ImportResult", "import_production_stack"]

ROUTING_LOGIC = {"roundrobin": "round_robin", "session": "session", "prefixaware": "prefix",
                 "kvaware": "ttft"}  # fmt: skip
VLLM_FLAGS = {  # vllmConfig key -> the vLLM flag it stands for (booleans: flag when true)
    "enablePrefixCaching": "--enable-prefix-caching",
    "enableChunkedPrefill": "--enable-chunked-prefill",
    "dtype": "--dtype",
    "maxNumSeqs": "--max-num-seqs",
    "maxNumBatchedTokens": "--max-num-batched-tokens",
}
_IMAGE = "kvstack's engine image (vLLM with kvstack) replaces it: set engine.image"
_ROUTER_IMAGE = "kvstack's image runs the router: set image"


@dataclass(slots=True)
class ImportResult:
    values: dict[str, Any] = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)  # "path: reason"

    def skip(self, path: str, reason: str) -> None:
        self.unmapped.append(f"{path}: {reason}")


def import_production_stack(source: Mapping[str, Any]) -> ImportResult:
    """kvstack chart values for a production-stack values mapping, and what has no place."""
    result = ImportResult()
    for key in source:
        if key not in ("servingEngineSpec", "routerSpec", "cacheserverSpec"):
            result.skip(key, "production-stack's own component; kvstack's chart has none")
    _engines(source.get("servingEngineSpec") or {}, result)
    _router(source.get("routerSpec") or {}, result)
    _cache_server(source.get("cacheserverSpec"), result)
    return result


def _engines(spec: Mapping[str, Any], result: ImportResult) -> None:
    models = []
    for index, model in enumerate(spec.get("modelSpec") or []):
        models.append(_model(model, f"servingEngineSpec.modelSpec[{index}]", result))
    if spec.get("enableEngine") is False:
        models = []
    result.values["models"] = models
    engine: dict[str, Any] = {}
    if "containerPort" in spec:
        engine["port"] = spec["containerPort"]
    if spec.get("tolerations"):
        engine["tolerations"] = spec["tolerations"]
    if spec.get("nodeSelector"):
        engine["nodeSelector"] = spec["nodeSelector"]
    if engine:
        result.values["engine"] = engine
    for key in sorted(set(spec) - {"modelSpec", "enableEngine", "containerPort", "tolerations",
                                   "nodeSelector"}):  # fmt: skip
        result.skip(f"servingEngineSpec.{key}", _ENGINE_SPEC_REASONS.get(key, "no equivalent"))


_ENGINE_SPEC_REASONS = {
    "runtimeClassName": "the chart relies on the cluster's default runtime for GPU pods",
    "servicePort": "kvstack's router reaches engine pods directly (no engine Service port)",
    "labels": "the chart sets its own labels (app.kubernetes.io/*)",
    "strategy": "engine Deployments use the chart's rollout strategy",
}


def _model(spec: Mapping[str, Any], path: str, result: ImportResult) -> dict[str, Any]:
    if not spec.get("name") or not spec.get("modelURL"):
        raise ConfigError(f"{path} needs a name and a modelURL")
    out: dict[str, Any] = {
        "name": _dns_label(str(spec["name"])),
        "model": spec["modelURL"],
        "servedModelName": spec["modelURL"],  # what production-stack's clients ask for
        "replicas": spec.get("replicaCount", 1),
        "role": "both",
    }
    if "requestGPU" in spec:
        out["gpus"] = spec["requestGPU"]
    requests = {k: spec[s] for s, k in (("requestCPU", "cpu"), ("requestMemory", "memory"))
                if s in spec}  # fmt: skip
    if requests:
        out["resources"] = {"requests": {k: str(v) for k, v in requests.items()}}
    if spec.get("pvcStorage"):
        out["weights"] = _weights(spec)
    if spec.get("env"):
        out["env"] = spec["env"]
    _vllm_config(spec.get("vllmConfig") or {}, out, f"{path}.vllmConfig", result)
    kv = _lmcache(spec.get("lmcacheConfig") or {}, f"{path}.lmcacheConfig", result)
    if kv is not None:
        out["kv"] = kv
    _hf_token(spec.get("hf_token"), out, f"{path}.hf_token", result)
    if spec.get("nodeSelectorTerms"):
        terms = spec["nodeSelectorTerms"]
        affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        out["affinity"] = {"nodeAffinity": affinity}
    handled = {"name", "modelURL", "replicaCount", "requestGPU", "requestCPU", "requestMemory",
               "pvcStorage", "pvcAccessMode", "storageClass", "env", "vllmConfig",
               "lmcacheConfig", "hf_token", "nodeSelectorTerms"}  # fmt: skip
    for key in sorted(set(spec) - handled):
        reason = _IMAGE if key in ("repository", "tag", "imagePullPolicy") else "no equivalent"
        result.skip(f"{path}.{key}", reason)
    return out


def _dns_label(name: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")
    if not label:
        raise ConfigError(f"model name {name!r} leaves no DNS label")
    return label


def _weights(spec: Mapping[str, Any]) -> dict[str, Any]:
    weights: dict[str, Any] = {"enabled": True, "size": str(spec["pvcStorage"])}
    if spec.get("storageClass"):
        weights["storageClass"] = spec["storageClass"]
    modes = spec.get("pvcAccessMode") or []
    if modes:
        weights["accessMode"] = modes[0]
    return weights


def _vllm_config(
    config: Mapping[str, Any], out: dict[str, Any], path: str, result: ImportResult
) -> None:
    direct = {"maxModelLen": "maxModelLen", "tensorParallelSize": "tensorParallelSize",
              "gpuMemoryUtilization": "gpuMemoryUtilization", "blockSize": "blockSize"}  # fmt: skip
    args: list[str] = []
    for key, value in config.items():
        if key in direct:
            out[direct[key]] = value
        elif key in VLLM_FLAGS:
            flag = VLLM_FLAGS[key]
            if isinstance(value, bool):
                args += [flag] if value else []
            else:
                args += [flag, str(value)]
        elif key == "extraArgs":
            args += [str(a) for a in value or []]
        else:
            result.skip(f"{path}.{key}", "no kvstack value; pass the vLLM flag in extraArgs")
    if args:
        out["extraArgs"] = args


def _lmcache(config: Mapping[str, Any], path: str, result: ImportResult) -> dict[str, Any] | None:
    """The model's ``kv`` override: production-stack's LMCache buffers as kvstack tiers."""
    if not config:
        return None
    if not config.get("enabled", False):
        return {"enabled": False}
    kv: dict[str, Any] = {"enabled": True}
    cpu = config.get("cpuOffloadingBufferSize")
    kv["cpu"] = {"size": _gib(cpu) if cpu not in (None, "", 0, "0") else ""}
    disk = config.get("diskOffloadingBufferSize")
    if disk not in (None, "", 0, "0"):
        kv["disk"] = {"size": _gib(disk)}
    remote = config.get("remoteUrl")
    if remote:
        result.skip(f"{path}.remoteUrl", _REMOTE)
    for key in sorted(set(config) - {"enabled", "cpuOffloadingBufferSize",
                                     "diskOffloadingBufferSize", "remoteUrl"}):  # fmt: skip
        result.skip(f"{path}.{key}", _LMCACHE_REASONS.get(key, "no equivalent"))
    return kv


_REMOTE = (
    "kvstack's shared tier is the chart's Valkey (redis.mode internal) or an existing one "
    "(redis.mode external, redis.url)"
)
_LMCACHE_REASONS = {
    "enableController": "LMCache's controller: kvstack's index service (index.enabled) plays "
    "its part for the router",
    "controllerPort": "see enableController",
    "workerPort": "see enableController",
    "instanceId": "kvstack names engines by pod",
    "enablePD": "prefill/decode: give model entries role prefill or decode",
    "remoteSerde": "kvstack stores exact KV (naive)",
}


def _gib(size: object) -> str:
    """production-stack's buffer sizes are GB numbers (``"20"``)."""
    text = str(size).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return f"{text}GiB"
    raise ConfigError(f"an LMCache buffer size must be a number of GB, got {size!r}")


def _hf_token(token: object, out: dict[str, Any], path: str, result: ImportResult) -> None:
    if token is None:
        return
    if isinstance(token, Mapping) and token.get("secretName"):
        out["hfTokenSecret"] = {"name": token["secretName"], "key": token.get("secretKey", "token")}
        return
    result.skip(path, "kvstack never takes a secret as a value: create a Secret holding the "
                "token and set hfTokenSecret: {name, key}")  # fmt: skip


def _router(spec: Mapping[str, Any], result: ImportResult) -> None:
    router: dict[str, Any] = {}
    if spec.get("enableRouter") is False:
        router["enabled"] = False
    if "replicaCount" in spec:
        router["replicas"] = spec["replicaCount"]
        router["autoscaling"] = {"enabled": False}  # the count production-stack ran with
    logic = spec.get("routingLogic")
    if logic is not None:
        if logic not in ROUTING_LOGIC:
            result.skip("routerSpec.routingLogic", f"{logic!r}: set up prefill/decode with "
                        "model roles and router.extraConfig.pd")  # fmt: skip
        else:
            router["policy"] = ROUTING_LOGIC[logic]
    if spec.get("sessionKey"):
        router["sessionHeader"] = str(spec["sessionKey"]).lower()
    if spec.get("engineScrapeInterval"):
        router["extraConfig"] = {"scrape": {"interval_s": spec["engineScrapeInterval"]}}
    service = {k: spec[s] for s, k in (("serviceType", "type"), ("servicePort", "port"))
               if s in spec}  # fmt: skip
    if service:
        router["service"] = service
    for key in ("containerPort", "resources", "nodeSelector", "tolerations", "affinity"):
        if key in spec:
            router["port" if key == "containerPort" else key] = spec[key]
    result.values["router"] = router
    handled = {"enableRouter", "replicaCount", "routingLogic", "sessionKey",
               "engineScrapeInterval", "serviceType", "servicePort", "containerPort",
               "resources", "nodeSelector", "tolerations", "affinity"}  # fmt: skip
    for key in sorted(set(spec) - handled):
        reason = _ROUTER_IMAGE if key in ("repository", "tag", "imagePullPolicy") else (
            "kvstack's statistics are Prometheus metrics" if key == "requestStatsWindow"
            else "no equivalent; router flags belong in router.extraConfig")  # fmt: skip
        result.skip(f"routerSpec.{key}", reason)


def _cache_server(spec: Mapping[str, Any] | None, result: ImportResult) -> None:
    if not spec:
        result.values["redis"] = {"mode": "none"}
        return
    result.values["redis"] = {"mode": "internal"}  # Valkey takes the cache server's place
    for key in sorted(spec):
        if key != "replicaCount":
            result.skip(f"cacheserverSpec.{key}", "LMCache's cache server is replaced by the "
                        "chart's Valkey (redis.*)")  # fmt: skip
