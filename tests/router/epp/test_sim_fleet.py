"""`kvstack epp` (the CLI, a YAML file) in front of three simulated engines publishing KV
events; the Envoy double plays the data plane: it asks, forwards the request where the EPP
said, and streams the answer back through the response side."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Iterator

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, fleet_specs
from kvstack.stack.ports import free_port, free_port_run
from kvstack.stack.procs import ManagedProcess
from tests.router.epp.envoy import EnvoyDouble

pytestmark = pytest.mark.slow
SIM = {"block_size": 16, "num_blocks": 2048, "prefill_tokens_per_s": 20000.0, "step_base_s": 0.002}


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetThread]:
    events = free_port_run(3)
    config = SimConfig(**SIM, kv_events_endpoint=f"tcp://*:{events}")
    with FleetThread(fleet_specs(config, 3, free_port_run(3), "127.0.0.1")) as f:
        f.event_ports = [events + i for i in range(3)]  # type: ignore[attr-defined]
        yield f


@pytest.fixture(scope="module")
def epp(fleet: FleetThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("epp-sim")
    ports = fleet.event_ports  # type: ignore[attr-defined]
    sources = {u: f"tcp://127.0.0.1:{p}" for u, p in zip(fleet.urls, ports, strict=True)}
    port, health = free_port(), free_port()
    config = {
        "router": {
            "backends": [{"url": u} for u in fleet.urls],
            "prefix": {"tokenizers": {"sim-model": "sim"}, "events": {"sources": sources}},
            "health": {"interval_s": 0.2, "timeout_s": 3.0},
        },
        "epp": {"port": port, "health_port": health},
    }
    (logs / "epp.yaml").write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "kvstack", "epp", "--config", str(logs / "epp.yaml")]
    proc = ManagedProcess("epp", argv, logs / "epp.log").start()
    try:
        asyncio.run(_wait_serving(f"127.0.0.1:{health}"))
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop(grace_s=5)
        assert "Traceback" not in (logs / "epp.log").read_text()


async def _wait_serving(target: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while loop.time() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError("the EPP did not become ready")


def words(group: int, n: int) -> str:
    return " ".join(f"g{group}w{i}" for i in range(n))


async def test_groups_stick_to_their_cached_engine_and_streams_pass(epp: str) -> None:
    envoy = EnvoyDouble(epp)
    picks: dict[int, Counter[str]] = {g: Counter() for g in range(3)}
    async with httpx.AsyncClient(timeout=30) as http:
        for round_ in range(4):
            for group in range(3):
                body = {"model": "sim-model", "prompt": f"{words(group, 600)} q{round_}",
                        "max_tokens": 4, "stream": True}  # fmt: skip
                done = await envoy.forward("/v1/completions", body, http)
                assert done.status == 200, done.body
                events = [e for e in done.body.split(b"\n\n") if e.startswith(b"data: {")]
                assert events and json.loads(events[0][6:])["model"] == "sim-model"
                assert done.body.rstrip().endswith(b"data: [DONE]")
                assert done.headers["x-kvstack-backend"]
                picks[group][str(done.answer.endpoint)] += 1
            await asyncio.sleep(0.3)  # the engines' KV events reach the EPP
    await envoy.close()
    homes = {g: c.most_common(1)[0] for g, c in picks.items()}
    assert all(n == 4 for _, n in homes.values()), picks  # every repeat went home
    assert len({home for home, _ in homes.values()}) == 3  # and the groups spread
