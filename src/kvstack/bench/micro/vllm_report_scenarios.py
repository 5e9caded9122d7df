"""The ``kvstack bench vllm --scenario …`` tables, rendered from their committed results.

Shared with :mod:`kvstack.bench.micro.vllm_report`: how a result of one scenario is found
(:func:`newest_scenario`), how figures are written, and the overhead verdict: the ≤ 5% target
is met only when the upper end of the 95% interval of the median ratio is within it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table, target
from kvstack.bench.results import Result, load
from kvstack.models.toy import SMALL, TINY

__all__ = [
    "BAR_OVERHEAD_PCT",
    "INTERFERENCE_ARMS",
    "in_flight_key",
    "newest_scenario",
    "overhead_verdict",
    "pct",
    "render_scenarios",
    "run_line",
    "seconds",
    "seconds_range",
    "times",
]

BAR_OVERHEAD_PCT = 5.0  # the connector may cost at most 5% TTFT on prompts it cannot help
BAR_ASYNC_ITL_P99 = 1.25  # decodes' ITL p99 during async loads: at most 1.25x without loads
BAR_ASYNC_TTFT = 1.10  # the loading request's TTFT with async loads: at most 1.10x sync's
INTERFERENCE_ARMS = ("recompute", "vllm-hit", "file/sync", "file/async", "file/auto", "redis/sync",
                     "redis/async", "redis/auto")  # fmt: skip
BAR_TURN_TWO_SHARE = 0.90  # turn two on another instance: at least 90% from the tiers


def newest_scenario(results: Path, scenario: str) -> Result | None:
    """The newest ``vllm`` result whose recorded scenario is ``scenario`` (``ttft``: default)."""
    folder = results / "vllm"
    found = [load(p) for p in sorted(folder.glob("vllm-*.json"))] if folder.is_dir() else []
    mine = [r for r in found if r.result.get("scenario", "ttft") == scenario]
    return max(mine, key=lambda r: r.measured, default=None)


def _sig3(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def run_line(r: Result) -> str:
    """:func:`stale_line`, and the machine's other load when it was busier than its cores."""
    text, m = stale_line(r), r.machine
    load, cores = m.get("load_average"), m.get("cores")
    if load is not None and cores and load > cores:
        text += (
            f" The 1-minute load average was {load:g} on {cores} cores when the run ended (the "
            "run's own engines count in it, as does any other work), so absolute times may be "
            "longer than with one engine on an idle machine."
        )
    return text


def seconds(x: float, unit: bool = True) -> str:
    """Seconds to three significant digits (``1.60 s``, ``36.2 s``), in ms below a second."""
    text = f"{_sig3(x)} s" if x >= 1 else f"{_sig3(x * 1000)} ms"
    return text if unit else text.rsplit(" ", 1)[0]


def times(ratio: float) -> str:
    """A ratio as ``1.45×`` (``32.7×`` from ten up)."""
    return f"{ratio:.1f}×" if ratio >= 10 else f"{ratio:.2f}×"


def pct(ratio: float) -> str:
    """A ratio as a signed percentage change: ``1.023`` -> ``+2.3%``."""
    return f"{(ratio - 1) * 100:+.1f}%".replace("-", "−")


