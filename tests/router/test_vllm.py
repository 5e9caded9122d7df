"""The router in front of two real vLLM CPU engines (the router CLI as its own process)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.router.scrape import metric_sum, wait_health

pytestmark = pytest.mark.vllm
IN_FLIGHT = "kvstack_router_backend_in_flight"
TOKENS = 1000  # each request of the killed-engine test


@dataclass
class Deployment:
    router_url: str
    engines: list[VLLMServer]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router_url}/v1", api_key="none", max_retries=0)


def _engine(model: Path, logs: Path, variant: str) -> VLLMServer:
    # Both serve "toy"; each also answers to its own variant name (for the canary route).
    spec = VLLMServerSpec(
        model=str(model),
        port=free_port(),
        max_model_len=2048,
        extra_args=["--served-model-name", "toy", variant],
    )
    return VLLMServer(spec, logs / f"{variant}.log")


@pytest.fixture(scope="module")
def deployment(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    logs = tmp_path_factory.mktemp("router-vllm")
    engines = [_engine(toy_model, logs, v) for v in ("toy-v1", "toy-v2")]
    router: ManagedProcess | None = None
    try:
        with ThreadPoolExecutor(2) as pool:  # start both engines at once
            list(pool.map(lambda e: e.start(), engines))
        config = logs / "router.yaml"
        config.write_text(
            "router:\n  backends:\n"
            + "".join(f"    - url: {e.url}\n" for e in engines)
            + "  health: {interval_s: 0.3, timeout_s: 1.0}\n"
            "  models:\n    - name: toy-canary\n      targets:\n"
            "        - {model: toy-v1, weight: 70}\n        - {model: toy-v2, weight: 30}\n"
        )
        port = free_port()
        argv = [sys.executable, "-m", "kvstack", "router", "--config", str(config)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        router = ManagedProcess("router", argv, logs / "router.log").start()
        router.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield Deployment(f"http://127.0.0.1:{port}", engines)
    finally:
        if router is not None:
            router.stop()
        for engine in engines:
            engine.stop()


def test_openai_client_streaming_and_not(deployment: Deployment) -> None:
    client = deployment.client()
    raw = client.completions.with_raw_response.create(model="toy", prompt="the cache", max_tokens=4)
    assert raw.headers["x-kvstack-backend"] in {e.url for e in deployment.engines}
    assert "reason=" in raw.headers["x-kvstack-decision"]
    assert raw.parse().usage.completion_tokens == 4
    stream = client.chat.completions.create(
        model="toy",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) >= 3  # tokens arrived as separate chunks
    assert {m.id for m in client.models.list().data} == {"toy", "toy-v1", "toy-v2", "toy-canary"}
    # The router reads the real engines' metrics under their current names. An engine busy
    # on two shared cores can let one /metrics scrape time out (the router then rightly marks
    # it stale), so the fresh reading is awaited for a few scrape periods, not assumed.
    fresh = [
        f'kvstack_router_backend_metrics_stale{{backend="{e.url}"}} 0.0' for e in deployment.engines
    ]
    deadline = time.monotonic() + 15.0
    metrics = httpx.get(f"{deployment.router_url}/metrics").text
    while not all(line in metrics for line in fresh) and time.monotonic() < deadline:
        time.sleep(0.5)
        metrics = httpx.get(f"{deployment.router_url}/metrics").text
    for engine, line in zip(deployment.engines, fresh, strict=True):
        assert line in metrics
        assert f'kvstack_router_backend_engine_kv_usage{{backend="{engine.url}"}}' in metrics


def test_canary_weights_on_real_engines(deployment: Deployment) -> None:
    with httpx.Client(timeout=120) as http:

        def one(i: int) -> str:
            body = {"model": "toy-canary", "prompt": f"q {i}", "max_tokens": 1}
            resp = http.post(f"{deployment.router_url}/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.headers["x-kvstack-backend"]  # vLLM answers with its first name

        with ThreadPoolExecutor(4) as pool:
            served = Counter(pool.map(one, range(80)))
    v1, v2 = (e.url for e in deployment.engines)  # only engine 1 serves toy-v1, 2 toy-v2
    assert set(served) == {v1, v2}
    assert 0.15 <= served[v2] / 80 <= 0.45, served  # 30% ± 15 points (σ ≈ 5)


def test_killed_engine_loses_no_unstarted_request_and_health_follows(
    deployment: Deployment,
) -> None:
    client = deployment.client()

    # Long enough that the freeze below finds one in flight on a loaded host: 200 tokens each
    # once all ended before the router's gauge was read.
    def one(i: int) -> int:
        done = client.completions.create(
            model="toy", prompt=f"request {i}", max_tokens=TOKENS, extra_body={"ignore_eos": True}
        )
        assert done.usage is not None
        return done.usage.completion_tokens

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        victim = _freeze_busy_engine(deployment)
        survivor = next(e for e in deployment.engines if e is not victim)
        assert victim.pid is not None
        os.killpg(victim.pid, signal.SIGKILL)  # the API server and its engine core
        assert [f.result(timeout=300) for f in futures] == [TOKENS] * 8
    assert metric_sum(deployment.router_url, "kvstack_router_retries_total") >= 1

    assert survivor.pid is not None
    os.kill(survivor.pid, signal.SIGSTOP)  # hung: health checks time out
    try:
        assert wait_health(deployment.router_url, 503)
    finally:
        os.kill(survivor.pid, signal.SIGCONT)
    assert wait_health(deployment.router_url, 200)
    done = client.completions.create(model="toy", prompt="back again", max_tokens=2)
    assert done.choices[0].text is not None


def _freeze_busy_engine(deployment: Deployment, timeout_s: float = 30.0) -> VLLMServer:
    """An engine with a request in flight (the policy decides which), stopped with SIGSTOP so
    that the request stays in flight until the caller kills it. Between reading the router's
    gauge and a kill, a fast engine could finish its requests (then there is nothing to
    retry); a stopped one cannot, so the gauge is read again once it is stopped."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for engine in deployment.engines:
            if metric_sum(deployment.router_url, IN_FLIGHT, backend=engine.url) == 0:
                continue
            assert engine.pid is not None
            os.killpg(engine.pid, signal.SIGSTOP)
            time.sleep(0.3)  # an answer already on its way reaches the router
            if metric_sum(deployment.router_url, IN_FLIGHT, backend=engine.url) > 0:
                return engine
            os.killpg(engine.pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("no engine held a request in flight")
