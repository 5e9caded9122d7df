"""Pooling routes through the router, against a real vLLM CPU engine serving the toy model as
an embedding model (``--runner pooling --convert embed``, module-scoped): the official
``openai`` client's embeddings and vLLM's ``/score`` answer through the router exactly as the
engine answers them directly, and a model nobody serves gets vLLM's 404."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.router.vllm_schema import assert_vllm_error

pytestmark = pytest.mark.vllm


@dataclass
class Pooling:
    engine_url: str
    router_url: str


@pytest.fixture(scope="module")
def pooling(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pooling]:
    logs = tmp_path_factory.mktemp("vllm-embed")
    spec = VLLMServerSpec(
        model=str(toy_model), port=free_port(), served_model_name="toy", max_model_len=512,
        extra_args=["--runner", "pooling", "--convert", "embed"],
    )  # fmt: skip
    engine = VLLMServer(spec, logs / "engine.log")
    port = free_port()
    cmd = [sys.executable, "-m", "kvstack", "router", "--host", "127.0.0.1", "--port",
           str(port), "--backend", engine.url]  # fmt: skip
    router = ManagedProcess("embed-router", cmd, logs / "router.log")
    try:
        engine.start()
        router.start().wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield Pooling(engine.url, f"http://127.0.0.1:{port}")
    finally:
        router.stop()
        engine.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def test_embeddings_through_the_router_are_the_engines(pooling: Pooling) -> None:
    texts = ["the prefix cache", "a shared tier", "the prefix cache"]
    routed = _client(pooling.router_url).embeddings.with_raw_response.create(
        model="toy", input=texts
    )
    assert routed.headers["x-kvstack-backend"] == pooling.engine_url
    ours = [item.embedding for item in routed.parse().data]
    direct = [e.embedding for e in _client(pooling.engine_url).embeddings.create(
        model="toy", input=texts).data]  # fmt: skip
    assert len(ours) == 3 and len(ours[0]) > 0
    assert ours == direct
    # Not a constant: different texts embed differently, the same text the same.
    assert ours[0] != ours[1] and ours[0] == ours[2]


def test_score_through_the_router_and_vllms_404(pooling: Pooling) -> None:
    body = {"model": "toy", "queries": "the prefix cache",
            "documents": ["the prefix cache", "a shared tier"]}  # fmt: skip
    with httpx.Client(timeout=120) as http:
        routed = http.post(pooling.router_url + "/score", json=body)
        direct = http.post(pooling.engine_url + "/score", json=body)
        missing = http.post(pooling.router_url + "/v1/embeddings",
                            json={"model": "nope", "input": "x"})  # fmt: skip
    assert routed.status_code == direct.status_code == 200, direct.text
    scores = [d["score"] for d in routed.json()["data"]]
    assert scores == [d["score"] for d in direct.json()["data"]] and len(scores) == 2
    assert scores[0] > scores[1]  # the query scores itself highest
    assert missing.status_code == 404
    assert_vllm_error(missing.json(), 404)
