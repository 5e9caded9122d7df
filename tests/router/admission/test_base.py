"""The admission seam: a plugin can hold or shed requests before a backend is chosen."""

from __future__ import annotations

import asyncio

import aiohttp

from kvstack.errors import RequestError
from kvstack.router.admission.base import ADMISSIONS, Admission
from kvstack.router.admission.permit import Permit
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import PluginContext
from tests.router.conftest import RouterFactory, engines
from tests.router.fake_engine import FakeEngine
from tests.router.vllm_schema import assert_vllm_error


class _Counted:
    def __init__(self, owner: GateAdmission) -> None:
        self.owner = owner

    def release(self) -> None:
        self.owner.released += 1


class GateAdmission(Admission):
    """Sheds priority 'sheddable'; holds the rest until ``gate`` opens."""

    name = "test_gate"
    last: GateAdmission | None = None

    def __init__(self, context: PluginContext) -> None:
        super().__init__(context)
        self.gate = asyncio.Event()
        self.released = 0
        GateAdmission.last = self

    async def admit(self, request: RoutingRequest) -> Permit:
        if request.priority == "sheddable":
            raise RequestError("overloaded", 429, code="overloaded", retry_after_s=2.5)
        await self.gate.wait()
        return _Counted(self)


if "test_gate" not in ADMISSIONS:
    ADMISSIONS.register("test_gate", GateAdmission)


async def test_admission_sheds_and_holds_before_the_backend_is_chosen(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a")
    body = {"model": "toy", "prompt": "x"}
    async with engines(engine), run_router([engine], admission={"name": "test_gate"}) as r:
        gate = GateAdmission.last
        assert gate is not None
        shed = {"x-kvstack-priority": "sheddable"}
        async with http.post(f"{r.url}/v1/completions", json=body, headers=shed) as resp:
            assert resp.status == 429 and resp.headers["retry-after"] == "3"
            assert resp.headers["x-kvstack-error"] == "overloaded"
            assert_vllm_error(await resp.json(), 429)
        held = asyncio.create_task(http.post(f"{r.url}/v1/completions", json=body))
        await asyncio.sleep(0.2)
        assert not held.done() and engine.seen == []  # waiting, no backend chosen yet
        gate.gate.set()
        resp = await held
        assert resp.status == 200
        resp.release()
        assert len(engine.seen) == 1 and gate.released == 1
