"""The ext_proc conversation: Envoy's message sequences in full-duplex and buffered modes, the
destination in header and metadata, refusals, health, authentication and TLS."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from kvstack.errors import ConfigError
from kvstack.router.epp.build import build_epp
from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.protocol import endpoint_of
from kvstack.router.epp.server import epp_token
from kvstack.router.epp.tls import self_signed_pair
from kvstack.security import SecurityConfig, load_keys, write_secret_file
from tests.router.conftest import engines, router_config
from tests.router.epp.conftest import serve_epp
from tests.router.epp.envoy import BUFFERED, FULL_DUPLEX, STREAMED, EnvoyDouble, _headers
from tests.router.fake_engine import FakeEngine

CHAT = {"model": "toy", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


@pytest.mark.parametrize("chunk_bytes", [7, 1 << 20])
async def test_full_duplex_answers_after_the_body_with_header_metadata_and_body(
    chunk_bytes: int,
) -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        raw = json.dumps(CHAT).encode()
        answer = await epp.envoy.pick("/v1/chat/completions", raw, chunk_bytes=chunk_bytes)
        endpoint = epp.endpoint(a)
        assert answer.status is None and answer.endpoint == endpoint
        assert answer.metadata == {"envoy.lb": {"x-gateway-destination-endpoint": endpoint}}
        assert answer.clear_route_cache
        assert answer.body == raw  # unchanged: echoed back whole, no content-length change
        assert "content-length" not in answer.headers
        assert answer.headers["x-request-id"]  # the router's request id, as it sends upstream
        assert answer.messages == 2  # the headers answer and one streamed body chunk


async def test_buffered_mode_continues_the_headers_and_picks_at_the_body() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        raw = json.dumps(CHAT).encode()
        answer = await epp.envoy.pick("/v1/chat/completions", raw, request_mode=BUFFERED)
        assert answer.endpoint == epp.endpoint(a) and answer.clear_route_cache
        assert answer.metadata["envoy.lb"]["x-gateway-destination-endpoint"] == answer.endpoint
        assert answer.body == raw and answer.messages == 2


@pytest.mark.parametrize("mode", [FULL_DUPLEX, BUFFERED])
async def test_streamed_answer_passes_through_and_drives_the_load_lease(mode: int) -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        state = epp.server.router.pool.states()[0]
        async with epp.envoy.stream(mode, mode) as s:
            answer = await s.send_request("/v1/chat/completions", {**CHAT, "stream": True})
            assert answer.endpoint == epp.endpoint(a)
            assert (state.in_flight, state.pending) == (1, 1)  # counted at the pick
            chunks = [b'data: {"model": "toy", "choices": []}\n\n', b"data: [DONE]\n\n"]
            added, echoed = await s.send_response(200, chunks, "text/event-stream")
            assert echoed == b"".join(chunks)
            assert added["x-kvstack-backend"] == state.id  # the router's answer headers
            assert "reason=" in added["x-kvstack-decision"]
        assert (state.in_flight, state.pending) == (0, 0)


async def test_a_stream_cut_after_the_pick_releases_the_load() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        state = epp.server.router.pool.states()[0]
        await epp.envoy.pick("/v1/chat/completions", CHAT)  # no response side: Envoy reset
        deadline = 100
        while state.in_flight and deadline:
            await asyncio.sleep(0.01)
            deadline -= 1
        assert state.in_flight == 0


async def test_refusals_are_immediate_responses_with_openai_errors() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        bad = await epp.envoy.pick("/v1/chat/completions", b"{not json")
        assert bad.status == 400 and bad.headers["x-kvstack-error"] == "invalid_json"
        unknown = await epp.envoy.pick("/v1/chat/completions", {**CHAT, "model": "nope"})
        assert unknown.status == 404 and "toy" in unknown.json["error"]["message"]
        half = await epp.envoy.pick("/v1/chat/completions", CHAT, request_mode=STREAMED)
        assert half.status == 500 and "FULL_DUPLEX_STREAMED" in half.json["error"]["message"]


async def test_no_usable_endpoint_is_503_as_gie_documents() -> None:
    async with engines(FakeEngine("a", healthy=False)) as [a], serve_epp([a]) as epp:
        answer = await epp.envoy.pick("/v1/chat/completions", CHAT)
        assert answer.status == 503 and answer.headers["x-kvstack-error"] == "no_backend"


async def test_a_bodyless_request_gets_an_endpoint_from_the_headers() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:
        answer = await epp.envoy.pick("/v1/models", None)
        assert answer.endpoint == epp.endpoint(a) and answer.messages == 1


async def test_health_services_follow_the_protocol_names() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a], {"health_port": 0}) as epp:
        stub = health_pb2_grpc.HealthStub(epp.envoy.channel)
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


async def test_a_cluster_secret_requires_the_gateway_token(tmp_path: Path) -> None:
    secret = write_secret_file(tmp_path / "secret")
    security = SecurityConfig(cluster_secret_file=str(secret))
    async with engines(FakeEngine("a")) as [a]:
        server = build_epp(
            router_config([a]), EppConfig(host="0.0.0.0", port=0), security
        )  # beyond loopback: allowed, the token authenticates
        await server.start()
        try:
            target = f"127.0.0.1:{server.port}"
            anonymous = EnvoyDouble(target)
            call = anonymous.stub.Process()
            with contextlib.suppress(grpc.aio.AioRpcError):  # the write may race the abort
                await call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
            assert await call.code() == grpc.StatusCode.UNAUTHENTICATED
            await anonymous.close()
            keys = load_keys(security)
            assert keys is not None
            gateway = EnvoyDouble(target, metadata=[("authorization", f"Bearer {epp_token(keys)}")])
            assert (await gateway.pick("/v1/chat/completions", CHAT)).endpoint
            await gateway.close()
        finally:
            await server.stop()


async def test_beyond_loopback_without_authentication_refuses_to_start() -> None:
    server = build_epp(router_config(["http://127.0.0.1:1"]), EppConfig(host="0.0.0.0", port=0))
    with pytest.raises(ConfigError, match="without authentication"):
        await server.start()


async def test_tls_with_a_configured_certificate(tmp_path: Path) -> None:
    key, cert = self_signed_pair("epp.test")
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "cert.pem").write_bytes(cert)
    tls = {"cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "key.pem")}
    async with engines(FakeEngine("a")) as [a], serve_epp([a], {"tls": tls}) as epp:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert)
        options = [("grpc.ssl_target_name_override", "epp.test")]
        envoy = EnvoyDouble(f"127.0.0.1:{epp.server.port}", credentials, options=options)
        assert (await envoy.pick("/v1/chat/completions", CHAT)).endpoint == epp.endpoint(a)
        await envoy.close()


async def test_the_response_side_teaches_ttft_and_releases_the_prefill_share() -> None:
    """What the router learns from a relayed answer, the EPP learns from the ext_proc response
    messages: the cost model's rates, the TTFT metrics, the load lease's prefill share."""

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    ttft = {"learn": True, "prefill_tokens_per_s": 8000.0}
    pipeline = {"scorers": [{"name": "ttft", "args": ttft}]}
    fleet = engines(FakeEngine("a"), FakeEngine("b"))  # two: a lone candidate is not scored
    async with fleet as [a, b], serve_epp([a, b], pipeline=pipeline) as epp:
        router = epp.server.router
        scorer = router.scheduler.pipeline.scorers[0].scorer
        prior = list(scorer.model.fleet.w)
        errors = sample("kvstack_router_ttft_prediction_error_seconds_count")
        ttfts = sample("kvstack_router_ttft_seconds_count", model="toy")
        async with epp.envoy.stream() as s:
            answer = await s.send_request("/v1/chat/completions", {**CHAT, "stream": True})
            state = next(
                st for st in router.pool.states() if endpoint_of(st.url) == answer.endpoint
            )
            await asyncio.sleep(0.3)  # the engine's prefill, as the gateway sees it
            headers = _headers({":status": "200", "content-type": "text/event-stream"})
            await s.call.write(pb.ProcessingRequest(response_headers=headers))
            await s.call.read()
            assert (state.in_flight, state.pending) == (1, 1)  # headers are not a token
            first = pb.HttpBody(body=b'data: {"model": "toy", "choices": []}\n\n')
            await s.call.write(pb.ProcessingRequest(response_body=first))
            await s.call.read()
            assert (state.in_flight, state.pending) == (1, 0)  # prefill share back
            assert scorer.model.fleet.samples == 1 and scorer.model.fleet.w != prior
            assert sample("kvstack_router_ttft_prediction_error_seconds_count") == errors + 1
            last = pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)
            await s.call.write(pb.ProcessingRequest(response_body=last))
            await s.call.read()
        assert (state.in_flight, state.pending) == (0, 0)
        assert sample("kvstack_router_ttft_seconds_count", model="toy") == ttfts + 1
        assert scorer.model.fleet.w[0] > prior[0]  # 0.3 s observed: the learnt base grew
