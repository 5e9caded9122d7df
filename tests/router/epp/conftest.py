"""EPP fixtures: the endpoint picker served by grpc.aio in the test's loop, an Envoy double."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from kvstack.router.epp.build import build_epp
from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.server import EppServer
from kvstack.section import deep_merge
from tests.router.conftest import router_config
from tests.router.epp.envoy import EnvoyDouble
from tests.router.fake_engine import FakeEngine


@dataclass
class RunningEpp:
    server: EppServer
    envoy: EnvoyDouble

    def endpoint(self, engine: FakeEngine) -> str:
        return f"127.0.0.1:{engine.port}"


@asynccontextmanager
async def serve_epp(
    backends: Iterable[FakeEngine | str],
    epp: dict[str, Any] | None = None,
    api_client: Any = None,
    **router: Any,
) -> AsyncIterator[RunningEpp]:
    config = router_config(backends, **router)
    server = build_epp(
        config,
        EppConfig.model_validate(deep_merge({"port": 0}, epp or {})),
        api_client=api_client,
    )
    await server.start()
    envoy = EnvoyDouble(f"127.0.0.1:{server.port}")
    try:
        yield RunningEpp(server, envoy)
    finally:
        await envoy.close()
        await server.stop()
