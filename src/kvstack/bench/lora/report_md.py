"""The published tables of ``kvstack bench lora``, rendered from its committed results.

Two results: ``lora-des-*.json`` (the discrete-event mode) and ``lora-sim-*.json`` (simulated
engines). Per mode, a table of the shapes (medians and min–max over the held-out seeds, the
tuning seed in a row of its own), then the arms side by side on the first shape's held-out
seeds. The target (the LoRA issue's: at least 30% fewer cold loads than LRU) is judged on the
held-out median.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table, target
from kvstack.bench.results import Result, newest

__all__ = ["headline", "render"]

BAR_REDUCTION = 0.30  # fewer cold loads than LRU
MODES = (("des", "discrete-event model"), ("sim", "simulated engines, the full manager"))
ORDER = ("weighted-lru", "lru-pins", "lru")


def pct(x: float | None) -> str:
    """One decimal, never rounded to a whole number: 0.2953 -> ``29.5%``."""
    return "–" if x is None else f"{100 * x:.1f}%"


def _spread(s: dict[str, Any] | None, fmt: Callable[[float], str] = pct) -> str:
    if not s:
        return "–"
    if fmt(s["min"]) == fmt(s["max"]):  # equal as shown (p99 steps differ in float noise)
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _arms(r: Result) -> list[str]:
    got = r.result.get("arms", {})
    return [a for a in ORDER if a in got] + [a for a in got if a not in ORDER]


def _label(r: Result, arm: str) -> str:
    return str(r.result.get("arms", {}).get(arm, {}).get("label", arm))


def _shape_rows(r: Result, mode: dict[str, Any]) -> list[tuple[str, ...]]:
    arms, rows = _arms(r), []
    for run in mode["runs"]:
        if run["role"] == "tuning":
            what = f"s = {run['zipf_s']:g}, seed {run['seed']} (tuning)"
            rows.append(_row(arms, what, run, judged=False))
    for shape, s in mode["summary"].items():
        seeds = ", ".join(str(x) for x in s["seeds"])
        plural = "s" * (len(s["seeds"]) > 1)
        rows.append(_row(arms, f"s = {shape}, seed{plural} {seeds} (held out)", s, judged=True))
    if not mode["summary"]:  # no held-out seeds: the runs there are
        rows += [
            _row(arms, f"s = {run['zipf_s']:g}, seed {run['seed']}", run, judged=True)
            for run in mode["runs"]
            if run["role"] != "tuning"
        ]
    return rows


def _cell(part: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A pair's figure: a spread over seeds (summary) or one run's value (as a spread)."""
    got = part.get(key)
    if got is None or isinstance(got, dict):
        return got
    return {"median": got, "min": got, "max": got}


def _row(arms: list[str], what: str, part: dict[str, Any], judged: bool) -> tuple[str, ...]:
    pairs = part["pairs"]

    def pair(name: str) -> dict[str, Any] | None:
        return _cell(pairs[name], "cold_loads_reduction") if name in pairs else None

    vs_lru = pair("weighted-lru vs lru")
    per_arm = [_arm_cell(part["arms"][a]) for a in arms]
    bar = f"≥ {100 * BAR_REDUCTION:.0f}% vs LRU"
    verdict = target(vs_lru["median"] >= BAR_REDUCTION, bar) if vs_lru else bar
    return (
        what,
        _spread(vs_lru),
        _spread(pair("weighted-lru vs lru-pins")),
        _spread(pair("lru-pins vs lru")),
        " / ".join(p[0] for p in per_arm),
        " / ".join(p[1] for p in per_arm),
        verdict if judged else f"{bar}: not judged (the tuning seed)",
    )


def _arm_cell(a: dict[str, Any]) -> tuple[str, str]:
    """(platinum cold starts, interactive TTFT p99 s) of one arm: a run's or a spread's."""
    if "ttft_interactive_s" in a:  # one run
        return f"{a['platinum_cold_starts']:,}", f"{a['ttft_interactive_s']['p99']:.3f}"
    p99 = a["ttft_interactive_p99_s"]
    return (
        _spread(a["platinum_cold_starts"], lambda x: f"{x:,.0f}"),
        _spread(p99, lambda x: f"{x:.3f}") if p99 else "–",
    )


def _detail_rows(r: Result, run: dict[str, Any]) -> list[tuple[str, ...]]:
    """Per arm, one run: what the shape table leaves out."""
    rows: list[tuple[str, ...]] = []
    for arm in _arms(r):
        a = run["arms"][arm]
        t, inv = a["ttft_interactive_s"], a["invariants"]
        wrong = inv.get("wrong_version", 0) + inv.get("wrong_version_seen_by_client", 0)
        rows.append(
            (
                _label(r, arm),
                f"{a['cold_loads']:,}",
                f"{a['engine_loads']:,}",
                " / ".join(f"{100 * a['starts'][k]:.1f}" for k in ("hot", "warm", "cold")),
                " / ".join(f"{t[k]:.3f}" for k in ("p50", "p95", "p99")),
                f"{sum(a['refusals'].values()):,}",
                f"{inv.get('pinned_eviction', 0)} / {wrong} / {inv.get('unverified_load', '–')}",
            )
        )
    return rows


