"""``KVStackConnector``: kvstack as a vLLM V1 KV connector. Load it with::

    python -m vllm.entrypoints.openai.api_server --model MODEL --kv-transfer-config \\
      '{"kv_connector": "KVStackConnector", "kv_connector_module_path": "kvstack.integrations.vllm",
        "kv_role": "kv_both", "kv_connector_extra_config": {"tiers": ["cpu://?size=4GiB",
        "file:///var/kv?size=50GiB"], "chunk_size": 256}}'

(``vllm serve MODEL --kv-transfer-config ...`` is the same with the GPU build.) On vLLM's CPU
build also set ``VLLM_CPU_NUM_OF_RESERVED_CPU=1``: with any connector configured vLLM reserves
an extra core for NIXL, which kvstack does not use, and small hosts then run several times
slower. ``"kv_load_failure_policy"`` is set to ``recompute`` (``on_load_failure`` setting). Roles:
``kv_both`` loads and saves, ``kv_producer`` only saves (a prefill engine), ``kv_consumer`` only
loads (a decode engine). vLLM builds one instance per role: the scheduler side
(:mod:`.scheduler`) and one worker side per rank (:mod:`.worker`); this class only routes
vLLM's calls to them.

Loads from slow tiers are asynchronous (the request waits, the batch does not), saves copy out
on the step and publish on a thread, generated tokens are saved like the prompt, and
preempted requests resume from the tiers. The class declares ``SupportsHMA`` so that vLLM
keeps its hybrid KV cache manager for hybrid and sliding-window models (Mamba hybrids do not
start without it); for those the connector stores and serves nothing (:mod:`.layout`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvstack.errors import ConfigError
from kvstack.integrations.settings import (
    index_section,
    security_section,
    split_extra_config,
    transfer_modes,
)
from kvstack.integrations.vllm.layout import describe_layout
from kvstack.integrations.vllm.scheduler import KVStackMetadata, SchedulerSide
from kvstack.integrations.vllm.stats import KVStackPromMetrics, KVStackStats
from kvstack.integrations.vllm.worker import WorkerSide

if TYPE_CHECKING:
    from vllm.attention.backends.abstract import AttentionMetadata
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorPromMetrics,
        KVConnectorStats,
        PromMetric,
        PromMetricT,
    )
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVStackConnector"]

log = logging.getLogger(__name__)


def _adopt_vllm_logging() -> None:
    """Let kvstack's log lines appear in the engine's log, formatted like vLLM's own."""
    ours, theirs = logging.getLogger("kvstack"), logging.getLogger("vllm")
    if not ours.handlers and theirs.handlers:
        for handler in theirs.handlers:
            ours.addHandler(handler)
        ours.setLevel(theirs.level)
        ours.propagate = False


def model_fingerprint(vllm_config: VllmConfig) -> str:
    """Model name and revision, plus a digest of config.json for local model directories."""
    model = vllm_config.model_config.model
    fingerprint = f"{model}@{vllm_config.model_config.revision or ''}"
    config_json = os.path.join(model, "config.json")
    if os.path.isfile(config_json):
        with open(config_json, "rb") as f:
            fingerprint += f"#{hashlib.sha256(f.read()).hexdigest()[:16]}"
    return fingerprint


