"""Time to first token and inter-token latency follow the configured rates (scaled time)."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import FleetFactory

SCALE = 2.0
CONFIG = {
    "time_scale": SCALE, "step_base_s": 0.05, "prefill_tokens_per_s": 2000.0,
    "decode_per_seq_s": 0.01, "decode_per_context_token_s": 0.0,
}  # fmt: skip
PROMPT_TOKENS, OUTPUT_TOKENS = 200, 20
EXPECTED_TTFT_S = 0.05 + PROMPT_TOKENS / 2000.0  # one step: base + prefill
EXPECTED_ITL_S = 0.05 + 0.01  # one decode step at batch size 1


def measure(client: httpx.Client, url: str, base: int) -> tuple[float, float]:
    """Client-side TTFT and mean inter-token latency of one streamed request, in sim seconds."""
    body = {"prompt": [base + i for i in range(PROMPT_TOKENS)], "max_tokens": OUTPUT_TOKENS,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    first = last = 0.0
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                last = time.perf_counter()
                first = first or last
    return (first - start) * SCALE, (last - first) * SCALE / (OUTPUT_TOKENS - 1)


def test_engine_histograms_record_model_seconds(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(**CONFIG)
    with httpx.Client() as client:
        for i in range(2):
            measure(client, fleet.urls[0], 5000 * (i + 1))
    text = httpx.get(fleet.urls[0] + "/metrics").text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if not s.labels.get("le")}  # fmt: skip
    ttft_sum = values["vllm:time_to_first_token_seconds_sum"]
    ttft_count = values["vllm:time_to_first_token_seconds_count"]
    itl_sum = values["vllm:inter_token_latency_seconds_sum"]
    itl_count = values["vllm:inter_token_latency_seconds_count"]
    # Steps follow each other exactly in simulated time, and a step starts at the arrival that
    # woke an idle engine, except that a wake-up or a step the machine made late by more than a
    # few milliseconds shifts the rest: that shift is the reported lag.
    lag_sim_s = values["kvstack_sim_step_lag_seconds_total"] * SCALE
    assert ttft_count == 2
    assert ttft_count * EXPECTED_TTFT_S * 0.999 <= ttft_sum
    assert ttft_sum <= ttft_count * EXPECTED_TTFT_S * 1.001 + lag_sim_s
    assert itl_count * EXPECTED_ITL_S * 0.999 <= itl_sum
    assert itl_sum <= itl_count * EXPECTED_ITL_S * 1.001 + lag_sim_s
    assert values["vllm:inter_token_latency_seconds_count"] == 2 * (OUTPUT_TOKENS - 1)


def ttft_sum(client: httpx.Client, url: str) -> float:
    text = client.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:time_to_first_token_seconds_sum")  # fmt: skip


def test_a_cached_prefix_shortens_the_first_token(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(**CONFIG)
    url = fleet.urls[0]
    body = {"prompt": [7000 + i for i in range(PROMPT_TOKENS)], "max_tokens": 2}
    with httpx.Client() as client:
        cold = client.post(url + "/v1/completions", json=body).json()["usage"]
        cold_s = ttft_sum(client, url)
        warm = client.post(url + "/v1/completions", json=body).json()["usage"]
        warm_s = ttft_sum(client, url) - cold_s
        text = client.get(url + "/metrics").text
    lag_s = SCALE * sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                        if s.name == "kvstack_sim_step_lag_seconds_total")  # fmt: skip
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["prompt_tokens_details"]["cached_tokens"] == 192  # 12 full blocks of 16
    assert cold_s >= EXPECTED_TTFT_S * 0.999  # sums of clock differences: float rounding
    expected_warm = 0.05 + 8 / 2000.0  # the base step plus 8 uncached tokens
    assert expected_warm * 0.999 <= warm_s <= expected_warm * 1.001 + lag_s
