"""The router's small state machines: load leases, ejection leases, health, scraped metrics."""

from __future__ import annotations

from kvstack.router.config import EjectionConfig, HealthConfig
from kvstack.router.fleet.backends import Backend, BackendPool, BackendState
from kvstack.router.fleet.ejection import EjectionState
from kvstack.router.fleet.engine_metrics import parse_engine_metrics
from kvstack.router.fleet.health import _apply
from kvstack.router.fleet.load import LoadCounters

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="toy"} 3.0
vllm:num_requests_running{engine="1",model_name="toy"} 1.0
vllm:num_requests_waiting{engine="0",model_name="toy"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="toy"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="toy"} 0.5
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="b,a",waiting_lora_adapters="c"} 1.8e9
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="4096"} 1.0
vllm:prefix_cache_queries_total{model_name="toy"} 100.0
vllm:prefix_cache_hits_total{model_name="toy"} 40.0
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="toy"} 5.0
"""


def test_parse_vllm_metrics() -> None:
    m = parse_engine_metrics(VLLM_PAGE, 1.0)
    assert (m.running, m.waiting, m.kv_usage) == (4.0, 2.0, 0.5)
    assert m.running_adapters == ("a", "b") and m.waiting_adapters == ("c",) and m.max_loras == 2
    assert (m.block_size, m.num_gpu_blocks) == (16, 4096)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (100.0, 40.0)
    assert m.num_requests == 6.0


def test_parse_older_names_and_missing_series() -> None:
    old = 'vllm:gpu_cache_usage_perc{model_name="x"} 0.7\nvllm:num_requests_waiting 1\n'
    m = parse_engine_metrics(old, 0.0)
    assert m.kv_usage == 0.7 and m.running is None and m.waiting == 1.0
    assert parse_engine_metrics("garbage\n{}\nvllm:num_requests_running NaN\n", 0.0).running is None


def test_load_lease_gives_back_exactly_once() -> None:
    counters = LoadCounters()
    lease = counters.acquire(100)
    other = counters.acquire(50)
    assert (counters.in_flight, counters.in_flight_prefill_tokens) == (2, 150)
    lease.first_token()
    lease.first_token()
    assert counters.in_flight_prefill_tokens == 50
    lease.release()
    lease.release()
    other.release()  # never saw a first token: gives its prefill back too
    assert (counters.in_flight, counters.in_flight_prefill_tokens) == (0, 0)
    assert counters.dispatched_total == 2


def test_ejection_leases_double_and_are_bounded() -> None:
    config = EjectionConfig(consecutive_failures=2, base_lease_s=1.0, max_lease_s=3.0)
    e = EjectionState()
    assert e.record_failure(config, 0.0) is None
    assert e.record_failure(config, 0.0) == 1.0 and e.is_ejected(0.5)
    assert e.record_failure(config, 0.5) is None  # already out
    assert not e.is_ejected(1.0)  # half-open after the lease
    assert e.record_failure(config, 1.0) == 2.0
    assert e.record_failure(config, 3.0) == 3.0  # capped
    assert e.record_failure(config, 6.0) == 3.0
    e.record_success()
    assert not e.is_ejected(6.1) and e.failures == 0 and e.ejections == 0


def test_health_thresholds() -> None:
    config = HealthConfig(unhealthy_after=2, healthy_after=2)
    s = BackendState(Backend("a", "http://a:1"))
    assert _apply(s, True, config) and s.healthy  # first result counts at once
    assert not _apply(s, False, config) and s.healthy
    assert _apply(s, False, config) and s.healthy is False
    assert not _apply(s, True, config) and s.healthy is False
    assert _apply(s, True, config) and s.healthy


def test_model_lists_name_adapters_and_their_base() -> None:
    s = BackendState(Backend("a", "http://a:1"))
    s.set_models([{"id": "base"}, {"id": "sql", "parent": "base"}, {"object": "junk"}], 1.0)
    assert s.models == {"base", "sql"} and s.adapters == {"sql": "base"}
    pinned = BackendState(Backend("b", "http://b:1", static_models=frozenset({"x"})))
    pinned.set_models([{"id": "y"}], 1.0)
    assert pinned.models == {"x"}  # a static list wins over what the backend says


def test_pool_applies_snapshots_and_keeps_counters_of_changed_backends() -> None:
    pool = BackendPool()
    added: list[str] = []
    pool.on_added(lambda states: added.extend(s.id for s in states))
    assert pool.apply([Backend("a", "http://a:1"), Backend("b", "http://b:1")]) == (["a", "b"], [])
    lease = pool.get("a").load.acquire(1)
    assert pool.apply([Backend("a", "http://a:2")]) == (["a"], ["b"])
    assert pool.get("a").in_flight == 1 and pool.get("a").url == "http://a:2"
    lease.release()
    assert pool.get("a").in_flight == 0
    assert pool.apply([Backend("a", "http://a:2")]) == ([], [])
    assert added == ["a", "b", "a"]
