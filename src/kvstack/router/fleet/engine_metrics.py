"""What the router reads from an engine's Prometheus ``/metrics`` page.

Only the few series routing uses are parsed, line by line, so a scrape of vLLM's large page
costs well under a millisecond. Names drift between vLLM versions; each field lists the names
it accepts, newest first (``vllm:kv_cache_usage_perc`` was ``vllm:gpu_cache_usage_perc``).
Samples of one series with several label sets (several engines, model names) are summed for
counts and maxed for utilisation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ScrapedMetrics", "parse_engine_metrics"]

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc")
LORA_INFO = ("vllm:lora_requests_info",)
CACHE_CONFIG = ("vllm:cache_config_info",)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
_WANTED = RUNNING + WAITING + KV_USAGE + LORA_INFO + CACHE_CONFIG + PREFIX_QUERIES + PREFIX_HITS
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    """One scrape. ``None`` means the engine does not export that series."""

    scraped_at_s: float  # time.monotonic()
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction in [0, 1]
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    max_loras: int | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None

    @property
    def num_requests(self) -> float:
        """Running plus waiting (0 for a series the engine does not export)."""
        return (self.running or 0.0) + (self.waiting or 0.0)


def parse_engine_metrics(text: str, scraped_at_s: float) -> ScrapedMetrics:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        samples.setdefault(match.group(1), []).append((labels, value))
    lora = _latest(samples, LORA_INFO)
    cache = _latest(samples, CACHE_CONFIG)
    return ScrapedMetrics(
        scraped_at_s=scraped_at_s,
        running=_total(samples, RUNNING),
        waiting=_total(samples, WAITING),
        kv_usage=_peak(samples, KV_USAGE),
        running_adapters=_names(lora.get("running_lora_adapters", "")),
        waiting_adapters=_names(lora.get("waiting_lora_adapters", "")),
        max_loras=_int(lora.get("max_lora")),
        block_size=_int(cache.get("block_size")),
        num_gpu_blocks=_int(cache.get("num_gpu_blocks")),
        prefix_cache_queries=_total(samples, PREFIX_QUERIES),
        prefix_cache_hits=_total(samples, PREFIX_HITS),
    )


def _first(
    samples: dict[str, list[tuple[dict[str, str], float]]], names: tuple[str, ...]
) -> list[tuple[dict[str, str], float]]:
    for name in names:
        if name in samples:
            return samples[name]
    return []


def _total(
    samples: dict[str, list[tuple[dict[str, str], float]]], names: tuple[str, ...]
) -> float | None:
    found = _first(samples, names)
    return sum(v for _, v in found) if found else None


def _peak(
    samples: dict[str, list[tuple[dict[str, str], float]]], names: tuple[str, ...]
) -> float | None:
    found = _first(samples, names)
    return max(v for _, v in found) if found else None


def _latest(
    samples: dict[str, list[tuple[dict[str, str], float]]], names: tuple[str, ...]
) -> dict[str, str]:
    """Info gauges: vLLM keeps one label set per change, valued by its timestamp; take the last."""
    found = _first(samples, names)
    return max(found, key=lambda s: s[1])[0] if found else {}


def _names(csv: str) -> tuple[str, ...]:
    return tuple(sorted(n for n in csv.split(",") if n))


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        return None
