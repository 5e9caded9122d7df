"""Prefill/decode disaggregation on two real vLLM CPU engines sharing a kvstack ``file://`` tier.

The prefill engine runs kvstack's connector as ``kv_producer``, the decode engine as
``kv_consumer``; both publish KV events. The router (in this process, so its state can be
read) tokenizes with the model's own tokenizer and chat-free completion prompts. The story:

1. the decode engine answers a long prompt by itself (greedy): the reference; its prefix
   cache is then reset, so nothing of the prompt is left in it;
2. the same prompt through the router: the prefill engine computes it (``max_tokens`` 1) and
   stores its chunks, the decode engine loads them — ``kvstack_connector_hit_tokens_total``
   grows there — and the streamed answer is the reference, token for token;
3. the router's precise view of the prefill engine (from its KV events, placed by the router's
   own token ids) covers the prompt: tokenizer, events and tree agree with the engine.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstack.index.radix import Owner, RadixNamespace
from kvstack.lora.config import AdapterEngineSpec, RequestClassBudget
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.signing import generate_keypair
from kvstack.models.toy import _WORDS
from kvstack.router.prefix.state import PrefixState
from kvstack.router.router import Router
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec, connector_config
from tests.e2e.engines import metric_total, wait_metric
from tests.lora.adapters import NO_VIOLATIONS, control_over, peft_adapter, real_plane
from tests.router.conftest import router_config, serve_router, until

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HITS = "kvstack_connector_hit_tokens_total"


@dataclass
class PDEngines:
    prefill: VLLMServer
    decode: VLLMServer
    events: dict[str, str]  # engine URL -> KV event endpoint
    model: Path


def _engine(model: Path, logs: Path, name: str, role: str, tier: str, events: int) -> VLLMServer:
    spec = VLLMServerSpec(
        model=str(model),
        port=free_port(),
        served_model_name="toy",
        max_model_len=4096,
        kv_transfer_config=connector_config([tier], role=role),
        kv_events_endpoint=f"tcp://*:{events}",
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache
        enable_lora=True,  # runtime loading, for adapters the control plane manages
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=16,
    )
    return VLLMServer(spec, logs / f"{name}.log")


@pytest.fixture(scope="module")
def pd_engines(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PDEngines]:
    logs = tmp_path_factory.mktemp("router-pd")
    tier = f"file://{logs / 'kv'}?size=1GiB"
    ports = [free_port(), free_port()]
    engines = [
        _engine(toy_model, logs, "prefill", "kv_producer", tier, ports[0]),
        _engine(toy_model, logs, "decode", "kv_consumer", tier, ports[1]),
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda e: e.start(), engines))
        events = {e.url: f"tcp://127.0.0.1:{p}" for e, p in zip(engines, ports, strict=True)}
        yield PDEngines(engines[0], engines[1], events, toy_model)
    finally:
        for engine in engines:
            engine.stop()


def _prompt(num_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(num_words))


def _direct(engine: VLLMServer, prompt: str, max_tokens: int) -> list[int]:
    body = {"model": "toy", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True}  # fmt: skip
    response = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return list(response.json()["choices"][0]["token_ids"])


async def _through_router(
    url: str, prompt: str, max_tokens: int, model: str = "toy"
) -> tuple[list[int], str]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True, "stream": True}  # fmt: skip
    tokens: list[int] = []
    async with (
        httpx.AsyncClient(timeout=300) as client,
        client.stream("POST", f"{url}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        decision = response.headers["x-kvstack-decision"]
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    tokens += choice.get("token_ids") or []
    return tokens, decision


def _config(e: PDEngines) -> Any:
    config = router_config(
        [e.prefill.url, e.decode.url],
        policy="ttft",
        pd={"models": ["toy"], "min_remote_prefill_tokens": 256},
        prefix={"tokenizers": {"toy": str(e.model)}, "events": {"sources": e.events}},
        health={"interval_s": 0.5, "timeout_s": 5.0},
        debug_headers=True,  # the decision header names the prefill
    )
    config.backends[0].role = "prefill"
    config.backends[1].role = "decode"
    return config


async def test_pd_output_equals_a_single_engine(pd_engines: PDEngines) -> None:
    e = pd_engines
    prompt = _prompt(1100, seed=7)
    reference = await asyncio.to_thread(_direct, e.decode, prompt, 12)
    reset = await asyncio.to_thread(httpx.post, f"{e.decode.url}/reset_prefix_cache", timeout=60)
    reset.raise_for_status()
    hits_before = await asyncio.to_thread(metric_total, e.decode, HITS)
    async with serve_router(_config(e)) as r:
        tokens, decision = await _through_router(r.url, prompt, 12)
        assert f"pd=remote:{e.prefill.url}" in decision
        assert tokens == reference
        hits = await asyncio.to_thread(wait_metric, e.decode, HITS, hits_before + 256)
        assert hits - hits_before >= 1024  # four 256-token chunks of a ~1,100-token prompt
        state = r.router.context.services["prefix"]
        assert isinstance(state, PrefixState)
        await _precise_view_covers_prompt(state, e.prefill.url, prompt)


async def _precise_view_covers_prompt(state: PrefixState, backend: str, prompt: str) -> None:
    tokens = state.renderer.tokenizer("toy").completion(prompt)
    gpu = Owner(backend, "gpu")
    full_blocks = len(tokens) // 128 * 128  # vLLM's CPU block size
    await until(lambda: state.is_precise(backend), 30)
    await until(lambda: state.index.match(RadixNamespace("toy"), tokens).tokens(gpu) >= full_blocks)
    state.index.check_integrity()


async def test_pd_with_a_managed_adapter(pd_engines: PDEngines, tmp_path: Path) -> None:
    """A request for a registered adapter: both steps run the adapter, under the same name, so
    the decode engine finds the prefill engine's chunks (kvstack's keys include the adapter).

    1. The adapter is hot nowhere: the decode engine loads it (the request waits), the prefill
       engine is not made to wait (``pd=adapter_not_hot``) and loads it in the background; the
       decode engine's own answer is the reference.
    2. With the decode engine's prefix cache reset, the same request prefills remotely with the
       adapter, the decode engine loads the chunks, and the answer is the reference.
    """
    e = pd_engines
    keys = tmp_path / "signer.pem", tmp_path / "signer.pub.pem"
    generate_keypair(*keys)
    peft_adapter(e.model, tmp_path / "sources" / "docs", seed=31)
    plane = real_plane(tmp_path, tmp_path / "sources", keys, e.model)
    plane.register(str(tmp_path / "sources" / "docs"), "docs", "1", "toy", "acme", "gold", "t")
    plane.sign("docs", "1", keys[0], "t")
    specs = [
        AdapterEngineSpec(url=engine.url, base_model="toy", served_model_name="toy",
                   warm_dir=str(tmp_path / f"warm-{i}"), gpu_slots=2, host_slots=3)
        for i, engine in enumerate((e.prefill, e.decode))
    ]  # fmt: skip
    classes = {
        "interactive": RequestClassBudget(cold_start_budget_s=None),  # wait for loads
        "background": RequestClassBudget(max_concurrent_cold_loads=2),  # the prefill's load
    }
    control = control_over(plane, engines=specs, request_classes=classes)
    config = _config(e)
    config.adapters.enabled = True
    config.timeouts.total_s = 300
    prompt = _prompt(1100, seed=8)
    async with serve_router(config, Router(config, lora=control)) as r:
        reference, decision = await _through_router(r.url, prompt, 12, model="docs")
        assert "pd=adapter_not_hot" in decision
        await until(
            lambda: control.manager.residency(e.prefill.url, "docs@1") is ResidencyTier.HOT, 60
        )
        reset = await asyncio.to_thread(
            httpx.post, f"{e.decode.url}/reset_prefix_cache", timeout=60
        )
        reset.raise_for_status()
        hits_before = await asyncio.to_thread(metric_total, e.decode, HITS)
        tokens, decision = await _through_router(r.url, prompt, 12, model="docs")
        assert f"pd=remote:{e.prefill.url}" in decision
        assert tokens == reference
        hits = await asyncio.to_thread(wait_metric, e.decode, HITS, hits_before + 256)
        assert hits - hits_before >= 1024
        base, _ = await _through_router(r.url, prompt, 12)
        assert base != reference  # the adapter changed the answer: it was applied
        assert control.manager.metrics.invariants == NO_VIOLATIONS
