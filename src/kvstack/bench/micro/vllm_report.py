"""The published tables of ``kvstack bench vllm``, rendered from its committed results.

Results live in ``benchmarks/results/vllm/``: the default run (``vllm-<day>.json``, scenario
``ttft``) and one file per ``--scenario`` (``vllm-<scenario>-<day>.json``). Each renderer picks
the newest file of its scenario by the scenario recorded inside it, never by the name alone.

- :func:`render` (region ``vllm``): the TTFT table and the connector's overhead with its
  interval, from ``--scenario overhead``;
- :func:`render_scenarios` (region ``vllm-scenarios``): every scenario with a committed result
  (:mod:`kvstack.bench.micro.vllm_report_scenarios`);
- :func:`headline`: the README's rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.micro.vllm_report_scenarios import (
    BAR_OVERHEAD_PCT,
    overhead_verdict,
    pct,
    render_scenarios,
    run_line,
    seconds,
    seconds_range,
    times,
)
from kvstack.bench.micro.vllm_report_scenarios import newest_scenario as _newest
from kvstack.bench.report import table, target
from kvstack.bench.results import Result
from kvstack.models.toy import SMALL

__all__ = ["headline", "render", "render_scenarios"]

PUBLISHED_PROMPT_TOKENS = 8192  # the prompt of the run the docs published before results were files
BAR_CROSS_VS_HIT = 1.5  # cross-instance hit: at most 1.5x vLLM's own prefix hit
BAR_CROSS_VS_COLD = 20  # ... and at most 1/20 of cold

_ROWS = (
    ("cold_s", "cold, plain vLLM"),
    ("vllm_prefix_hit_s", "vLLM prefix hit, same instance"),
    ("kvstack_cold_s", "cold with kvstack (also stores)"),
    ("kvstack_cpu_hit_s", "kvstack CPU tier, after vLLM evicted the blocks"),
    ("kvstack_cross_instance_s", "**kvstack, another instance (shared file tier)**"),
    ("kvstack_disk_restart_s", "kvstack disk tier after a restart, page cache dropped"),
)


def _model(name: str) -> str:
    if name.startswith(SMALL.name):
        s = SMALL
        return (
            f"The ~150M random Llama (hidden {s.hidden_size}, {s.num_layers} layers, "
            f"{s.num_heads} heads, {s.num_kv_heads} KV heads, {s.dtype})"
        )
    return f"The toy model `{name}`"


def _ttft(res: dict[str, Any], key: str) -> str:
    samples = res.get("samples_s", {}).get(key)
    cell = seconds(res[key])
    if samples and len(samples) > 1:
        cell += f" ({seconds_range(min(samples), max(samples))})"
    return cell


def _cross_targets(res: dict[str, Any]) -> tuple[float, float, str]:
    v, hit, cold = res["kvstack_cross_instance_s"], res["vllm_prefix_hit_s"], res["cold_s"]
    cell = (
        target(v / hit <= BAR_CROSS_VS_HIT, f"≤ {BAR_CROSS_VS_HIT:g}× vLLM's hit")
        + "; "
        + target(cold / v >= BAR_CROSS_VS_COLD, f"≤ 1/{BAR_CROSS_VS_COLD} of cold")
    )
    return v / hit, cold / v, cell


def _ttft_rows(res: dict[str, Any]) -> list[tuple[str, ...]]:
    hit, cold = res["vllm_prefix_hit_s"], res["cold_s"]
    rows: list[tuple[str, ...]] = []
    for key, label in _ROWS:
        if key not in res:
            continue
        v, bar = res[key], ""
        if key == "kvstack_cross_instance_s":
            bar = _cross_targets(res)[2]
        vs_cold = (
            "1" if key == "cold_s" else f"1/{cold / v:.1f}" if v * 2 < cold else times(v / cold)
        )
        rows.append((label, _ttft(res, key), times(v / hit), vs_cold, bar))
    return rows + _example_rows(res)


def _example_rows(res: dict[str, Any]) -> list[tuple[str, ...]]:
    ex = res.get("example_connector", {})
    rows: list[tuple[str, ...]] = []
    failed = ex.get("failed", [])
    if failed:
        lengths = " / ".join(f"{f['prompt_tokens']:,}" for f in failed)
        why = failed[0]["error"].replace("|", "/")[:80]
        rows.append((f"vLLM ExampleConnector at {lengths} tokens", f"fails (`{why}`)", "", "", ""))
    if "prompt_tokens" in ex:
        k = res.get("kvstack_at_example_length", {})
        rows.append((
            f"ExampleConnector at {ex['prompt_tokens']:,} tokens: cold / hit",
            f"{seconds(ex['cold_s'])} / {seconds(ex['hit_s'])}",
            f"kvstack at {ex['prompt_tokens']:,}: {seconds(k['cold_s'])} / {seconds(k['hit_s'])}"
            if k else "",
            "", "",
        ))  # fmt: skip
    return rows


def _setup(r: Result) -> str:
    res = r.result
    n, reps = res["prompt_tokens"], res["reps"]
    text = (
        f"{_model(res.get('model', ''))} on vLLM's CPU build, one {n:,}-token prompt of random "
        f"tokens per sample, median of {reps} (min–max in brackets)"
    )
    if n < PUBLISHED_PROMPT_TOKENS:
        text += (
            f"; a shorter prompt than the {PUBLISHED_PROMPT_TOKENS:,} tokens of the figures "
            "published before results were kept as files"
        )
    if "example" in res.get("args", {}).get("skip", []):
        text += "; the ExampleConnector rows were skipped (`--skip example`)"
    text += ". The cross-instance engine starts after the engine that stored the chunks "
    text += (
        "stopped" if res.get("cross_instance_storing_engine") == "stopped" else "(still running)"
    )
    return text + ", so it has the machine's cores to itself"


def _overhead_text(results: Path) -> list[str]:
    r = _newest(results, "overhead")
    if r is None:
        return [
            "Connector overhead on unique prompts: no committed result of "
            f"`kvstack bench vllm --scenario overhead`: ≤ {BAR_OVERHEAD_PCT:g}% not shown."
        ]
    res = r.result
    ratio = res["kvstack"]["ratio_to_plain_vllm"]
    cell = overhead_verdict(ratio)[1]
    ci = ratio.get("interval95")
    interval = (
        f"95% interval {pct(ci['low'])} to {pct(ci['high'])}, order statistics "
        f"x({ci['k']})–x({ci['n'] + 1 - ci['k']}) of {ci['n']}"
        if ci
        else "too few rounds for an interval"
    )
    return [
        f"Connector overhead on unique prompts (no reuse), {res['prompt_tokens']:,} tokens each: "
        f"{res['rounds']} paired rounds, plain vLLM and kvstack taking turns in rotating order; "
        f"kvstack's TTFT over plain vLLM's, median {pct(ratio['median'])} ({interval}). "
        f"Target: {cell}.",
        "",
        run_line(r),
    ]


def render(results: Path) -> str:
    r = _newest(results, "ttft")
    if r is None:
        return "_No committed result of `kvstack bench vllm` yet._\n\n" + "\n".join(
            _overhead_text(results)
        )
    rows = _ttft_rows(r.result)
    headers = ("scenario", "TTFT", "vs vLLM's own hit", "vs cold", "target")
    out = [run_line(r), "", _setup(r) + ":", "", table(headers, rows, "lrrrl"), ""]
    return "\n".join(out + _overhead_text(results))


def headline(results: Path) -> list[tuple[str, str, str]]:
    """README rows: cold / vLLM hit, cross-instance hit, disk after restart, overhead."""
    rows: list[tuple[str, str, str]] = []
    r = _newest(results, "ttft")
    if r is not None:
        res, cmd = r.result, r.command
        n, hit = res["prompt_tokens"], res["vllm_prefix_hit_s"]
        rows.append((
            f"vLLM TTFT, {n:,}-token prompt: cold / vLLM's own prefix hit",
            f"{seconds(res['cold_s'])} / {seconds(hit)}", cmd,
        ))  # fmt: skip
        if "kvstack_cross_instance_s" in res:
            vs_hit, vs_cold, cell = _cross_targets(res)
            rows.append((
                "kvstack hit on another instance (shared file tier, storing engine stopped)",
                f"{seconds(res['kvstack_cross_instance_s'])} = {vs_hit:.2f}× vLLM's hit, "
                f"1/{vs_cold:.1f} of cold ({cell})", cmd,
            ))  # fmt: skip
        if "kvstack_disk_restart_s" in res:
            v = res["kvstack_disk_restart_s"]
            rows.append((
                "kvstack disk tier after a restart, page cache dropped",
                f"{seconds(v)} = {v / hit:.2f}× vLLM's hit", cmd,
            ))  # fmt: skip
    o = _newest(results, "overhead")
    if o is not None:
        ratio = o.result["kvstack"]["ratio_to_plain_vllm"]
        ci = ratio.get("interval95")
        interval = f" (95% interval {pct(ci['low'])} to {pct(ci['high'])})" if ci else ""
        rows.append((
            f"connector overhead, TTFT on unique prompts, {o.result['rounds']} paired rounds",
            f"{pct(ratio['median'])}{interval}; {overhead_verdict(ratio)[1]}", o.command,
        ))  # fmt: skip
    return rows
