"""What ``kvstack up`` runs: each component as a command line, a port and a health check.

Pure planning, no processes: :func:`plan_stack` turns a :class:`StackConfig` into an ordered
list of :class:`Component` (shared stores first, then engines, then the router), with ports
resolved and tier URLs expanded, so the supervisor only has to start and watch them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kvstack.index.urls import zmq_url
from kvstack.kv.tiers.redis.redis_server import large_value_env
from kvstack.stack.config import StackConfig, StackEngineSpec
from kvstack.stack.cores import CorePlan, bind_engine, engine_core_plan, replica_names
from kvstack.stack.ports import free_port
from kvstack.stack.secrets import REDIS_PASSWORD_ENV, REDIS_USER, StackSecrets, redis_conf
from kvstack.stack.vllm_server import VLLMServerSpec, connector_config

__all__ = ["Component", "plan_stack"]

Health = Literal["http", "redis"]


@dataclass
class Component:
    name: str
    kind: Literal["engine", "router", "index", "redis"]
    argv: list[str]
    host: str
    port: int
    health: Health = "http"
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 60.0
    role: str = "both"
    model: str = ""
    events: str | None = None  # ZMQ endpoint the router subscribes to for KV events
    tokenizer: str | None = None  # what the router tokenizes this engine's prompts with
    lora: dict[str, Any] | None = None  # its entry in lora.engines (without the URL)
    zmq_port: int | None = None  # the index server's ZMQ port
    routed: bool = True  # an engine behind the router
    cores: tuple[int, ...] = ()  # the cores a vLLM engine computes on (VLLM_CPU_OMP_THREADS_BIND)
    cpus: tuple[int, ...] = ()  # the process's CPU affinity; empty: not pinned

    @property
    def url(self) -> str:
        scheme = "redis" if self.health == "redis" else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


class _Ports:
    """Fixed ports as configured; the rest picked free, never twice."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.taken: set[int] = set()

    def take(self, wanted: int | None) -> int:
        port = wanted if wanted is not None else self._free()
        self.taken.add(port)
        return port

    def _free(self) -> int:
        while True:
            port = free_port(self.host)
            if port not in self.taken:
                return port


def resolve_model(model: str) -> str:
    """``toy`` / ``toy-small``: the locally built random-weight models; else as given."""
    if model not in ("toy", "toy-small"):
        return model
    from kvstack.models.toy import SMALL, TINY, build_toy_model

    return str(build_toy_model(spec=SMALL if model == "toy-small" else TINY))


def plan_stack(
    config: StackConfig, run_dir: Path, secrets: StackSecrets | None = None
) -> list[Component]:
    """The components, in start order; with ``secrets`` each one gets the cluster secret and
    redis-server its password (from a 0600 config file, never the command line)."""
    ports = _Ports(config.host)
    out: list[Component] = []
    cores = engine_core_plan(config)
    reserved = cores.reserved if cores else ()
    redis_url = ""
    if config.redis is not None:
        port = ports.take(config.redis.port)
        if secrets is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            argv = [config.redis.binary, str(redis_conf(run_dir, config.host, port,
                                                        secrets.redis_password))]  # fmt: skip
            redis_url = (
                f"redis://{REDIS_USER}@{config.host}:{port}/0?password_env={REDIS_PASSWORD_ENV}"
            )
        else:
            argv = [config.redis.binary, "--port", str(port), "--bind", config.host]
            argv += ["--save", "", "--appendonly", "no", "--dir", str(run_dir)]
            redis_url = f"redis://{config.host}:{port}/0"
        out.append(Component("redis", "redis", argv, config.host, port, "redis",
                             env=large_value_env(), cpus=reserved,
                             start_timeout_s=config.redis.start_timeout_s))  # fmt: skip
    if config.index is not None:
        port, zmq_port = ports.take(config.index.port), ports.take(config.index.zmq_port)
        argv = [sys.executable, "-m", "kvstack", "index-server", "--host", config.host,
                "--port", str(port), "--zmq-port", str(zmq_port)]  # fmt: skip
        out.append(Component("index", "index", argv, config.host, port, zmq_port=zmq_port,
                             cpus=reserved,
                             start_timeout_s=config.index.start_timeout_s))  # fmt: skip
    index_url = next((c.url for c in out if c.kind == "index"), None)
    ctx = _Context(
        config.host, {"run_dir": str(run_dir.resolve()), "redis_url": redis_url}, index_url, cores
    )
    for spec in config.engines:
        model = resolve_model(spec.model) if spec.kind == "vllm" else spec.model
        for replica, name in enumerate(replica_names(spec)):
            wanted = None if spec.port is None else spec.port + replica
            events = ports.take(None) if spec.kv_events else None
            out.append(_engine(spec, name, model, ports.take(wanted), events, ctx))
    if config.router is not None:
        router = _router(config, out, ports.take(config.router.port), run_dir)
        router.cpus = reserved
        out.append(router)
    if secrets is not None:
        for c in out:
            c.env.update(secrets.component_env())
            if c.kind == "engine" and redis_url:
                c.env[REDIS_PASSWORD_ENV] = secrets.redis_password
    return out


