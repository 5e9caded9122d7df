"""``bench serve`` against a real vLLM engine (CPU build, toy model): prompts built with the
model's own tokenizer have exactly the planned token counts, and TTFT is measured."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstack.bench.load.loadgen import LoadPlan
from kvstack.bench.load.serve import run_serve
from kvstack.bench.load.stats import SLO
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="session")
def vllm_engine(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    logs = tmp_path_factory.mktemp("bench-vllm")
    spec = VLLMServerSpec(
        model=str(toy_model),
        port=free_port(),
        served_model_name="toy",
        max_model_len=4096,
        extra_args=["--block-size", "32"],
    )
    with VLLMServer(spec, logs / "vllm.log") as server:
        yield server  # type: ignore[misc]


def metric_mean(url: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values[name + "_sum"] / values[name + "_count"]


def test_exact_token_counts_and_ttft_on_real_vllm(vllm_engine: VLLMServer) -> None:
    url = vllm_engine.url
    plan = LoadPlan(rate=3.0, duration_s=5.0, seed=0)
    params = {
        "groups": 2,
        "users_per_group": 2,
        "system_prompt_tokens": 300,
        "question_tokens": 40,
        "output_tokens": 8,
    }
    result = asyncio.run(run_serve(url, "shared-prefix", params, plan, SLO()))
    records = result.run.results
    assert len(records) >= 5
    for r in records:
        assert r.ok, r.error
        assert r.prompt_tokens == r.expected_prompt_tokens == 340
        assert r.output_tokens == 8  # ignore_eos: exactly max_tokens
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s < r.e2e_s
    overall = result.summary.overall
    server_ttft = metric_mean(url, "vllm:time_to_first_token_seconds")
    # The client's TTFT is the engine's plus HTTP and detokenization time.
    assert 0.8 * server_ttft <= overall.ttft_s.mean <= server_ttft + 0.5  # type: ignore[operator]


def test_chat_prompts_count_the_template(vllm_engine: VLLMServer) -> None:
    plan = LoadPlan(concurrency=2, duration_s=3.0, seed=1)
    params = {
        "num_users": 2,
        "num_rounds": 3,
        "system_prompt_tokens": 100,
        "user_context_tokens": 50,
        "question_tokens": 20,
        "output_tokens": 6,
    }
    result = asyncio.run(run_serve(vllm_engine.url, "multi-round-qa", params, plan, SLO()))
    records = result.run.results
    assert len(records) >= 4 and all(r.ok for r in records)
    assert all(r.prompt_tokens == r.expected_prompt_tokens for r in records)
    assert max(r.prompt_tokens or 0 for r in records) > 180  # later rounds carry history
