"""The metrics scraper: one scrape per backend per interval, at its own phase, never bunched."""

from __future__ import annotations

import asyncio
import itertools
import time

from kvstack.router.config import ScrapeConfig
from kvstack.router.fleet.backends import Backend, BackendPool
from kvstack.router.fleet.scraper import MetricsScraper

PAGE = b'vllm:num_requests_running{model_name="toy"} 3.0\n'


class _Client:
    """Answers every scrape with ``PAGE``; ``slow`` backends take ``slow_s`` to answer."""

    def __init__(self, slow: set[str], slow_s: float) -> None:
        self.slow, self.slow_s = slow, slow_s
        self.starts: list[tuple[float, str]] = []
        self.running: dict[str, int] = {}
        self.most_running: dict[str, int] = {}

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        host = url.split("//")[1].split(":")[0]
        self.starts.append((time.monotonic(), host))
        self.running[host] = self.running.get(host, 0) + 1
        self.most_running[host] = max(self.most_running.get(host, 0), self.running[host])
        try:
            await asyncio.sleep(self.slow_s if host in self.slow else 0)
        finally:
            self.running[host] -= 1
        return 200, PAGE


def _scrape(slow: set[str], interval_s: float, run_s: float) -> tuple[_Client, BackendPool]:
    pool = BackendPool()
    pool.apply(Backend(name, f"http://{name}:1") for name in "abcd")
    for state in pool.states():
        state.healthy = True  # the scraper asks healthy backends only
    client = _Client(slow, slow_s=3 * interval_s)

    async def main() -> None:
        scraper = MetricsScraper(pool, client, ScrapeConfig(interval_s=interval_s))  # type: ignore[arg-type]
        await scraper.start()
        await asyncio.sleep(run_s)
        await scraper.close()

    asyncio.run(main())
    return client, pool


def test_scrapes_are_spread_over_the_interval() -> None:
    client, pool = _scrape(set(), interval_s=0.4, run_s=1.0)
    times = [t for t, _ in client.starts]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Four backends, a 0.4 s interval: one start every 0.1 s, never two at once (the old loop
    # started all four within a millisecond).
    assert len(times) >= 8 and min(gaps) > 0.05, gaps
    assert [h for _, h in client.starts[:8]] == list("abcdabcd")
    assert all(s._scrape is not None and s._scrape.running == 3.0 for s in pool.states())


def test_a_slow_backend_delays_no_other_and_is_never_asked_twice_at_once() -> None:
    client, _ = _scrape({"b"}, interval_s=0.2, run_s=1.3)
    counts = {h: sum(1 for _, x in client.starts if x == h) for h in "abcd"}
    assert counts["a"] >= 5 and counts["c"] >= 5 and counts["d"] >= 5, counts
    assert counts["b"] < counts["a"], counts
    assert client.most_running["b"] == 1, client.most_running
