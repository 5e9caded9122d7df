"""Measurements against a running vLLM OpenAI server: TTFT, throughput, cache resets."""

from __future__ import annotations

import concurrent.futures
import random
import statistics
import time
from collections.abc import Callable, Sequence

import httpx

from kvstack.stack.vllm_server import VLLMServer

__all__ = ["PromptFactory", "median_ttft", "reset_prefix_cache", "throughput", "ttft"]


class PromptFactory:
    """Random token-id prompts; every call gives a prompt no engine has seen."""

    def __init__(self, seed: int, vocab: int = 2000) -> None:
        self._rng = random.Random(seed)
        self._vocab = vocab

    def __call__(self, num_tokens: int) -> list[int]:
        return [self._rng.randrange(10, self._vocab) for _ in range(num_tokens)]


def ttft(server: VLLMServer, prompt: Sequence[int], timeout_s: float = 600.0) -> float:
    """Seconds from sending a streaming completion to its first token."""
    body = {
        "model": server.model_name,
        "prompt": list(prompt),
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=timeout_s) as r:
        r.raise_for_status()
        for line in r.iter_lines():  # read to the end so the request completes
            if first is None and line.startswith("data:") and '"text"' in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


def median_ttft(samples: Sequence[Callable[[], float]]) -> float:
    return statistics.median(sample() for sample in samples)


def reset_prefix_cache(server: VLLMServer) -> None:
    """Drop vLLM's own prefix cache (needs VLLM_SERVER_DEV_MODE=1 on the engine)."""
    for _ in range(50):
        r = httpx.post(f"{server.url}/reset_prefix_cache", timeout=30)
        r.raise_for_status()
        if r.json().get("success", True):
            return
        time.sleep(0.1)
    raise RuntimeError("vLLM did not reset its prefix cache")


def throughput(
    server: VLLMServer, prompts: Sequence[Sequence[int]], max_tokens: int
) -> dict[str, float]:
    """All prompts at once; tokens (prompt + generated) per second over the whole batch."""

    def one(prompt: Sequence[int]) -> int:
        body = {
            "model": server.model_name,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        usage = r.json()["usage"]
        return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        tokens = sum(pool.map(one, prompts))
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed}
