"""Helpers for tests that run real vLLM engines (CPU build): model, engines, requests, metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.conftest import free_port

__all__ = ["acomplete", "complete", "metric_total", "start_engine", "wait_metric"]


def start_engine(model: Path, log_dir: Path, name: str, **spec: Any) -> VLLMServer:
    spec.setdefault("served_model_name", "toy")
    spec.setdefault("max_model_len", 16384)
    server = VLLMServer(
        VLLMServerSpec(model=str(model), port=free_port(), **spec), log_dir / f"{name}.log"
    )
    return server.start()


def _body(prompt: list[int], model: str, max_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        **extra,
    }


def complete(
    server: VLLMServer, prompt: list[int], model: str = "toy", max_tokens: int = 8, **extra: Any
) -> list[int]:
    """Greedy completion of a token-id prompt; returns the generated token ids."""
    body = _body(prompt, model, max_tokens, extra)
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    ids: list[int] = response.json()["choices"][0]["token_ids"]
    return ids


async def acomplete(
    client: httpx.AsyncClient,
    server: VLLMServer,
    prompt: list[int],
    model: str = "toy",
    max_tokens: int = 8,
    **extra: Any,
) -> list[int]:
    """:func:`complete` on an async client (requests sent together really are concurrent)."""
    body = _body(prompt, model, max_tokens, extra)
    response = await client.post(f"{server.url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    ids: list[int] = response.json()["choices"][0]["token_ids"]
    return ids


def metric_total(server: VLLMServer, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` on the engine's /metrics whose labels match."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_metric(
    server: VLLMServer, name: str, at_least: float, timeout_s: float = 10.0, **labels: str
) -> float:
    """Poll until the metric reaches ``at_least`` (stats reach /metrics a step later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = metric_total(server, name, **labels)
        if value >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.2)
