"""``kvstack bench vllm --scenario overhead | pipelining``: paired, interleaved comparisons.

The engines of a comparison run side by side and take turns, one request at a time, in an
order that rotates every round (A B C, B C A, C A B, ...), so slow phases of a shared machine
hit every arm alike. Each round yields one ratio per arm against the first arm; reported: per
arm the median TTFT, and the median, min and max of the per-round ratios with a 95% interval
of their median.

Before every measurement the machine is let settle (:func:`settle`): what one arm leaves
running after its request (the connector's tier writes, checksums, the kernel writing dirty
pages back) would otherwise land on the next arm's request. Without it, plain vLLM's TTFT
after a connector request read about 0.6 s longer than after its own (1.6 s against 1.0 s,
2,048-token prompts), which made the connector look 17% faster than plain vLLM. How long each
arm's aftermath took to settle is reported beside its TTFT (``settle_s``): that background
work is a cost the TTFT does not show.

The interval is distribution-free (:func:`median_interval`): the order statistics
``x(k)`` and ``x(n+1-k)`` of the ``n`` sorted ratios, with the largest ``k`` for which
``P(Binomial(n, 1/2) < k) <= 2.5%``; it covers the median ratio with probability at least 95%
whatever the ratios' distribution, as long as rounds are independent. It needs at least 6
rounds (with fewer there is none, and no overhead claim can be made); 40 rounds give
``x(14)``-``x(27)``.

- **overhead**: unique prompts (no reuse anywhere): plain vLLM, the connector with its defaults
  (copy-out on the step on the CPU build), the connector with ``copy_out: background``.
- **pipelining**: a hit in the connector's CPU tier after vLLM dropped its own cache (a load
  within the step), without and with ``layer_pipelining``; and what pipelined saves cost on
  unique prompts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvstack.bench.micro.vllm_harness import Engines, metric_value, spread, stream_ttft
from kvstack.bench.micro.vllm_probe import PromptFactory, reset_prefix_cache
from kvstack.stack.vllm_server import VLLMServer, connector_config

__all__ = ["median_interval", "overhead", "pipelining", "settle"]

Arms = dict[str, dict[str, Any] | None]
SETTLE_BUSY = 0.25  # the machine is quiet below this share of all CPUs busy (or waiting on I/O)
SETTLE_WINDOW_S = 0.25
SETTLE_TIMEOUT_S = 20.0


def overhead(
    engines: Engines, prompts: PromptFactory, tokens: int, rounds: int, background: bool = True
) -> dict[str, Any]:
    """Plain vLLM against the connector (and, with ``background``, ``copy_out: background``)."""
    tiers = ["cpu://?size=2GiB", f"file://{engines.work / 'overhead-kv'}?size=20GiB"]
    arms: Arms = {"plain_vllm": None, "kvstack": connector_config(tiers, chunk_size=256)}
    if background:
        arms["kvstack_copy_out_background"] = connector_config(
            [t.replace("overhead-kv", "overhead-kv-bg") for t in tiers],
            chunk_size=256, copy_out="background",
        )  # fmt: skip
    return _paired(engines, arms, rounds, lambda e, r: stream_ttft(e, prompts(tokens))) | {
        "prompt_tokens": tokens
    }


def pipelining(
    engines: Engines, prompts: PromptFactory, tokens: int, rounds: int
) -> dict[str, Any]:
    arms: Arms = {
        "layer_pipelining_off": connector_config(
            ["cpu://?size=4GiB"], chunk_size=256, layer_pipelining=False
        ),
        "layer_pipelining_on": connector_config(
            ["cpu://?size=4GiB"], chunk_size=256, layer_pipelining=True
        ),
    }
    shared: dict[int, list[int]] = {}

    def hit(engine: VLLMServer, round_: int) -> float:
        prompt = shared.setdefault(round_, prompts(tokens))
        stream_ttft(engine, prompt)  # computed (and saved with this arm's copy-out)
        reset_prefix_cache(engine)
        return stream_ttft(engine, prompt)  # loaded from the CPU tier within the step

    return _paired(engines, arms, rounds, hit) | {"prompt_tokens": tokens}


def _paired(
    engines: Engines,
    arms: Arms,
    rounds: int,
    measure: Callable[[VLLMServer, int], float],
) -> dict[str, Any]:
    names = list(arms)
    samples: dict[str, list[float]] = {n: [] for n in names}
    with engines.engines(arms) as servers:
        for server in servers.values():
            stream_ttft(server, [11] * 64)  # warm-up
        settled: dict[str, list[float]] = {n: [] for n in names}
        previous = None
        for r in range(rounds):
            for name in _rotated(names, r):
                waited = settle()
                if previous is not None:
                    settled[previous].append(waited)
                samples[name].append(measure(servers[name], r))
                previous = name
        time.sleep(1.5)  # the last step's stats reach /metrics
        connector = {n: _connector_figures(servers[n]) for n in names if arms[n] is not None}
    base = samples[names[0]]
    out: dict[str, Any] = {"rounds": rounds, "samples_s": samples, "connector": connector}
    for name in names:
        out[name] = {
            "ttft_s": spread(samples[name]).as_dict(),
            "settle_s": spread(settled[name]).as_dict(),
        }
        if name != names[0]:
            ratios = [mine / theirs for mine, theirs in zip(samples[name], base, strict=True)]
            out[name]["ratio_to_" + names[0]] = spread(ratios).as_dict() | {
                "interval95": median_interval(ratios)
            }
    return out


def median_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any] | None:
    """A distribution-free interval for the median of ``values`` (see the module docstring).

    Returns ``low``, ``high``, the order-statistic rank ``k`` (1-based) and the interval's
    exact ``coverage`` (at least ``confidence``); None when there are too few values.
    """
    xs, n = sorted(values), len(values)
    alpha = (1 - confidence) / 2
    below, k = 0.0, 0  # below = P(Binomial(n, 1/2) <= k - 1)
    for j in range(n + 1):
        p = below + math.comb(n, j) / 2**n
        if p > alpha:
            break
        below, k = p, j + 1
    if k == 0:
        return None
    return {
        "low": xs[k - 1], "high": xs[n - k], "k": k, "n": n,
        "coverage": 1 - 2 * below, "method": "order statistics (binomial)",
    }  # fmt: skip


def _connector_figures(server: VLLMServer) -> dict[str, float]:
    """How long the step spent on copy-outs and loads, and how long finished requests' blocks
    were held for background copy-outs (the memory cost of ``copy_out: background``)."""
    figures = {}
    for name in ("save_seconds", "load_seconds", "hold_seconds"):
        total = metric_value(server, f"kvstack_connector_{name}_sum")
        count = metric_value(server, f"kvstack_connector_{name}_count")
        figures[f"{name}_total"] = total
        figures[f"{name}_mean_ms"] = 1000 * total / count if count else 0.0
    figures["held_requests"] = metric_value(server, "kvstack_connector_held_requests_total")
    return figures


def settle(
    busy: float = SETTLE_BUSY,
    window_s: float = SETTLE_WINDOW_S,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> float:
    """Wait until the whole machine was quiet for one ``window_s`` (under ``busy`` of its CPU
    time busy or waiting on I/O, from ``/proc/stat``), at most ``timeout_s``; seconds waited.
    Where there is no ``/proc/stat``, one window."""
    start = time.perf_counter()
    before = _cpu_times()
    while True:
        time.sleep(window_s)
        after = _cpu_times()
        if before is None or after is None:
            break
        total = sum(after) - sum(before)
        idle = after[3] - before[3]  # idle only: iowait counts as busy (writeback is not done)
        if total <= 0 or (total - idle) / total < busy:
            break
        if time.perf_counter() - start >= timeout_s:
            break
        before = after
    return time.perf_counter() - start


def _cpu_times() -> list[int] | None:
    try:
        line = Path("/proc/stat").read_text().split("\n", 1)[0]
    except OSError:
        return None
    return [int(x) for x in line.split()[1:9]]


def _rotated(names: Sequence[str], round_: int) -> list[str]:
    shift = round_ % len(names)
    return list(names[shift:]) + list(names[:shift])
