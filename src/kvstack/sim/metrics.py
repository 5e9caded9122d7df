"""The simulated engine's ``/metrics``: vLLM's names, types, labels and buckets.

Checked against a real vLLM 0.32 ``/metrics`` (``tests/sim/data/vllm_metrics.txt``): series
carry ``model_name`` and ``engine`` labels; counters export ``_total``; ``lora_requests_info``
is a gauge set to the current time with labels ``max_lora``, ``waiting_lora_adapters`` and
``running_lora_adapters`` (comma-separated names); ``cache_config_info`` is a gauge at 1 whose
labels are the cache configuration. Durations are simulated seconds.

Each engine has its own registry (not :mod:`kvstack.metrics`' global one) because a fleet
runs several engines in one process, each serving its own ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvstack.sim.config import SimConfig
from kvstack.sim.request import SimRequest
from kvstack.sim.scheduler import ScheduledStep, StepOutcome

__all__ = ["SimEngineMetrics"]

_LABELS = ("model_name", "engine")
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _one_two_five(max_value: int) -> list[float]:
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(float(value))
        exponent += 1


class SimEngineMetrics:
    def __init__(self, config: SimConfig, engine_index: int = 0) -> None:
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self._labels = {"model_name": config.model, "engine": str(engine_index)}
        self._build_gauges()
        self._build_counters()
        self._build_histograms()
        self._build_info()
        self._lora_series: dict[tuple[str, str], None] = {}

    # -- construction ----------------------------------------------------------------------
    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, (*_LABELS, *extra), registry=self.registry)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, (*_LABELS, *extra), registry=self.registry)

    def _histogram(
        self, name: str, doc: str, buckets: tuple[float, ...] | list[float]
    ) -> Histogram:
        metric = Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry)
        return metric.labels(**self._labels)

    def _build_gauges(self) -> None:
        lbl = self._labels
        self.running = self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(**lbl)
        self.waiting = self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(**lbl)
        by_reason = self._gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ("reason",),
        )
        self.waiting_capacity = by_reason.labels(**lbl, reason="capacity")
        self.waiting_deferred = by_reason.labels(**lbl, reason="deferred")
        sleep = self._gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            ("sleep_state",),
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            sleep.labels(**lbl, sleep_state=state).set(value)
        self.kv_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(**lbl)

    def _build_counters(self) -> None:
        lbl = self._labels
        c = self._counter
        self.prefix_queries = c(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(**lbl)
        self.prefix_hits = c(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lbl)
        self.external_queries = c(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
        ).labels(**lbl)
        self.external_hits = c(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
        ).labels(**lbl)
        self.preemptions = c(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lbl)
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(
            **lbl
        )
        by_source = c(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
        )
        self.tokens_computed = by_source.labels(**lbl, source="local_compute")
        self.tokens_local_hit = by_source.labels(**lbl, source="local_cache_hit")
        self.tokens_external = by_source.labels(**lbl, source="external_kv_transfer")
        self.prompt_cached = c(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
        ).labels(**lbl)
        self.generation_tokens = c(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**lbl)
        success = c(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("finished_reason",),
        )
        self.success = {
            reason: success.labels(**lbl, finished_reason=reason)
            for reason in ("stop", "length", "abort", "error", "repetition")
        }

    def _build_histograms(self) -> None:
        h = self._histogram
        tokens = _one_two_five(self.config.max_model_len)
        self.req_prompt_tokens = h(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.req_generation_tokens = h(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = h(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _ITERATION_BUCKETS,
        )
        self.max_tokens_param = h(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = h(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.itl = h(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.tpot = h(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BUCKETS,
        )
        latency = {
            "e2e": ("vllm:e2e_request_latency_seconds", "end to end request latency"),
            "queue": ("vllm:request_queue_time_seconds", "time spent in WAITING phase"),
            "inference": ("vllm:request_inference_time_seconds", "time spent in RUNNING phase"),
            "prefill": ("vllm:request_prefill_time_seconds", "time spent in PREFILL phase"),
            "decode": ("vllm:request_decode_time_seconds", "time spent in DECODE phase"),
        }
        self.latency = {
            key: h(name, f"Histogram of {what} in seconds.", _LATENCY_BUCKETS)
            for key, (name, what) in latency.items()
        }

    def _build_info(self) -> None:
        c = self.config
        if c.enable_lora:
            self.lora_info: Gauge | None = Gauge(
                "vllm:lora_requests_info",
                "Running stats on lora requests.",
                ("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
                registry=self.registry,
            )
        else:
            self.lora_info = None
        info = {
            "block_size": str(c.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(c.enable_prefix_caching),
            "engine": self._labels["engine"],
            "num_gpu_blocks": str(c.num_blocks),
            "num_cpu_blocks": "None",
            "prefix_caching_hash_algo": "sha256_cbor",
            "kv_cache_size_tokens": str(c.num_blocks * c.block_size),
            "gpu_memory_utilization": "0.9",
        }
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            tuple(info),
            registry=self.registry,
        ).labels(**info).set(1)

    # -- updates -------------------------------------------------------------------------------
    def on_step(self, step: ScheduledStep, outcome: StepOutcome) -> None:
        self.iteration_tokens.observe(step.num_tokens)
        if step.num_preempted:
            self.preemptions.inc(step.num_preempted)
        for req in step.admitted:
            if req.num_preemptions == 0:
                self._on_admit(req)
        if outcome.num_generated:
            self.generation_tokens.inc(outcome.num_generated)
        for req in outcome.progressed:
            if req.last_token_s is None:
                continue
            if req.prev_token_s is None:
                self.ttft.observe(req.last_token_s - req.arrival_s)
            else:
                self.itl.observe(req.last_token_s - req.prev_token_s)
        for req in outcome.finished:
            self._on_finish(req)

    def _on_admit(self, req: SimRequest) -> None:
        cached = req.local_hit_tokens + req.external_hit_tokens
        self.prefix_queries.inc(req.num_prompt)
        self.prefix_hits.inc(req.local_hit_tokens)
        if self.config.kv_tiers:
            self.external_queries.inc(req.num_prompt - req.local_hit_tokens)
            self.external_hits.inc(req.external_hit_tokens)
        self.prompt_tokens.inc(req.num_prompt)
        self.tokens_computed.inc(req.num_prompt - cached)
        self.tokens_local_hit.inc(req.local_hit_tokens)
        self.tokens_external.inc(req.external_hit_tokens)
        self.prompt_cached.inc(cached)
        self.req_prompt_tokens.observe(req.num_prompt)
        self.max_tokens_param.observe(req.max_tokens)
        if req.scheduled_s is not None:
            self.latency["queue"].observe(req.scheduled_s - req.arrival_s)

    def _on_finish(self, req: SimRequest) -> None:
        reason = req.finish_reason.value if req.finish_reason else "abort"
        self.success[reason].inc()
        if req.finished_s is None:
            return
        self.latency["e2e"].observe(req.finished_s - req.arrival_s)
        self.req_generation_tokens.observe(req.num_output)
        if req.scheduled_s is None or req.first_token_s is None:
            return
        self.latency["inference"].observe(req.finished_s - req.scheduled_s)
        self.latency["prefill"].observe(req.first_token_s - req.scheduled_s)
        self.latency["decode"].observe(req.finished_s - req.first_token_s)
        if req.num_output > 1:
            self.tpot.observe((req.finished_s - req.first_token_s) / (req.num_output - 1))

    def render(self, num_running: int, num_waiting: int, num_deferred: int, usage: float,
               running_adapters: list[str], waiting_adapters: list[str]) -> bytes:  # fmt: skip
        """The exposition text, with the scheduler gauges read now."""
        self.running.set(num_running)
        self.waiting.set(num_waiting)
        self.waiting_capacity.set(num_waiting - num_deferred)
        self.waiting_deferred.set(num_deferred)
        self.kv_usage.set(usage)
        if self.lora_info is not None:
            self.lora_info.labels(
                max_lora=str(self.config.max_loras),
                waiting_lora_adapters=",".join(waiting_adapters),
                running_lora_adapters=",".join(running_adapters),
            ).set_to_current_time()
        return generate_latest(self.registry)
