"""Fixtures of the adapter-cache benchmark: a registry of signed adapters, an artifact store
whose fetches cost modelled time, a counting engine driver, and a simulated engine fleet.

Adapter files are small synthetic PEFT files (a 2-layer toy base model) so that a thousand of
them register in seconds; the *modelled* size of each is that of a q/v LoRA of an 8B Llama at
its rank (about 0.85 MB per rank unit), and a fetch costs ``latency + size / bandwidth`` plus
hashing at ``verify_bytes_per_s``, serialised per engine host (one NIC), in simulated seconds.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvstack.lora.basemodel import BaseModelDims
from kvstack.lora.config import BaseModelRef, LoRAConfig
from kvstack.lora.driver import EngineDriver, EngineLoRAInfo
from kvstack.lora.manifest import Manifest
from kvstack.lora.store import ArtifactRef, ArtifactStore, parse_digest
from kvstack.stack.ports import free_port_run

if TYPE_CHECKING:
    from kvstack.lora.plane import ControlPlane

__all__ = ["BASE_DIMS", "CountingDriver", "LoRABenchFleet", "ModelledStore", "write_adapter"]

BASE_DIMS = BaseModelDims("bench-base", 64, 128, 2, 2, 2, 32)
BYTES_PER_RANK = 851_968  # q_proj + v_proj of Llama-3-8B, fp16: 32 x (8192 + 5120) x 2 bytes


def write_adapter(dest: Path, rank: int, seed: int) -> None:
    """A PEFT-format adapter for :data:`BASE_DIMS` (numpy + safetensors, no torch)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(BASE_DIMS.num_layers):
        for module in ("q_proj", "v_proj"):
            in_f, out_f = BASE_DIMS.module_dims(module) or (0, 0)
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, in_f), dtype=np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((out_f, rank), dtype=np.float32)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
    }
    (dest / "adapter_config.json").write_text(json.dumps(config))


def write_base_config(dest: Path) -> Path:
    return BASE_DIMS.write_config_dir(dest)


class ModelledStore(ArtifactStore):
    """Wraps a store; each fetch costs modelled time, one at a time per destination host."""

    def __init__(
        self,
        inner: ArtifactStore,
        time_scale: float,
        latency_s: float,
        bytes_per_s: float,
        verify_bytes_per_s: float,
    ) -> None:
        self.inner = inner
        self.prefix = inner.prefix
        self.time_scale = time_scale
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self.verify_bytes_per_s = verify_bytes_per_s
        self.modelled_bytes: dict[str, int] = {}  # digest -> bytes
        self.num_fetches = 0
        self._host_locks: dict[Path, threading.Lock] = {}
        self._lock = threading.Lock()

    def put(self, source: Path, manifest: Manifest) -> ArtifactRef:
        return self.inner.put(source, manifest)

    def contains(self, digest: str) -> bool:
        return self.inner.contains(digest)

    def fetch(self, uri: str, dest: Path, max_bytes: int) -> Manifest:
        size = self.modelled_bytes.get(parse_digest(uri, self.prefix), 0)
        with self._lock:
            self.num_fetches += 1
            host = self._host_locks.setdefault(dest.parent, threading.Lock())
        cost_s = self.latency_s + size / self.bytes_per_s + size / self.verify_bytes_per_s
        with host:
            time.sleep(cost_s / self.time_scale)
        return self.inner.fetch(uri, dest, max_bytes)


class CountingDriver:
    """An engine driver that counts engine loads (the warm-to-hot and cold-to-hot moves)."""

    def __init__(self, inner: EngineDriver) -> None:
        self.inner = inner
        self.num_loads = 0

    async def load(self, url: str, name: str, path: str, timeout_s: float) -> None:
        self.num_loads += 1
        await self.inner.load(url, name, path, timeout_s)

    async def unload(self, url: str, name: str, timeout_s: float) -> None:
        await self.inner.unload(url, name, timeout_s)

    async def adapters(self, url: str, timeout_s: float) -> dict[str, str]:
        return await self.inner.adapters(url, timeout_s)

    async def lora_info(self, url: str, timeout_s: float) -> EngineLoRAInfo | None:
        return await self.inner.lora_info(url, timeout_s)


def register_all(
    plane: ControlPlane,
    store: ModelledStore,
    specs: list[tuple[str, str, str, int]],
    sources: Path,
    key: Path,
) -> None:
    """Register and sign (adapter_id, version, tier, rank) adapters; record modelled sizes."""
    for i, (adapter_id, version, tier, rank) in enumerate(specs):
        src = sources / f"{adapter_id}-{version}"
        write_adapter(src, rank, seed=i)
        adapter = plane.register(
            str(src),
            adapter_id,
            version,
            BASE_DIMS.name,
            f"tenant-{tier}",
            tier,
            "bench",
            activate_first=version == "1",
        )
        plane.sign(adapter_id, version, key, "bench")
        store.modelled_bytes[adapter.sha256] = rank * BYTES_PER_RANK


@dataclass
class LoRABenchFleet:
    urls: list[str]


@contextmanager
def sim_fleet(num_engines: int, args: list[str], log_path: Path) -> Iterator[LoRABenchFleet]:
    """``kvstack sim-engine --fleet N`` in a child process (its own core), on free ports."""
    from kvstack.stack.procs import ManagedProcess

    base = free_port_run(num_engines)
    argv = [
        sys.executable,
        "-m",
        "kvstack",
        "sim-engine",
        "--fleet",
        str(num_engines),
        "--base-port",
        str(base),
        *args,
    ]
    proc = ManagedProcess("sim-fleet", argv, log_path)
    proc.start()
    urls = [f"http://127.0.0.1:{base + i}" for i in range(num_engines)]
    try:
        for url in urls:
            proc.wait_healthy(f"{url}/health", 60)
        yield LoRABenchFleet(urls)
    finally:
        proc.stop()


def bench_config(root: Path, sources: Path, public_key: Path, **policy: Any) -> LoRAConfig:
    return LoRAConfig(
        registry_url=f"sqlite:///{root / 'registry.db'}",
        artifact_store=f"file://{root / 'store'}",
        source_allowlist=[sources.as_uri() + "/"],
        trusted_keys=[str(public_key)],
        base_models={BASE_DIMS.name: BaseModelRef(path=str(write_base_config(root / "base")))},
        **policy,
    )
