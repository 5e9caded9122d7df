"""Time to first token and inter-token latency follow the configured rates (scaled time)."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import FleetFactory, SimProcessFactory

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


def test_client_latencies_match_the_model(sim_process: SimProcessFactory) -> None:
    # Count any stall over 5 ms as lag (not caught up): stalls would show in the client's times.
    (url,) = sim_process(**CONFIG, catch_up_wall_s=0.005)
    with httpx.Client() as client:  # created outside the timed part (it loads CA files)
        results = [measure(client, url, 1000 * (i + 1)) for i in range(3)]
        lag = lag_s(client, url)
    if lag > 0:  # the engine itself was starved of CPU: wall-clock figures say nothing here
        pytest.skip(f"this machine starved the simulator of CPU ({lag:.3f} s of step lag)")
    ttft = sorted(r[0] for r in results)[1]
    itl = sorted(r[1] for r in results)[1]
    assert abs(ttft - EXPECTED_TTFT_S) / EXPECTED_TTFT_S < 0.25, ttft
    assert abs(itl - EXPECTED_ITL_S) / EXPECTED_ITL_S < 0.25, itl


def lag_s(client: httpx.Client, url: str) -> float:
    text = client.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "kvstack_sim_step_lag_seconds_total")  # fmt: skip


def test_engine_histograms_record_model_seconds(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(**CONFIG)
    with httpx.Client() as client:
        for i in range(2):
            measure(client, fleet.urls[0], 5000 * (i + 1))
    text = httpx.get(fleet.urls[0] + "/metrics").text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
              if not s.labels.get("le")}  # fmt: skip
    ttft = (
        values["vllm:time_to_first_token_seconds_sum"]
        / values["vllm:time_to_first_token_seconds_count"]
    )
    itl_sum = values["vllm:inter_token_latency_seconds_sum"]
    itl_count = values["vllm:inter_token_latency_seconds_count"]
    # Arrival to the first step's end: the step itself, plus the moment the engine loop takes
    # to pick the request up (a busy machine stretches that; it never shortens the step).
    assert EXPECTED_TTFT_S <= ttft < EXPECTED_TTFT_S * 1.5
    # Steps follow each other exactly in simulated time, except that a step the machine made
    # late by more than a few milliseconds shifts the rest: that shift is the reported lag.
    lag_sim_s = values["kvstack_sim_step_lag_seconds_total"] * SCALE
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
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["prompt_tokens_details"]["cached_tokens"] == 192  # 12 full blocks of 16
    assert cold_s >= EXPECTED_TTFT_S
    expected_warm = 0.05 + 8 / 2000.0  # the base step plus 8 uncached tokens
    assert expected_warm <= warm_s < expected_warm * 1.5
