"""Helpers for tests that run real vLLM engines (CPU build): model, engines, requests, metrics."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec

__all__ = [
    "Answer",
    "acomplete",
    "agenerate",
    "booting",
    "chunk_files",
    "complete",
    "first_disagreement",
    "generate",
    "launch_engine",
    "metric_total",
    "start_engine",
    "wait_metric",
]


def launch_engine(model: Path, log_dir: Path, name: str, **spec: Any) -> VLLMServer:
    """An engine whose process is started but not awaited (``.wait_ready()`` awaits it): a
    module's engines boot together, in about the time of one on two cores."""
    spec.setdefault("served_model_name", "toy")
    spec.setdefault("max_model_len", 16384)
    server = VLLMServer(
        VLLMServerSpec(model=str(model), port=free_port(), **spec), log_dir / f"{name}.log"
    )
    return server.launch()


def start_engine(model: Path, log_dir: Path, name: str, **spec: Any) -> VLLMServer:
    return launch_engine(model, log_dir, name, **spec).wait_ready()


@contextlib.contextmanager
def booting(servers: dict[str, VLLMServer]) -> Iterator[dict[str, VLLMServer]]:
    """Launched engines, each awaited by whoever needs it first; all stopped afterwards."""
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


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


def wait_log(path: Path, text: str, timeout_s: float) -> None:
    """Poll a server's log until ``text`` appears in it; fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{path.name} never said {text!r}"
        time.sleep(0.2)


@dataclass(frozen=True)
class Answer:
    """A greedy answer with the logprob of each token and the top two candidates per position."""

    token_ids: list[int]
    logprobs: list[float]
    top: list[dict[int, float]]


def _answer_body(prompt: list[int], max_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    return _body(
        prompt, "toy", max_tokens, {"logprobs": 2, "return_tokens_as_token_ids": True, **extra}
    )


def _answer(response: httpx.Response) -> Answer:
    response.raise_for_status()
    choice = response.json()["choices"][0]
    logprobs = choice["logprobs"]
    top = [_by_token_id(candidates) for candidates in logprobs["top_logprobs"]]
    return Answer(choice["token_ids"], [float(x) for x in logprobs["token_logprobs"]], top)


def generate(server: VLLMServer, prompt: list[int], max_tokens: int = 8, **extra: Any) -> Answer:
    """Greedy completion with logprobs (top two per position, keyed by token id)."""
    body = _answer_body(prompt, max_tokens, extra)
    return _answer(httpx.post(f"{server.url}/v1/completions", json=body, timeout=600))


async def agenerate(
    client: httpx.AsyncClient,
    server: VLLMServer,
    prompt: list[int],
    max_tokens: int = 8,
    **extra: Any,
) -> Answer:
    """:func:`generate` on an async client (requests sent together really are concurrent)."""
    body = _answer_body(prompt, max_tokens, extra)
    return _answer(await client.post(f"{server.url}/v1/completions", json=body, timeout=600))


def _by_token_id(candidates: dict[str, float]) -> dict[int, float]:
    # vLLM keys top logprobs by token text; "token_id:N" with return_tokens_as_token_ids.
    return {int(k.removeprefix("token_id:")): float(v) for k, v in candidates.items()}


def first_disagreement(
    reference: Answer, other: Answer, logprob_tol: float, near_tie: float
) -> str | None:
    """Why ``other`` does not compute what ``reference`` computes, or None.

    Batch composition changes the last bits of CPU numerics, so two correct runs may flip a
    near-tie (a random toy model has many): the answers must agree token for token, with
    logprobs within ``logprob_tol``, up to a first divergence where the reference's top two
    candidates were within ``near_tie`` of each other and ``other`` chose the second. After
    that the contexts differ and nothing is compared. Wrong KV fails this at once: it moves
    logprobs far more than the tolerance and flips tokens that are not ties."""
    for i, (want, got) in enumerate(zip(reference.token_ids, other.token_ids, strict=False)):
        gap = abs(reference.logprobs[i] - other.logprobs[i])
        if want == got:
            if gap > logprob_tol:
                return f"position {i}: logprob {other.logprobs[i]} vs {reference.logprobs[i]}"
            continue
        top = reference.top[i]
        second = top.get(got)
        if second is None or top[want] - second > near_tie:
            return f"position {i}: token {got} (ref logprob {second}) replaced {want} ({top[want]})"
        return None
    if len(reference.token_ids) != len(other.token_ids):
        return f"lengths {len(other.token_ids)} vs {len(reference.token_ids)}"
    return None


def chunk_files(server_log: Path, kv_dir: Path, tokens: list[int], chunk: int) -> list[Path]:
    """The file-tier paths of ``tokens``' chunks, keyed as the engine keys them (its namespace
    is in its log: ``namespace model ...``)."""
    from kvstack.kv.keys import Namespace, chunk_keys

    match = re.search(r"namespace model (\S+)", server_log.read_text())
    assert match, f"no namespace in {server_log}"
    seed = Namespace(match.group(1), "float16").digest()
    return [kv_dir / k.hex()[:2] / f"{k.hex()}.kvc" for k in chunk_keys(tokens, seed, chunk)]