@dataclass(frozen=True)
class _Context:
    host: str
    expand: dict[str, str]
    index_url: str | None
    cores: CorePlan | None


def _engine(
    spec: StackEngineSpec, name: str, model: str, port: int, events: int | None, ctx: _Context
) -> Component:
    served = spec.served_model_name or (spec.model if spec.model.startswith("toy") else None)
    tiers = [t.format(**ctx.expand) for t in spec.connector.tiers] if spec.connector else []
    url = f"http://{ctx.host}:{port}"
    tokenizer: str | None
    cores: tuple[int, ...] = ()
    if spec.kind == "sim":
        argv = _sim_argv(spec, served or model, ctx.host, port, tiers)
        if events is not None:
            argv += ["--kv-events-endpoint", _bind_endpoint(ctx.host, events)]
        env, tokenizer = dict(spec.env), "sim"
    else:
        extra = _connector_extra(spec, url, ctx.index_url)
        argv, env = _vllm_argv(spec, model, served, ctx.host, port, tiers, extra, events)
        tokenizer = model if Path(model).is_dir() else None
        cores = bind_engine(env, ctx.cores, name, connector=spec.connector is not None)
    if spec.lora is not None and spec.kind == "sim":
        argv += ["--enable-lora", "--max-loras", str(spec.lora.max_loras)]
        argv += ["--max-cpu-loras", str(spec.lora.max_cpu_loras)]
    return Component(name, "engine", argv, ctx.host, port, env=env,
                     start_timeout_s=spec.start_timeout_s, role=spec.role,
                     model=served or model, tokenizer=tokenizer, routed=spec.routed, cores=cores,
                     events=None if events is None else f"tcp://{ctx.host}:{events}",
                     lora=_lora_engine(spec, name, served or model, model, ctx))  # fmt: skip


