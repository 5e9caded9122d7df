"""/metrics parses with prometheus-client and matches a real vLLM's names, types and labels."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.sim.conftest import FleetFactory

DATA = Path(__file__).parent / "data"
ROUTER_READS = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:lora_requests_info",
    "vllm:cache_config_info", "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
}  # fmt: skip


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names of its samples, without 'le')."""
    out = {}
    for fam in text_string_to_metric_families(text):
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        out[fam.name] = (fam.type, labels)
    return out


def samples(text: str, name: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_families_match_a_real_vllm(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50, enable_lora=True)
    httpx.post(fleet.urls[0] + "/v1/completions", json={"prompt": "a b c d", "max_tokens": 3})
    ours = families(httpx.get(fleet.urls[0] + "/metrics").text)
    theirs = families((DATA / "vllm_metrics.txt").read_text())
    sim_vllm = {name for name in ours if name.startswith("vllm:")}
    assert sim_vllm >= ROUTER_READS
    for name in sim_vllm:
        assert name in theirs, f"{name} is not a vLLM metric"
        our_type, our_labels = ours[name]
        their_type, their_labels = theirs[name]
        assert our_type == their_type, name
        if name == "vllm:cache_config_info":  # we fill the labels that matter to routers
            assert our_labels <= their_labels and {"block_size", "num_gpu_blocks"} <= our_labels
        else:
            assert our_labels == their_labels, name


def test_prefix_counters_count_tokens(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50, block_size=16)
    url = fleet.urls[0]
    prompt = " ".join(f"t{100 + i}" for i in range(40))
    for _ in range(2):
        httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    text = httpx.get(url + "/metrics").text
    assert samples(text, "vllm:prefix_cache_queries_total")[0].value == 80
    assert samples(text, "vllm:prefix_cache_hits_total")[0].value == 32  # 2 full blocks
    assert samples(text, "vllm:time_to_first_token_seconds_count")[0].value == 2
    assert samples(text, "vllm:request_success_total")  # by finished_reason


def test_running_gauges_and_lora_info_while_busy(sim_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = sim_fleet(time_scale=1, enable_lora=True, max_loras=1, step_base_s=0.01)
    url = fleet.urls[0]
    r = httpx.post(
        url + "/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(tmp_path)}
    )
    assert r.status_code == 200

    def long_request(model: str) -> None:
        httpx.post(
            url + "/v1/completions",
            json={"model": model, "prompt": "t20", "max_tokens": 400},
            timeout=60,
        )

    threads = [threading.Thread(target=long_request, args=("a1",))]
    threads += [threading.Thread(target=long_request, args=("sim-model",)) for _ in range(2)]
    for t in threads:
        t.start()
    # A loaded host may take a while to get all three requests in: wait for them (each runs
    # 400 steps of >= 10 ms, so all three are still running when the third arrives).
    deadline = time.monotonic() + 3.0
    while True:
        text = httpx.get(url + "/metrics").text
        running = samples(text, "vllm:num_requests_running")[0].value
        if running == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert running == 3
    assert samples(text, "vllm:kv_cache_usage_perc")[0].value > 0
    info = max(samples(text, "vllm:lora_requests_info"), key=lambda s: s.value)
    assert info.labels == {
        "max_lora": "1",
        "running_lora_adapters": "a1",
        "waiting_lora_adapters": "",
    }
    assert abs(info.value - time.time()) < 5
    for t in threads:
        t.join()