def overhead_verdict(ratio: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``ratio`` (median and ``interval95`` of per-round ratios) shows ≤ 5%, and the
    target cell: met only if the interval's upper end is within the bar."""
    bar, limit = f"≤ {BAR_OVERHEAD_PCT:g}%", 1 + BAR_OVERHEAD_PCT / 100
    ci = ratio.get("interval95")
    if ci is None:
        return False, target(False, bar) + " (not shown: too few rounds for a 95% interval)"
    if ci["high"] <= limit:
        return True, target(True, bar)
    if ci["low"] > limit:
        return False, target(False, bar)
    return False, target(False, bar) + f" (not shown: the interval reaches {pct(ci['high'])})"


def seconds_range(low: float, high: float) -> str:
    """``1.00–3.00 s``; both units when the range crosses a second (``850 ms–1.20 s``)."""
    same = (low >= 1) == (high >= 1)
    return f"{seconds(low, unit=not same)}–{seconds(high)}"


def _spread(s: dict[str, float], fmt: Callable[[float], str] = num) -> str:
    if fmt is seconds:
        return f"{seconds(s['median'])} ({seconds_range(s['min'], s['max'])})"
    dash = " to " if fmt is pct else "–"  # "−10.0%–+12.0%" reads badly
    return f"{fmt(s['median'])} ({fmt(s['min'])}{dash}{fmt(s['max'])})"


def _ratio_cells(ratio: dict[str, Any]) -> tuple[str, str]:
    ci = ratio.get("interval95")
    interval = f"{pct(ci['low'])} to {pct(ci['high'])}" if ci else "none (too few rounds)"
    return _spread(ratio, pct), interval


def _overhead(res: dict[str, Any]) -> tuple[str, str]:
    rows = [("plain vLLM", _spread(res["plain_vllm"]["ttft_s"], seconds), "", "", "")]
    for arm, label in (
        ("kvstack", "kvstack (defaults)"),
        ("kvstack_copy_out_background", "kvstack, `copy_out: background`"),
    ):
        if arm in res:
            ratio = res[arm]["ratio_to_plain_vllm"]
            verdict = overhead_verdict(ratio)[1]
            ttft = _spread(res[arm]["ttft_s"], seconds)
            rows.append((label, ttft, *_ratio_cells(ratio), verdict))
    intro = (
        f"TTFT on unique {res['prompt_tokens']:,}-token prompts, {res['rounds']} paired rounds "
        "(the engines take turns in rotating order); the change is each round's TTFT over plain "
        "vLLM's in the same round, with a distribution-free 95% interval of its median:"
    )
    headers = ("arm", "TTFT median (min–max)", "change (min–max)", "95% interval", "target")
    return intro, table(headers, rows, "lrrrl")


def _pipelining(res: dict[str, Any]) -> tuple[str, str]:
    rows = [("layer pipelining off", _spread(res["layer_pipelining_off"]["ttft_s"], seconds))]
    on = res["layer_pipelining_on"]
    rows.append(("layer pipelining on", _spread(on["ttft_s"], seconds)))
    ratio = on["ratio_to_layer_pipelining_off"]
    intro = (
        f"CPU-tier hit TTFT of {res['prompt_tokens']:,}-token prompts after vLLM dropped its "
        f"own cache, {res['rounds']} paired rounds; pipelining on over off: median "
        f"{_ratio_cells(ratio)[0]}, 95% interval {_ratio_cells(ratio)[1]}:"
    )
    return intro, table(("arm", "hit TTFT median (min–max)"), rows, "lr")


def _async_targets(res: dict[str, Any], arm: str) -> str:
    """The async arm's bars: decodes' ITL p99 ratio, and its TTFT against the sync arm's."""
    tier, _, mode = arm.partition("/")
    if mode not in ("async", "auto"):
        return ""
    a, sync = res[arm], res.get(f"{tier}/sync")
    cells = [target(a["p99_ratio"]["median"] <= BAR_ASYNC_ITL_P99,
                    f"ITL p99 ≤ {BAR_ASYNC_ITL_P99:g}× before")]  # fmt: skip
    steps = a.get("steps_in_flight_p99_ratio")
    if steps is not None:  # context beside the bar: the window without the loader's own step
        rounds = a["steps_in_flight_rounds"]
        cells.append(
            f"decode steps while the load was in flight {times(steps['median'])} before, "
            f"timed by the connector ({rounds} rounds)"
        )
    paired, engine = a.get("ttft_vs_sync"), a.get("engine_ttft_vs_sync")
    if paired is not None:  # rounds alternating with sync's on one engine: pair by pair
        # the engine's own TTFT where the result has it, the client's beside it
        shown, how, client = (
            (engine, " as the engine timed it", f"; the client's {times(paired['median'])}")
            if engine is not None else (paired, "", "")
        )  # fmt: skip
        ratio = shown["median"]
        cells.append(target(
            ratio <= BAR_ASYNC_TTFT,
            f"TTFT {times(ratio)} sync's{how}, pair by pair ({times(shown['min'])}–"
            f"{times(shown['max'])}{client}), ≤ {BAR_ASYNC_TTFT:g}×",
        ))  # fmt: skip
    elif sync is not None:  # engines of their own: medians, the engine's where both have it
        both = "engine_ttft_s" in a and "engine_ttft_s" in sync
        key, how = ("engine_ttft_s", " as the engines timed it") if both else ("ttft_s", "")
        ratio = a[key]["median"] / sync[key]["median"]
        cells.append(target(
            ratio <= BAR_ASYNC_TTFT, f"TTFT {times(ratio)} sync's{how}, ≤ {BAR_ASYNC_TTFT:g}×"
        ))  # fmt: skip
    hit = res.get("vllm-hit")
    if hit is not None:  # context, not a bar: the same window for vLLM's own hit
        ratio = a["loading_p99_ms"]["median"] / hit["loading_p99_ms"]["median"]
        cells.append(f"ITL p99 during {times(ratio)} vLLM's own hit's")
    return "; ".join(cells)


def _itl_source(res: dict[str, Any]) -> str:
    arms = [res[a] for a in INTERFERENCE_ARMS if a in res]
    if arms and all(a.get("itl_source") == "engine" for a in arms):
        return ("Decode ITLs are the engine's own step times (vLLM's inter-token latency "
                "histogram, 0.5 ms buckets below 20 ms):")  # fmt: skip
    return ("Decode ITLs are the gaps between streamed chunks as the client read them; a "
            "client that reads several tokens at once sees 0 ms gaps:")  # fmt: skip


def _interference(res: dict[str, Any]) -> tuple[str, str]:
    rows = []
    for arm in INTERFERENCE_ARMS:
        a = res.get(arm)
        if a is None:
            continue
        rows.append((
            arm, _spread(a["ttft_s"], seconds),
            f"{num(a['quiet_p50_ms']['median'])} / {num(a['quiet_p99_ms']['median'])}",
            f"{num(a['loading_p50_ms']['median'])} / {num(a['loading_p99_ms']['median'])}",
            _spread(a["p99_ratio"], times),
            _spread(a[key], times) if (key := in_flight_key(a)) else "",
            _steps(a, res.get("decodes", 4)),
            _load_time(a.get("load_breakdown")),
            str(len(a.get("errors", []))),
            _async_targets(res, arm),
        ))  # fmt: skip
    intro = (
        f"Four streamed decodes; one request at a time loads {_a(res['prefix_tokens'])}-token "
        f"prefix from a slow tier (file tier with its page cache dropped, or Redis), "
        f"{res['rounds']} rounds per arm; `recompute` is plain vLLM computing the prefix, "
        f"`vllm-hit` plain vLLM with the prefix already in its own prefix cache (what any hit "
        f"costs the decodes: the hit request's first step, its suffix attending to the whole "
        f"prefix, runs in their batch), `auto` the default load mode (it picks sync or async "
        f"by measured cost). "
        + _pairing(res)
        + _run_settings(res)
        + _in_flight(res)
        + '"Steps" are the engine steps taken while the loader waited for its first token '
        "(the decodes' tokens in that window over the number of decodes: each decode makes "
        "one token a step). " + _itl_source(res)
    )
    headers = ("arm", "loader TTFT (min–max)", "decode ITL p50 / p99 ms, before",
               "during the load", "p99 during / before (min–max)",
               "p99 while the load is in flight / before", "steps (min–max)",
               "load ms: in the step / fetch off it / till reported", "stream errors",
               "target")  # fmt: skip
    return intro, table(headers, rows, "lrrrrrrrrl")


def _a(count: int) -> str:
    """``a 2,048``, ``an 8,192``, ``an 11,000``: the article as the number is said."""
    said = f"{count:,}"
    vowel = said.startswith("8") or said.partition(",")[0] in ("11", "18")
    return f"{'an' if vowel else 'a'} {said}"


def in_flight_key(arm: dict[str, Any]) -> str | None:
    """The arm's in-flight ratio: the connector's step timing where the result has it, else
    the polled window's."""
    for key in ("steps_in_flight_p99_ratio", "in_flight_p99_ratio"):
        if key in arm:
            return key
    return None


def _any_arm(res: dict[str, Any], key: str) -> bool:
    return any(key in res.get(a, {}) for a in INTERFERENCE_ARMS)


def _in_flight(res: dict[str, Any]) -> str:
    """How the in-flight window was found: the connector's step timing (newer results), or
    scrapes every ``--poll-s`` (results before it scraped every 50 ms)."""
    if _any_arm(res, "steps_in_flight_p99_ratio"):
        return ("\"In flight\" is timed by the connector's scheduler side: the intervals "
                "between engine steps that both ran a decode, with an asynchronous load in "
                "flight (planned and not yet reported done), over the same intervals in the "
                "quiet window before (their p99 each, the median of the rounds' ratios; the "
                "rounds whose load was asynchronous). vLLM's own ITL histogram cannot split "
                "its steps so; the loader's own first step is not in that window. `/metrics` "
                "was not scraped during the rounds (each scrape costs a small host's API "
                "server tens of ms). ")  # fmt: skip
    poll_s = res.get("args", {}).get("poll_s", 0.05)
    if poll_s > 0:
        every = f"{poll_s * 1000:.0f} ms"
        return (f'"In flight" ends when the engine\'s `/metrics`, scraped every {every}, '
                "first counts the asynchronous load finished. ")  # fmt: skip
    return ("`/metrics` was not scraped during the rounds (each scrape costs a small host's "
            'API server tens of ms), so there is no "in flight" window. ')  # fmt: skip


def _run_settings(res: dict[str, Any]) -> str:
    """The opt-in wait at a step's end (``--finish-wait``), the file tier's reader threads
    (``--file-readers``) and the fetch helper (``--load-fetch``), where the run set them."""
    args = res.get("args", {})
    wait, readers = args.get("finish_wait", 0.0), args.get("file_readers", 0)
    said = ""
    if args.get("load_fetch", "thread") == "process":
        said += ("Every kvstack engine ran with `load_fetch: process` (asynchronous loads read "
                 "by the opt-in fetch helper process, off the worker's interpreter lock; the "
                 "default reads them on the worker's threads). ")  # fmt: skip
    if wait:
        said += (f"Every kvstack engine ran with `load_finish_wait: {wait:g}` (the opt-in wait "
                 "at a step's end for a load about to finish; off by default). ")  # fmt: skip
    if readers:
        said += (f"The file tier's engines read with `readers={readers}` (threads in vLLM's "
                 "worker process; the tier's default is 4). ")  # fmt: skip
    return said


def _pairing(res: dict[str, Any]) -> str:
    """How the sync and async arms ran: one engine, rounds alternating (newer results), or an
    engine each."""
    if _any_arm(res, "ttft_vs_sync"):
        return ("Each tier's `sync` and `async` arms share one engine, their rounds alternating "
                "(the order flipped every pair), and async's TTFT target is the median of its "
                "ratios to the sync round of the same pair, timed by the engine where the "
                "result has it (vLLM's queue plus prefill time: the engine core taking the "
                "request to the step that made its first token; the client's TTFT also holds "
                "the HTTP server's own delays, alike in both modes); `auto` runs on an "
                "engine of its own, its TTFT compared with sync's by medians. Every engine "
                "first runs unmeasured rounds, one per load mode it serves. ")  # fmt: skip
    return "Each arm ran on its own engine, one after the other. "


def _steps(arm: dict[str, Any], decodes: int) -> str:
    """Engine steps during the loader's TTFT, median (min–max) over rounds: every running
    decode makes one token a step, so the window's ITL observations over ``decodes``."""
    steps = [r["loading"]["samples"] / decodes for r in arm.get("rounds", []) if decodes]
    if not steps:
        return ""
    return f"{statistics.median(steps):.0f} ({min(steps):.0f}–{max(steps):.0f})"


def _load_time(breakdown: dict[str, float | None] | None) -> str:
    """Mean seconds of the arm's loads in the engine step (sync), on the load threads (async)
    and from start to the step that reported them (async); "" for results without them."""
    if not breakdown:
        return ""
    parts = [breakdown.get(f"{k}_s_mean") for k in ("step", "fetch", "reported")]
    return " / ".join("–" if v is None else f"{v * 1000:.0f}" for v in parts)


def _multi_turn(res: dict[str, Any]) -> tuple[str, str]:
    rows = [("cold prompt of turn two's length", _spread(res["cold_ttft_s"], seconds), "", "")]
    for key, label in (
        ("save_generated", "turn two, A saved its generated tokens (default)"),
        ("prompt_only", "turn two, `save_generated: false`"),
    ):
        if key in res:
            share = res[key]["share_from_tiers"]
            bar = (
                target(share["median"] >= BAR_TURN_TWO_SHARE, f"≥ {BAR_TURN_TWO_SHARE:.0%}")
                if key == "save_generated" else ""
            )  # fmt: skip
            rows.append((
                label, _spread(res[key]["ttft_s"], seconds),
                _spread(share, lambda x: f"{x * 100:.1f}%"), bar,
            ))  # fmt: skip
    intro = (
        f"Engine A answers turn one ({res['turn_one_tokens']:,} prompt tokens, "
        f"{res['answer_tokens']:,} generated); engine B, sharing A's file tier, serves turn two "
        f"(turn one, the answer, {res['question_tokens']} new tokens); {res['reps']} "
        "conversations per arm. Only whole 256-token chunks are stored, so the share's ceiling is "
        "the history's whole chunks over turn two's length:"
    )
    headers = ("turn two on B", "TTFT (min–max)", "tokens from the tiers", "target")
    return intro, table(headers, rows, "lrrl")


def _preemption(res: dict[str, Any]) -> tuple[str, str]:
    labels = {"kvstack": "kvstack", "kvstack_no_loads": "kvstack as `kv_producer` (no loads)",
              "plain_vllm": "plain vLLM"}  # fmt: skip
    rows = []
    for arm, label in labels.items():
        if arm in res:
            a = res[arm]
            rows.append((
                label, _spread(a["recomputed_tokens"]), _spread(a["recovered_tokens"]),
                _spread(a["preemptions"]), _spread(a["wall_s"], seconds),
            ))  # fmt: skip
    intro = (
        f"A KV budget of {res['blocks']} blocks and {res['requests']} requests that preempt each "
        f"other, {res['reps']} rounds per arm (plain vLLM counts no recomputed tokens itself):"
    )
    headers = ("arm", "recomputed tokens", "recovered from tiers", "preemptions", "wall time")
    return intro, table(headers, rows, "lrrrr")


_SCENARIOS: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[str, str]]]] = {
    "interference": ("Interference: decodes while a slow-tier load runs", _interference),
    "multi-turn": ("Multi-turn: turn two on another instance", _multi_turn),
    "preemption": ("Preemption: recomputed tokens", _preemption),
    "overhead": ("Overhead: unique prompts, paired rounds", _overhead),
    "pipelining": ("Layer pipelining: CPU-tier hits, paired rounds", _pipelining),
}


def _model(res: dict[str, Any]) -> str:
    name = str(res.get("args", {}).get("model", ""))
    if name.startswith(SMALL.name):
        return "the ~150M-parameter toy Llama"
    if name.startswith(TINY.name):
        return "the tiny toy Llama: its times are not a real model's"
    return f"model `{name}`" if name else "model not recorded"


def render_scenarios(results: Path) -> str:
    """Every ``--scenario`` with a committed result: its setup, table and run."""
    out: list[str] = []
    for scenario, (title, fn) in _SCENARIOS.items():
        r = newest_scenario(results, scenario)
        if r is None:
            continue
        intro, body = fn(r.result)
        intro = f"{intro[:-1]} ({_model(r.result)}):" if intro.endswith(":") else intro
        out += [f"**{title}** (`--scenario {scenario}`). {intro}", "", body, "", run_line(r), ""]
    if not out:
        return "_No committed result of `kvstack bench vllm --scenario …` yet._"
    return "\n".join(out).rstrip("\n")
