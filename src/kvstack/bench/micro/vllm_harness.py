"""What the ``kvstack bench vllm`` scenarios share: engines, streamed decodes, summaries.

- :class:`Engines` starts vLLM OpenAI servers (CPU build) on one model, each with its own log;
- :class:`DecodeStreams` keeps N greedy decodes streaming on threads and records when each of
  their tokens arrived, so a scenario can ask for the inter-token gaps that ended in a window;
- :func:`spread` summarises repeated measurements as median, min and max; every percentile is
  :func:`kvstack.bench.load.stats.percentile`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvstack.bench.load.stats import percentile
from kvstack.bench.micro.shared_tiers import redis_server
from kvstack.kv.tiers.file.chunkfile import SUFFIX as CHUNK_FILE_SUFFIX
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec

__all__ = [
    "DecodeStreams",
    "Engines",
    "Spread",
    "completion",
    "drop_page_cache",
    "evict_page_cache",
    "histogram_itl",
    "itl",
    "itl_counts",
    "itl_engine_args",
    "metric_value",
    "redis_server",
    "scrape",
    "spread",
    "stream_ttft",
]


@dataclass
class Engines:
    model: Path
    work: Path
    max_model_len: int = 16384
    kv_cache_space_gib: int = 2

    def _server(
        self,
        name: str,
        kv_transfer: dict[str, Any] | None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> VLLMServer:
        spec = VLLMServerSpec(
            model=str(self.model),
            port=free_port(),
            served_model_name="bench",
            max_model_len=self.max_model_len,
            kv_cache_space_gib=self.kv_cache_space_gib,
            kv_transfer_config=kv_transfer,
            extra_args=list(extra_args),
            env={"VLLM_SERVER_DEV_MODE": "1", **(env or {})},
        )
        return VLLMServer(spec, self.work / f"{name}.log", start_timeout_s=900)

    @contextlib.contextmanager
    def engine(
        self,
        name: str,
        kv_transfer: dict[str, Any] | None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Iterator[VLLMServer]:
        server = self._server(name, kv_transfer, extra_args, env)
        print(f"  starting {name} ...", flush=True)
        server.start()
        try:
            yield server
        finally:
            server.stop()

    @contextlib.contextmanager
    def engines(self, arms: Mapping[str, dict[str, Any] | None]) -> Iterator[dict[str, VLLMServer]]:
        """One engine per arm, all booting at once: a boot is mostly one core importing and
        initialising, so two boot in about the time of one. Nothing is measured during boots."""
        servers = {name: self._server(name, kv) for name, kv in arms.items()}
        print(f"  starting {', '.join(servers)} ...", flush=True)
        try:
            for server in servers.values():
                server.launch()
            for server in servers.values():
                server.wait_ready()
            yield servers
        finally:
            for server in servers.values():
                server.stop()


def _body(server: VLLMServer, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
    return {
        "model": server.model_name,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def completion(server: VLLMServer, prompt: Sequence[int], max_tokens: int) -> list[int]:
    """The generated token ids of a greedy completion."""
    body = _body(server, prompt, max_tokens)
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=900)
    response.raise_for_status()
    ids: list[int] = response.json()["choices"][0]["token_ids"]
    return ids


def stream_ttft(
    server: VLLMServer, prompt: Sequence[int], max_tokens: int = 2, **extra: Any
) -> float:
    """Seconds from sending a streamed completion to its first token (read to the end);
    ``extra``: more fields of the request body."""
    body = {**_body(server, prompt, max_tokens), "stream": True, **extra}
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and '"text"' in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without a token")
    return first


@dataclass
class _Stream:
    arrivals: list[float] = field(default_factory=list)
    error: str | None = None


class DecodeStreams:
    """``len(prompts)`` streamed greedy decodes that run until :meth:`stop`."""

    def __init__(self, server: VLLMServer, prompts: Sequence[Sequence[int]], max_tokens: int):
        self._server, self._max_tokens = server, max_tokens
        self._stop = threading.Event()
        self._streams = [_Stream() for _ in prompts]
        self._threads = [
            threading.Thread(target=self._run, args=(p, s), daemon=True)
            for p, s in zip(prompts, self._streams, strict=True)
        ]

    def __enter__(self) -> DecodeStreams:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, prompt: Sequence[int], record: _Stream) -> None:
        body = {**_body(self._server, prompt, self._max_tokens), "stream": True}
        url = f"{self._server.url}/v1/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=900) as response:
                for line in response.iter_lines():
                    if line.startswith("data:") and '"text"' in line:
                        record.arrivals.append(time.perf_counter())
                    if self._stop.is_set():
                        return  # closing the stream aborts the request
        except httpx.HTTPError as exc:  # reported with the results, never silently dropped
            record.error = repr(exc)

    def wait_running(self, tokens_each: int, timeout_s: float = 600.0) -> None:
        """Block until every decode has streamed ``tokens_each`` tokens (prefill is over)."""
        deadline = time.monotonic() + timeout_s
        while any(len(s.arrivals) < tokens_each for s in self._streams):
            if time.monotonic() > deadline or any(s.error for s in self._streams):
                raise RuntimeError(f"decodes did not start: {self.errors()}")
            time.sleep(0.05)

    def gaps(self, start: float, end: float) -> list[float]:
        """Inter-token gaps (seconds) of every decode that ended within ``[start, end)``."""
        out: list[float] = []
        for stream in self._streams:
            times = stream.arrivals
            out += [b - a for a, b in itertools.pairwise(times) if start <= b < end]
        return out

    def errors(self) -> list[str]:
        return [s.error for s in self._streams if s.error]


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of repeated measurements."""
    if not values:
        return Spread(float("nan"), float("nan"), float("nan"), 0)
    return Spread(statistics.median(values), min(values), max(values), len(values))


