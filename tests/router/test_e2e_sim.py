"""End to end over processes: `kvstack router` (the CLI, a YAML file) in front of three
`kvstack sim-engine` processes, driven by the official openai client."""

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
from tests.router.scrape import metric_sum, wait_health

pytestmark = pytest.mark.slow


@dataclass
class SimFleet:
    router_url: str
    engines: dict[str, ManagedProcess]  # url -> process
    router_log: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router_url}/v1", api_key="none", max_retries=0)


def _sim(port: int, model: str, logs: Path) -> ManagedProcess:
    argv = [sys.executable, "-m", "kvstack", "sim-engine", "--port", str(port), "--model", model]
    proc = ManagedProcess(f"sim-{port}", argv, logs / f"sim-{port}.log").start()
    proc.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    return proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    logs = tmp_path_factory.mktemp("e2e-sim")
    ports = [free_port() for _ in range(3)]
    models = ["sim-v1", "sim-v1", "sim-v2"]
    engines: dict[str, ManagedProcess] = {}
    router: ManagedProcess | None = None
    try:
        for port, model in zip(ports, models, strict=True):
            engines[f"http://127.0.0.1:{port}"] = _sim(port, model, logs)
        config = logs / "router.yaml"
        backends = "".join(f"\n    - url: {url}" for url in engines)
        config.write_text(
            "router:\n  policy: least_load\n  backends:" + backends + "\n"
            "  health: {interval_s: 0.2, timeout_s: 0.5}\n"
            "  models:\n    - name: sim\n      targets:\n"
            "        - {model: sim-v1, weight: 80}\n        - {model: sim-v2, weight: 20}\n"
            # The README's canary, whose targets no engine here serves.
            "    - name: support\n      targets:\n"
            "        - {model: support-v1, weight: 90}\n        - {model: support-v2, weight: 10}\n"
        )
        port = free_port()
        argv = [sys.executable, "-m", "kvstack", "router", "--config", str(config)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        router = ManagedProcess("router", argv, logs / "router.log").start()
        router.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
        yield SimFleet(f"http://127.0.0.1:{port}", engines, logs / "router.log")
    finally:
        if router is not None:
            router.stop()
        for proc in engines.values():
            proc.stop()


def test_openai_client_streams_and_not(fleet: SimFleet) -> None:
    client = fleet.client()
    done = client.completions.create(model="sim-v1", prompt="hello there", max_tokens=5)
    assert done.usage is not None and done.usage.completion_tokens == 5
    chunks = list(client.completions.create(model="sim-v1", prompt="hi", max_tokens=4, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len(text.split()) == 4  # four tokens (a lagging engine may send two in one chunk)
    chat = client.chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    ids = {m.id for m in client.models.list().data}
    assert ids == {"sim-v1", "sim-v2", "sim"}


def test_unserved_canary_is_warned_at_start_and_not_listed(fleet: SimFleet) -> None:
    lines = fleet.router_log.read_text().splitlines()
    warned = [line for line in lines if "is served by no backend" in line]
    assert len(warned) == 2, warned  # one line per target, not one per health round
    assert "'support': target 'support-v1' is served by no backend" in warned[0]
    assert "'support': target 'support-v2' is served by no backend" in warned[1]
    assert "support" not in {m.id for m in fleet.client().models.list().data}


def test_x_request_id_appears_once(fleet: SimFleet) -> None:
    body = {"model": "sim-v1", "prompt": "hi", "max_tokens": 1}
    headers = {"x-request-id": "req-1"}
    resp = httpx.post(f"{fleet.router_url}/v1/completions", json=body, headers=headers)
    ids = [v for k, v in resp.headers.raw if k.lower() == b"x-request-id"]
    assert resp.status_code == 200 and ids == [b"req-1"]  # the engine echoes it too


def test_canary_weights_hold_over_many_requests(fleet: SimFleet) -> None:
    with httpx.Client() as http:

        def one(i: int) -> str:
            body = {"model": "sim", "prompt": f"q{i}", "max_tokens": 1}
            resp = http.post(f"{fleet.router_url}/v1/completions", json=body, timeout=30)
            assert resp.status_code == 200
            return str(resp.json()["model"])

        with ThreadPoolExecutor(8) as pool:
            served = Counter(pool.map(one, range(300)))
    assert 0.13 <= served["sim-v2"] / 300 <= 0.27, served  # 20% ± 7 points (σ ≈ 2.3)


def test_killed_engine_loses_no_request_that_had_not_started_streaming(fleet: SimFleet) -> None:
    client = fleet.client()
    victim_url, victim = next(iter(fleet.engines.items()))

    def one(i: int) -> int:
        done = client.completions.create(model="sim-v1", prompt=f"long {i}", max_tokens=120)
        assert done.usage is not None
        return done.usage.completion_tokens

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, i) for i in range(12)]
        _wait_in_flight(fleet.router_url, victim_url)  # requests are running on it
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        results = [f.result(timeout=60) for f in futures]
    assert results == [120] * 12
    health = httpx.get(f"{fleet.router_url}/health").json()
    assert health["backends"][victim_url]["usable"] is False
    # Not vacuous: requests were running on the victim and were retried elsewhere.
    assert metric_sum(fleet.router_url, "kvstack_router_retries_total") >= 1


def test_health_is_503_when_all_engines_are_down_and_recovers(fleet: SimFleet) -> None:
    alive = [p for p in fleet.engines.values() if p.alive()]
    try:
        for proc in alive:  # a hung engine answers nothing, health checks time out
            os.kill(proc.pid or 0, signal.SIGSTOP)
        assert wait_health(fleet.router_url, 503)
    finally:
        for proc in alive:
            os.kill(proc.pid or 0, signal.SIGCONT)
    assert wait_health(fleet.router_url, 200)
    done = fleet.client().completions.create(model="sim-v2", prompt="back", max_tokens=2)
    assert done.choices[0].text


def _wait_in_flight(router_url: str, backend: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metric_sum(router_url, "kvstack_router_backend_in_flight", backend=backend) > 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"no request in flight on {backend}")