def _setup(r: Result, mode: str) -> str:
    a, tuning = r.result["args"], r.result.get("tuning", {})
    requests = a["des_requests"] if mode == "des" else a["requests"]
    measured = requests - int(requests * a["warmup_fraction"])
    arms = ", ".join(_label(r, x) for x in _arms(r))
    text = (
        f"lora-zipf: {a['adapters']:,} adapters on {a['engines']} engines, "
        f"{a['gpu_slots']} GPU slots and {a['host_slots']} warm per engine, "
        f"{requests:,} requests per arm and workload ({measured:,} measured after the warmup), "
        f"{a['rate']:g} requests/s. Arms at equal memory: {arms}."
    )
    d = tuning.get("weighted_defaults")
    if d and tuning.get("seed") is not None:
        hot = " / ".join(f"{v:g}" for v in d["hot_score"].values())
        tiers = " / ".join(f"{k} {v:g}" for k, v in d["priority_weights"].items())
        text += (
            f" The weighted arm's defaults (hot score {' / '.join(d['hot_score'])} = {hot}, "
            f"rate window {num(d['qps_window_s'])} s, tier weights {tiers}) were chosen on seed "
            f"{tuning['seed']} at s = {tuning['zipf_s']:g}; the held-out rows are the figures "
            "to go by."
        )
    return text


def _mode(r: Result, mode: str, title: str) -> list[str]:
    data = r.result[mode]
    arms = " / ".join(_short(x) for x in _arms(r))
    out = [
        f"**{title}.** " + stale_line(r),
        "",
        _setup(r, mode),
        "",
        table(
            (
                "workload (Zipf s, seeds)",
                "fewer cold loads than LRU",
                "than LRU + pins",
                "pins alone vs LRU",
                f"platinum cold starts ({arms})",
                f"interactive TTFT p99 s ({arms})",
                "target",
            ),
            _shape_rows(r, data),
            "lrrrrrl",
        ),
    ]
    first = next((x for x in data["runs"] if x["role"] != "tuning"), data["runs"][0])
    out += [
        "",
        f"Each arm on s = {first['zipf_s']:g}, seed {first['seed']} ({first['role']}):",
        "",
        table(
            (
                "arm",
                "cold loads",
                "engine loads",
                "starts hot / warm / cold %",
                "interactive TTFT p50 / p95 / p99 s",
                "refusals",
                "pinned evictions / wrong version / unverified",
            ),
            _detail_rows(r, first),
            "lrrrrrl",
        ),
    ]
    return out


def render(results: Path) -> str:
    out: list[str] = []
    for mode, title in MODES:
        r = newest(results, "lora", mode)
        if r is not None and mode in r.result:
            out += [*([""] if out else []), *_mode(r, mode, title.capitalize())]
    return "\n".join(out) or "_No committed result of `kvstack bench lora` yet._"


def headline(results: Path) -> list[tuple[str, str, str]]:
    """README rows: per mode, the first shape's held-out medians (or the one run there is)."""
    rows = []
    for mode, title in MODES:
        r = newest(results, "lora", mode)
        if r is None or mode not in r.result:
            continue
        adapters = r.result.get("args", {}).get("adapters")
        what = f"LoRA adapter cache vs LRU (lora-zipf, {adapters:,} adapters), {title}"
        rows.append((what, _figure(r, mode), _cmd(r)))
    return rows


def _figure(r: Result, mode: str) -> str:
    data = r.result[mode]
    summary = next(iter(data["summary"].values()), None)
    part: dict[str, Any] = summary or data["runs"][0]
    pairs, arms = part["pairs"], part["arms"]

    def median(name: str, key: str) -> float | None:
        cell = _cell(pairs[name], key) if name in pairs else None
        return None if cell is None else float(cell["median"])

    vs_lru = _cell(pairs.get("weighted-lru vs lru", {}), "cold_loads_reduction")
    text = f"{_spread(vs_lru)} fewer cold loads than LRU"
    if "weighted-lru vs lru-pins" in pairs:
        text += f", {pct(median('weighted-lru vs lru-pins', 'cold_loads_reduction'))} fewer "
        text += "than LRU with the same pins"
    plat = {a: _median_platinum(arms[a]) for a in arms}
    others = ", ".join(f"{_short(a)} {plat[a]}" for a in ("lru-pins", "lru") if a in plat)
    text += f"; platinum cold starts {plat.get('weighted-lru', '–')} ({others})"
    ratio = median("weighted-lru vs lru", "ttft_p99_interactive_ratio")
    if ratio is not None:
        text += f"; interactive TTFT p99 ×{ratio:.2f} of LRU's"
    if summary and len(summary["seeds"]) == 1:
        text += f" (one run, held-out seed {summary['seeds'][0]})"
    elif summary:
        seeds = ", ".join(str(x) for x in summary["seeds"])
        text += f" (medians over held-out seeds {seeds}; min–max in brackets)"
    else:
        run = data["runs"][0]
        text += f" (one run, seed {run['seed']}{', the tuning seed' * (run['role'] == 'tuning')})"
    return text + (" — **stale**" if r.stale else "")


def _median_platinum(a: dict[str, Any]) -> str:
    got = a["platinum_cold_starts"]
    return f"{got['median'] if isinstance(got, dict) else got:,.0f}"


def _short(arm: str) -> str:
    return {"weighted-lru": "kvstack", "lru-pins": "LRU + pins", "lru": "LRU"}.get(arm, arm)


def _cmd(r: Result) -> str:
    return f"`{r.command}`"