def itl(gaps: Sequence[float]) -> dict[str, float]:
    """ITL p50 and p99 (ms) of a window's gaps."""
    return {
        "p50_ms": 1000 * (percentile(gaps, 50) or float("nan")),
        "p99_ms": 1000 * (percentile(gaps, 99) or float("nan")),
        "samples": len(gaps),
    }


ITL_METRIC = "vllm:inter_token_latency_seconds"


def fine_itl_buckets() -> list[float]:
    """Bounds (s) for vLLM's inter-token-latency histogram fine enough for percentiles: 0.5 ms
    steps to 20 ms, 2 ms to 100 ms, 20 ms to 1 s, then a few to a minute (its defaults start
    at 10 ms and then 25 ms, too coarse for a CPU engine's decode steps)."""
    bounds = [n * 0.0005 for n in range(1, 41)]
    bounds += [0.02 + n * 0.002 for n in range(1, 41)]
    bounds += [0.1 + n * 0.02 for n in range(1, 46)]
    bounds += [1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0]
    return [round(b, 4) for b in bounds]


def itl_engine_args() -> list[str]:
    """``vllm serve`` arguments that give its ITL histogram :func:`fine_itl_buckets`."""
    import json

    return ["--custom-histogram-buckets", json.dumps({"inter_token_latency": fine_itl_buckets()})]


def itl_counts(server: VLLMServer | str, metric: str = ITL_METRIC) -> dict[float, float]:
    """The engine's cumulative ITL histogram now (or in a :func:`scrape`'s text): upper bound
    -> observations at or below it (summed over label sets). vLLM times each token with the
    engine core's own timestamp of the step that made it, so these gaps are the engine's, not
    the HTTP stream's: a client that reads two tokens from one network read saw a 0 ms gap
    where the engine took a step. ``metric``: another histogram read the same way."""
    counts: dict[float, float] = {}
    for sample in _samples(server, f"{metric}_bucket"):
        bound = float(sample.labels["le"])
        counts[bound] = counts.get(bound, 0.0) + sample.value
    return counts


def histogram_itl(before: Mapping[float, float], after: Mapping[float, float]) -> dict[str, float]:
    """ITL p50 and p99 (ms) of the observations made between two :func:`itl_counts`, each
    interpolated linearly within its bucket (a bucket's width bounds the error)."""
    bounds = sorted(b for b in after if b != float("inf"))
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)

    def quantile(q: float) -> float:
        if total <= 0:
            return float("nan")
        rank, lower, below = q * total, 0.0, 0.0
        for bound, count in zip(bounds, cumulative, strict=True):
            if count >= rank:
                inside = count - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, count
        return bounds[-1] if bounds else float("nan")  # past the last bound: at least that

    return {"p50_ms": 1000 * quantile(0.50), "p99_ms": 1000 * quantile(0.99), "samples": total}


def metric_value(server: VLLMServer | str, name: str) -> float:
    """Sum of the samples called ``name`` on the engine's ``/metrics`` (or in a
    :func:`scrape`'s text)."""
    return float(sum(sample.value for sample in _samples(server, name)))


def scrape(server: VLLMServer) -> str:
    """The engine's ``/metrics`` text now (read several figures from one moment)."""
    return httpx.get(f"{server.url}/metrics", timeout=30).text


def _samples(server: VLLMServer | str, name: str) -> Iterator[Any]:
    """The samples called ``name`` on the engine's ``/metrics`` now, or in a scrape's text."""
    from prometheus_client.parser import text_string_to_metric_families

    text = server if isinstance(server, str) else scrape(server)
    for family in text_string_to_metric_families(text):
        yield from (sample for sample in family.samples if sample.name == name)


def evict_page_cache(root: Path) -> list[Path]:
    """Evict the chunk files under ``root`` from the page cache; returns them."""
    files = [p for p in root.rglob(f"*{CHUNK_FILE_SUFFIX}")]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return files


def drop_page_cache(root: Path) -> int:
    """Evict the chunk files from the page cache; returns the bytes still resident (-1 where
    ``fincore`` cannot tell)."""
    files = evict_page_cache(root)
    if not files or shutil.which("fincore") is None:
        return -1
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files[:200])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return sum(int(line.split()[0]) for line in out.stdout.splitlines() if line.strip())
