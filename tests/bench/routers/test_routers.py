"""The multi-router benchmark's parts: the spreader hands each connection to one replica and
copies bytes both ways; the report's medians, spreads and ratios to the single router."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

from kvstack.bench.compare.report import Cell
from kvstack.bench.load.stats import SLO, summarize
from kvstack.bench.routers.cli import aggregate, table
from kvstack.bench.routers.spread import Spreader, picker
from kvstack.stack.ports import free_port


async def test_each_connection_goes_to_one_replica_and_bytes_flow_both_ways() -> None:
    seen: Counter[int] = Counter()

    def replica(port: int) -> object:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen[port] += 1
            while line := await reader.readline():
                writer.write(f"{port}:".encode() + line)
                await writer.drain()
            writer.close()

        return asyncio.start_server(answer, "127.0.0.1", port)

    ports = [free_port(), free_port()]
    servers = [await replica(p) for p in ports]  # type: ignore[misc]
    front = free_port()
    ready = asyncio.Event()
    task = asyncio.create_task(
        Spreader(picker("random", ports, seed=3)).serve("127.0.0.1", front, ready)
    )
    await ready.wait()
    try:
        for n in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", front)
            replies = []
            for i in range(2):  # one connection, two requests: the same replica
                writer.write(f"hello {n}.{i}\n".encode())
                replies.append((await reader.readline()).decode())
            writer.close()
            assert replies[0].split(":")[0] == replies[1].split(":")[0]
            assert replies[1].endswith(f"hello {n}.1\n")
        await asyncio.sleep(0.05)
        assert sum(seen.values()) == 20 and min(seen.values()) >= 4  # both got a share
    finally:
        task.cancel()
        for server in servers:
            server.close()


def test_round_robin_alternates() -> None:
    pick = picker("round-robin", [1, 2, 3])
    assert [pick() for _ in range(5)] == [1, 2, 3, 1, 2]


def cell(frontend: str, goodput_requests: int, hits: float) -> Cell:
    summary = summarize([], duration_s=10.0, slo=SLO(2.0, 0.1))
    overall = dataclasses.replace(summary.overall, goodput=goodput_requests / 10)
    return Cell(frontend, 8.0, dataclasses.replace(summary, overall=overall), [],
                prefix_hit_rate=hits)  # fmt: skip


def test_medians_spreads_and_ratios_to_the_single_router() -> None:
    repeats = [
        [cell("x1", 60, 0.50), cell("x2", 40, 0.40)],
        [cell("x1", 80, 0.60), cell("x2", 80, 0.30)],
        [cell("x1", 70, 0.40), cell("x2", 35, 0.40)],
    ]
    result = aggregate(repeats)
    x2 = result["x2 @ 8"]
    assert x2["goodput"]["median"] == 4.0 and (x2["goodput"]["min"], x2["goodput"]["max"]) == (
        3.5,
        8.0,
    )
    assert x2["prefix_hit_rate_vs_single"]["values"] == [0.8, 0.5, 1.0]
    assert x2["prefix_hit_rate_vs_single"]["median"] == 0.8
    assert result["x1 @ 8"]["goodput_vs_single"]["values"] == [1.0, 1.0, 1.0]
    assert "| x2 @ 8 | 4.00 (3.50-8.00) | 40.0% (30.0%-40.0%) | 0.80 (0.50-1.00)" in table(
        "t", result, 3
    )


def test_an_arm_missing_from_a_repeat_is_left_out_of_that_repeat() -> None:
    repeats = [
        [cell("x1", 60, 0.50), cell("x2", 40, 0.40)],
        [cell("x1", 80, 0.60)],  # x2 did not start in this repeat
    ]
    result = aggregate(repeats)
    x2 = result["x2 @ 8"]
    assert x2["runs"] == 1 and x2["goodput"]["values"] == [4.0]
    assert x2["goodput_vs_single"]["values"] == [4.0 / 6.0]
    assert aggregate([[cell("x1", 60, 0.5)], []])["x1 @ 8"]["runs"] == 1
