"""The control-plane client: httpx, bounded GETs, failures classified; no aiohttp in the router."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from kvstack.errors import UpstreamError
from kvstack.router.upstream.control import ControlClient
from kvstack.stack.ports import free_port
from tests.router.fake_engine import FakeEngine


async def _never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # holds the connection open until the client leaves
    writer.close()


async def test_get_reads_and_classifies_failures() -> None:
    client = ControlClient()
    with pytest.raises(RuntimeError, match="start"):
        await client.get("http://127.0.0.1:1/health", 1.0)
    await client.start()
    engine = await FakeEngine("a").start()
    try:
        status, body = await client.get(engine.url + "/v1/models", 2.0)
        assert status == 200 and json.loads(body)["data"]
        with pytest.raises(UpstreamError) as refused:
            await client.get(f"http://127.0.0.1:{free_port()}/health", 2.0)
        assert refused.value.kind == "connect"
        silent = await asyncio.start_server(_never_answer, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        with pytest.raises(UpstreamError) as slow:
            await client.get(f"http://127.0.0.1:{port}/health", 0.1)
        assert slow.value.kind == "timeout" and slow.value.status == 504
        silent.close()
    finally:
        await engine.stop()
        await client.close()
        await asyncio.sleep(0)


def test_the_router_process_imports_no_aiohttp() -> None:
    code = (
        "import sys, kvstack.router.router, kvstack.router.http.server, kvstack.router.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
