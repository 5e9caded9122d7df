"""Fleets for ``bench compare``: simulated engines in one child process, or real vLLM servers.

A fleet starts, reports its engine URLs (and KV event endpoints), resets to a cold state
between runs, loads LoRA adapters, scrapes its engines' metrics, and stops. A simulated
fleet resets by restarting (a second); a vLLM fleet keeps running and resets its prefix
caches through ``/reset_prefix_cache`` (enabled with ``VLLM_SERVER_DEV_MODE=1``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

import aiohttp
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvstack.bench.compare.experiment import FleetSpec
from kvstack.errors import ConfigError
from kvstack.stack.ports import free_port_run
from kvstack.stack.procs import ManagedProcess

__all__ = ["BenchFleet", "EngineSnapshot", "SimBenchFleet", "VLLMBenchFleet", "make_fleet"]

log = logging.getLogger(__name__)


class EngineSnapshot:
    """Counters read from one engine's ``/metrics`` after a run."""

    def __init__(self, text: str) -> None:
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        self.prefix_queries = values.get("vllm:prefix_cache_queries_total", 0.0)
        self.prefix_hits = values.get("vllm:prefix_cache_hits_total", 0.0)
        self.requests = values.get("vllm:request_success_total", 0.0)
        self.preemptions = values.get("vllm:num_preemptions_total", 0.0)
        self.lag_s = values.get("kvstack_sim_step_lag_seconds_total", 0.0)


class BenchFleet(ABC):
    def __init__(self, spec: FleetSpec, workdir: Path, start_timeout_s: float) -> None:
        self.spec = spec
        self.workdir = workdir
        self.start_timeout_s = start_timeout_s
        self.base_port = 0
        self.event_base_port = 0

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.base_port + i}" for i in range(self.spec.engines)]

    @property
    def event_endpoints(self) -> list[str]:
        if not self.spec.kv_events:
            return []
        return [f"tcp://127.0.0.1:{self.event_base_port + i}" for i in range(self.spec.engines)]

    @property
    def model(self) -> str:
        return "sim-model"

    @property
    def block_size(self) -> int:
        return 16

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def reset(self) -> None:
        """Back to cold caches and idle engines, same URLs."""

    @abstractmethod
    def stop(self) -> None: ...

    def load_adapters(self, names: list[str]) -> None:
        """Register adapters on every engine (a scratch directory stands for the weights), all
        at once: each load takes the engine's simulated load time."""
        path = self.workdir / "adapter"
        path.mkdir(parents=True, exist_ok=True)
        asyncio.run(self._load_all(names, str(path)))

    async def _load_all(self, names: list[str], path: str) -> None:
        limit = asyncio.Semaphore(64)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

            async def load(url: str, name: str) -> None:
                body = {"lora_name": name, "lora_path": path}
                async with limit, session.post(url + "/v1/load_lora_adapter", json=body) as r:
                    text = await r.text()
                    if r.status != 200 and "already been loaded" not in text:
                        raise RuntimeError(f"loading adapter {name} on {url}: {text[:200]}")

            await asyncio.gather(*(load(url, name) for url in self.urls for name in names))

    def snapshots(self) -> list[EngineSnapshot]:
        with httpx.Client(timeout=30) as client:
            return [EngineSnapshot(client.get(url + "/metrics").text) for url in self.urls]


class SimBenchFleet(BenchFleet):
    """``kvstack sim-engine --fleet N`` in one child process, configured by a YAML file."""

    def __init__(self, spec: FleetSpec, workdir: Path, start_timeout_s: float) -> None:
        super().__init__(spec, workdir, start_timeout_s)
        self.proc: ManagedProcess | None = None
        self.base_port = free_port_run(spec.engines)
        if spec.kv_events:
            self.event_base_port = free_port_run(spec.engines)
        self.config_path = workdir / "sim-fleet.yaml"
        sim = dict(spec.sim)
        if spec.kv_events:  # engines bind a wildcard endpoint; consumers connect to loopback
            sim["kv_events_endpoint"] = f"tcp://*:{self.event_base_port}"
        self.config = spec.sim_config().model_copy(update=sim)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump({"sim": sim}))

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "kvstack",
            "sim-engine",
            "--fleet",
            str(self.spec.engines),
            "--base-port",
            str(self.base_port),
            "--host",
            "127.0.0.1",
        ]
        env = {"KVSTACK_CONFIG": str(self.config_path), "KVSTACK_LOG_LEVEL": "WARNING"}
        import os

        self.proc = ManagedProcess(
            "sim-fleet", argv, self.workdir / "sim-fleet.log", env=os.environ | env
        )
        self.proc.start()
        try:
            for url in self.urls:
                self.proc.wait_healthy(url + "/health", self.start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def reset(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace_s=5)
            self.proc = None


class VLLMBenchFleet(BenchFleet):
    """Real vLLM OpenAI servers (``kvstack.stack.vllm_server``), one per engine."""

    def __init__(self, spec: FleetSpec, workdir: Path, start_timeout_s: float) -> None:
        super().__init__(spec, workdir, start_timeout_s)
        from kvstack.stack.vllm_server import VLLMServer

        self.servers: list[VLLMServer] = []
        self.base_port = free_port_run(spec.engines)
        if spec.kv_events:
            self.event_base_port = free_port_run(spec.engines)
        self.model_path = self._model_path()

    def _model_path(self) -> str:
        if self.spec.vllm.model != "toy":
            return self.spec.vllm.model
        from kvstack.models.toy import build_toy_model

        return str(build_toy_model())

    @property
    def model(self) -> str:
        return "toy" if self.spec.vllm.model == "toy" else self.model_path

    @property
    def block_size(self) -> int:
        return self.spec.vllm.block_size

    def start(self) -> None:
        from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec

        v = self.spec.vllm
        for i in range(self.spec.engines):
            events = f"tcp://*:{self.event_base_port + i}" if self.spec.kv_events else None
            server_spec = VLLMServerSpec(
                model=self.model_path,
                port=self.base_port + i,
                served_model_name=self.model,
                max_model_len=v.max_model_len,
                kv_cache_space_gib=v.kv_cache_space_gib,
                kv_events_endpoint=events,
                enable_lora=v.enable_lora,
                max_loras=v.max_loras,
                extra_args=["--block-size", str(v.block_size), *v.extra_args],
                env={"VLLM_SERVER_DEV_MODE": "1"},
            )
            server = VLLMServer(server_spec, self.workdir / f"vllm-{i}.log", self.start_timeout_s)
            self.servers.append(server)
            server.start()

    def load_adapters(self, names: list[str]) -> None:
        raise ConfigError(
            "bench compare cannot load LoRA adapters on a vLLM fleet (they need real PEFT "
            "weights); set fleet.load_adapters: false and serve adapters with --lora-modules "
            "in fleet.vllm.extra_args"
        )

    def reset(self) -> None:
        with httpx.Client(timeout=60) as client:
            for url in self.urls:
                client.post(url + "/reset_prefix_cache").raise_for_status()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []


def make_fleet(spec: FleetSpec, workdir: Path | None, start_timeout_s: float) -> BenchFleet:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kvstack-fleet-"))
    cls = SimBenchFleet if spec.kind == "sim" else VLLMBenchFleet
    return cls(spec, workdir, start_timeout_s)
