"""Streaming passes through chunk by chunk; clients that leave cancel the upstream request."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai

from tests.router.conftest import RouterFactory, engines
from tests.router.fake_engine import FakeEngine


async def test_stream_chunks_arrive_as_the_engine_sends_them(
    run_router: RouterFactory, http: aiohttp.ClientSession
) -> None:
    engine = FakeEngine("a", chunk_delay_s=0.25, num_chunks=3)
    async with engines(engine), run_router([engine]) as r:
        body = {"model": "toy", "prompt": "hi", "stream": True}
        arrivals: list[tuple[float, bytes]] = []
        async with http.post(f"{r.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for chunk in resp.content.iter_any():
                arrivals.append((time.perf_counter(), chunk))
        text = b"".join(c for _, c in arrivals)
        assert text.count(b"data: ") == 4 and text.endswith(b"data: [DONE]\n\n")
        # Not buffered: the first chunk came about 2 chunk delays before the end.
        assert arrivals[-1][0] - arrivals[0][0] > 0.4


async def test_openai_client_streams_and_not_through_the_router(
    run_router: RouterFactory,
) -> None:
    async with engines(FakeEngine("a"), FakeEngine("b")) as fleet, run_router(fleet) as r:
        client = openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key="unused", max_retries=0)
        try:
            chat = await client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": "hi"}]
            )
            assert chat.choices[0].message.content in ("from a", "from b")
            stream = await client.completions.create(model="toy", prompt="hi", stream=True)
            pieces = [c.choices[0].text async for c in stream]
            assert len(pieces) == 3 and pieces[0].endswith(":0 ")
            chat_stream = await client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            deltas = [c.choices[0].delta.content async for c in chat_stream]
            assert len(deltas) == 3
            models = await client.models.list()
            assert [m.id for m in models.data] == ["toy"]
        finally:
            await client.close()


async def test_stream_cut_mid_way_ends_with_an_error_event_and_is_not_retried(
    run_router: RouterFactory,
) -> None:
    broken = FakeEngine("a", break_after=1, num_chunks=4, chunk_delay_s=0.05)
    fine = FakeEngine("b")
    async with engines(broken, fine), run_router([broken, fine], policy="round_robin") as r:
        client = openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key="unused", max_retries=0)
        try:
            got: list[str] = []
            error: Exception | None = None
            for _ in range(2):  # round-robin: one of the two lands on the broken engine
                stream = await client.completions.create(model="toy", prompt="x", stream=True)
                try:
                    async for chunk in stream:
                        got.append(chunk.choices[0].text)
                except openai.APIError as exc:
                    error = exc
        finally:
            await client.close()
        assert error is not None and "mid-stream" in str(error)
        assert got.count("a:0 ") == 1  # bytes reached the client before the cut
        assert len(fine.seen) == 1  # the cut request was not sent again
        assert r.router.pool.get(broken.url).in_flight == 0


async def test_client_disconnect_cancels_the_upstream_request(
    run_router: RouterFactory,
) -> None:
    engine = FakeEngine("a", hang=True)
    async with engines(engine), run_router([engine]) as r:
        async with aiohttp.ClientSession() as session:
            post = session.post(f"{r.url}/v1/completions", json={"model": "toy", "prompt": "x"})
            task = asyncio.create_task(post.__aenter__())
            await _until(lambda: engine.in_progress == 1)
            task.cancel()  # the client gives up and closes its connection
        await _until(lambda: engine.disconnects == 1)
        state = r.router.pool.get(engine.url)
        assert state is not None
        await _until(lambda: state.in_flight == 0 and state.in_flight_prefill_tokens == 0)


async def test_client_leaving_mid_stream_stops_the_engine_stream(
    run_router: RouterFactory,
) -> None:
    engine = FakeEngine("a", chunk_delay_s=0.05, num_chunks=200)
    async with engines(engine), run_router([engine]) as r:
        async with aiohttp.ClientSession() as session:
            body = {"model": "toy", "prompt": "x", "stream": True}
            async with session.post(f"{r.url}/v1/completions", json=body) as resp:
                await resp.content.readany()
        await _until(lambda: engine.disconnects == 1, timeout_s=3)
        assert engine.in_progress == 0


async def _until(predicate, timeout_s: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