def _bind_endpoint(host: str, port: int) -> str:
    """Where an engine publishes KV events: the stack's address, not every interface (the
    events carry no credential)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _lora_engine(
    spec: StackEngineSpec, name: str, served: str, model: str, ctx: _Context
) -> dict[str, Any] | None:
    if spec.lora is None:
        return None
    entry: dict[str, Any] = {
        "base_model": spec.lora.base_model or served,
        "served_model_name": served,
        "warm_dir": str(Path(ctx.expand["run_dir"]) / "lora" / "warm" / name),
        "gpu_slots": spec.lora.max_loras,
        "host_slots": spec.lora.max_cpu_loras,
        "max_lora_rank": spec.lora.max_lora_rank,
    }
    if Path(model).is_dir():
        entry["model_dir"] = model  # its config.json gives the shapes adapters must match
    return entry


def _connector_extra(spec: StackEngineSpec, url: str, index_url: str | None) -> dict[str, Any]:
    """The connector's extra keys; with a stack index, announce under the engine's URL."""
    extra = dict(spec.connector.extra) if spec.connector else {}
    if index_url and spec.connector is not None and "index" not in extra:
        extra["index"] = {"announce": {"index_url": index_url, "instance_id": url}}
    return extra


def _sim_argv(
    spec: StackEngineSpec, model: str, host: str, port: int, tiers: list[str]
) -> list[str]:
    argv = [sys.executable, "-m", "kvstack", "sim-engine", "--host", host, "--port", str(port)]
    argv += ["--model", model, "--max-model-len", str(spec.max_model_len)]
    for tier in tiers:
        argv += ["--kv-tiers", tier]
    if spec.connector is not None:
        argv += ["--kv-chunk-size", str(spec.connector.chunk_size)]
    return argv + list(spec.args)


def _vllm_argv(
    spec: StackEngineSpec,
    model: str,
    served: str | None,
    host: str,
    port: int,
    tiers: list[str],
    extra: dict[str, Any],
    events: int | None,
) -> tuple[list[str], dict[str, str]]:
    connector = None
    if spec.connector is not None:
        c = spec.connector
        connector = connector_config(tiers, c.role, c.chunk_size, **extra)
    vspec = VLLMServerSpec(
        model=model,
        port=port,
        host=host,
        served_model_name=served,
        max_model_len=spec.max_model_len,
        kv_cache_space_gib=spec.kv_cache_space_gib,
        kv_transfer_config=connector,
        kv_events_endpoint=None if events is None else _bind_endpoint(host, events),
        enable_lora=spec.lora is not None,
        max_loras=spec.lora.max_loras if spec.lora else 1,
        max_cpu_loras=spec.lora.max_cpu_loras if spec.lora else None,
        max_lora_rank=spec.lora.max_lora_rank if spec.lora else 16,
        extra_args=list(spec.args),
        env=dict(spec.env),
    )
    return vspec.argv(), vspec.environment({})


def _router(config: StackConfig, parts: list[Component], port: int, run_dir: Path) -> Component:
    assert config.router is not None
    section = dict(config.router.config)
    section.update(host=config.host, port=port)
    engines = [c for c in parts if c.kind == "engine" and c.routed]
    section["backends"] = [{"url": c.url, "name": c.name, "role": c.role} for c in engines]
    prefix = dict(section.get("prefix", {}))
    tokenizers = {c.model: c.tokenizer for c in engines if c.tokenizer}
    prefix["tokenizers"] = {**tokenizers, **prefix.get("tokenizers", {})}
    sources = {c.url: c.events for c in engines if c.events}
    if sources:
        events = dict(prefix.get("events", {}))
        events["sources"] = {**sources, **events.get("sources", {})}
        prefix["events"] = events
    index = next((c for c in parts if c.kind == "index"), None)
    if index is not None:  # the router's lookups go over ZMQ: no HTTP round trip per request
        assert index.zmq_port is not None
        prefix.setdefault("index_url", zmq_url(index.host, index.zmq_port))
    section["prefix"] = prefix
    if config.router.policy:
        section["policy"] = config.router.policy
    document: dict[str, Any] = {"router": section}
    if config.lora is not None:
        section["adapters"] = {"enabled": True, **section.get("adapters", {})}
        document["lora"] = _lora_section(config.lora, engines, run_dir)
    path = run_dir / "router.yaml"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(json.loads(json.dumps(document)), sort_keys=False))
    argv = [sys.executable, "-m", "kvstack", "router", "--config", str(path)]
    return Component("router", "router", argv, config.host, port,
                     start_timeout_s=config.router.start_timeout_s)  # fmt: skip


def _lora_section(given: dict[str, Any], engines: list[Component], run_dir: Path) -> dict[str, Any]:
    """The control plane's config: the stack's ``lora`` with ``{run_dir}`` expanded, local
    registry and store under the run directory by default, and its engines filled in."""
    root = str(run_dir.resolve())
    lora: dict[str, Any] = json.loads(json.dumps(given).replace("{run_dir}", root))
    lora.setdefault("registry_url", f"sqlite:///{root}/lora/registry.db")
    lora.setdefault("artifact_store", f"file://{root}/lora/store")
    base_models = dict(lora.get("base_models", {}))
    listed = list(lora.get("engines", []))
    for c in engines:
        if c.lora is None:
            continue
        entry = {k: v for k, v in c.lora.items() if k != "model_dir"}
        listed.append({"url": c.url, **entry})
        if "model_dir" in c.lora and entry["base_model"] not in base_models:
            base_models[entry["base_model"]] = {"path": c.lora["model_dir"]}
    lora["engines"] = listed
    if base_models:
        lora["base_models"] = base_models
    from kvstack.lora.config import LoRAConfig
    from kvstack.section import validate_section

    validate_section(LoRAConfig, lora, "stack.lora")  # fail before anything starts
    return lora