class KVStackConnector(KVConnectorBase_V1, SupportsHMA):
    _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self) -> bool:
        # kvstack is a cache: a dropped save is a future miss. A preempted request's pending
        # copy-outs end in handle_preemptions, before its blocks can be reused, so vLLM need
        # not drop and recompute the preempted request's in-flight output.
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # Layer pipelining runs Python between attention layers (on by default on GPUs).
        return extra_config.get("layer_pipelining") is not False

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _adopt_vllm_logging()
        transfer = self._kv_transfer_config
        settings, kv = split_extra_config(transfer.kv_connector_extra_config)
        layout = describe_layout(vllm_config, kv_cache_config)
        if layout.restorable and kv.chunk_size % layout.block_size:
            suggestion = layout.block_size * max(1, kv.chunk_size // layout.block_size)
            raise ConfigError(
                f"kvstack chunk_size {kv.chunk_size} must be a multiple of vLLM's block size "
                f"{layout.block_size} (e.g. {suggestion})"
            )
        fingerprint = settings.model_fingerprint or model_fingerprint(vllm_config)
        kv = kv.model_copy(
            update={
                "model": f"{fingerprint}|{layout.signature}",
                "kv_dtype": layout.kv_dtype,
                "tp_size": vllm_config.parallel_config.tensor_parallel_size,
                "save_partial_chunks": False,
            }
        )
        roles = (
            transfer.kv_role in ("kv_both", "kv_consumer"),
            transfer.kv_role in ("kv_both", "kv_producer"),
        )
        modes = transfer_modes(settings, str(vllm_config.device_config.device_type))
        engine_id = str(transfer.engine_id)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            transfer.kv_load_failure_policy = settings.on_load_failure
            self._scheduler = SchedulerSide(
                kv, layout.block_size, engine_id, settings, roles,
                modes.copy_out_background, layout.unrestorable,
            )  # fmt: skip
        else:
            sync = (
                settings.save_mode or ("sync" if transfer.kv_role == "kv_producer" else "async")
            ) == "sync"
            kv = kv.model_copy(update={"tp_rank": _tp_rank()})
            index, security = index_section(settings), security_section(settings)
            self._worker = WorkerSide(kv, layout, engine_id, settings, modes, sync, index, security)
            if getattr(vllm_config, "shutdown_timeout", None) == 0 and self._worker.writes_behind:
                log.warning(
                    "kvstack connector: vLLM runs with --shutdown-timeout 0, which kills this "
                    "worker at SIGTERM before its queued chunk writes land (misses after a "
                    "restart); start vLLM with --shutdown-timeout 60 and "
                    "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=30"
                )
        log.info(
            "kvstack connector (%s, %s): chunk %d tokens, namespace model %s",
            role.name.lower(), transfer.kv_role, kv.chunk_size, kv.model,
        )  # fmt: skip

    # -- worker side -----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self._worker is not None
        self._worker.register(self._kv_cache_config, kv_caches)

    def _meta(self) -> KVStackMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVStackMetadata)
        return meta

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, KVStackMetadata):
            self._worker.prepare_step(connector_metadata)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, KVStackMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_step(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self._worker is not None
        self._worker.wait_for_layer(layer_name)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        assert self._worker is not None
        self._worker.save_layer(layer_name, self._meta())

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.end_step(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self._worker is not None
        return self._worker.get_finished()

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_failed_blocks() if self._worker is not None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._worker.worker_meta() if self._worker is not None else None

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        return self._worker.take_events() if self._worker is not None else None

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        side = self._worker or self._scheduler
        return side.take_stats() if side is not None else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._scheduler is not None:
            self._scheduler.close()

    # -- scheduler side --------------------------------------------------------------------
    def on_new_request(self, request: Request) -> None:
        assert self._scheduler is not None
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        return self._scheduler.num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        assert self._scheduler is not None
        self._scheduler.after_alloc(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._scheduler is not None
        return self._scheduler.build_meta(scheduler_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        hold = self._scheduler is not None and self._scheduler.request_finished(request)
        return hold, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        if self._scheduler is None:
            return
        self._scheduler.on_worker_output(connector_output)
        events = connector_output.kv_cache_events
        if events is None:
            return
        if self._pending_events is None:
            self._pending_events = events
        else:
            self._pending_events.add_events(events.get_all_events())
            self._pending_events.increment_workers(events.get_number_of_workers())

    _pending_events: KVConnectorKVEvents | None = None

    def take_events(self) -> Iterable[KVCacheEvent]:
        pending, self._pending_events = self._pending_events, None
        if pending is None:
            return ()
        return pending.aggregate().get_all_events()

    # -- metrics plumbing ------------------------------------------------------------------
    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> KVConnectorStats | None:
        return KVStackStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return KVStackPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, RuntimeError):  # distributed state not initialised (single process)
        return 0
