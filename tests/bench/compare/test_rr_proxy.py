"""The round-robin baseline proxy alternates backends and passes streams through."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess
from tests.bench.conftest import FleetFactory


def test_alternates_and_streams(sim_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = sim_fleet(num=2, time_scale=20)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvstack.bench.compare.rr_proxy",
        "--port",
        str(port),
        *fleet.urls,
    ]
    proxy = ManagedProcess("rr", argv, tmp_path / "rr.log")
    with proxy:
        url = f"http://127.0.0.1:{port}"
        proxy.wait_healthy(url + "/health", 20)
        seen = []
        for _ in range(4):
            r = httpx.post(url + "/v1/completions", json={"prompt": "t20 t21", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
            seen.append(r.headers["x-kvstack-backend"])
        assert seen == [fleet.urls[0], fleet.urls[1]] * 2
        body = {"prompt": "t20", "max_tokens": 3, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 2
        assert (
            httpx.post(url + "/v1/completions", json={"model": "x", "prompt": "t1"}).status_code
            == 404
        )
