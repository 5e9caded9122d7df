"""The published tables of ``kvstack bench compare``, rendered from its committed results.

One section per committed config (``benchmarks/results/compare/compare-<name>-*.json``, the
newest of each): its command line exactly as run, the setup as the result records it, the run's
machine and commit, the table, and a generated summary of the highest load point. In each load
point the best goodput and the best TTFT p50 and p90 are bold, chosen here by comparing the
figures as printed (ties all bold); a front end that did not run says why in its row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table
from kvstack.bench.results import Result, load, newest

__all__ = ["best_cells", "headline", "render"]

# The order of the docs; any other committed config follows, by name.
ORDER = ("router-shared-prefix", "router-hot-prefix", "router-multi-round-qa", "router-unique")
TITLES = {"router-hot-prefix": "one hot prefix", "router-unique": "unique prompts"}
KVSTACK = "kvstack ttft"  # the default policy with the engines' KV events (the headline arm)
LAG_WARNING = 0.05
# column -> (row field, larger is better); the columns that may be bold
BEST = {
    "goodput/s": ("goodput", True),
    "TTFT p50": ("ttft_p50_s", False),
    "TTFT p90": ("ttft_p90_s", False),
}
HEADERS = (
    "rate",
    "front end",
    "goodput/s",
    "in SLO",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "prefix hits",
    "spread",
    "lag",
)


def _variants(results: Path) -> list[str]:
    folder = results / "compare"
    names = {load(p).result.get("variant") for p in folder.glob("compare-*.json")}
    found = sorted(n for n in names if isinstance(n, str))
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def _s(x: float | None) -> str:
    return "–" if x is None else num(x)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"


def best_cells(rows: Sequence[dict[str, Any]]) -> set[tuple[float, str, str]]:
    """(load point, front end, column) of the best figures at each load point, as printed."""
    best: set[tuple[float, str, str]] = set()
    for point in sorted({r["point"] for r in rows}):
        ran = [r for r in rows if r["point"] == point and "error" not in r]
        for column, (name, higher) in BEST.items():
            shown = {r["frontend"]: r[name] for r in ran if r.get(name) is not None}
            if len(shown) < 2:
                continue
            # compare the printed figures, so that a tie on the page is a tie in bold
            printed = {k: float(num(v).replace(",", "")) for k, v in shown.items()}
            top = max(printed.values()) if higher else min(printed.values())
            best |= {(point, k, column) for k, v in printed.items() if v == top}
    return best


def _table(rows: Sequence[dict[str, Any]]) -> str:
    best = best_cells(rows)

    def bold(r: dict[str, Any], column: str, text: str) -> str:
        return f"**{text}**" if (r["point"], r["frontend"], column) in best else text

    out = []
    for r in rows:
        if "error" in r:
            out.append((f"{r['point']:g}", r["frontend"], f"did not run: {r['error']}", *[""] * 7))
            continue
        out.append(
            (
                f"{r['point']:g}",
                r["frontend"],
                bold(r, "goodput/s", _s(r["goodput"])),
                _pct(r["slo_attainment"]),
                bold(r, "TTFT p50", _s(r["ttft_p50_s"])),
                bold(r, "TTFT p90", _s(r["ttft_p90_s"])),
                _s(r["ttft_p99_s"]),
                _pct(r["prefix_hit_rate"]),
                _s(r["spread"]),
                _pct(r["lag_share"]),
            )
        )
    return table(HEADERS, out, "rlrrrrrrrr")


def _engine(fleet: dict[str, Any]) -> str:
    """A simulated engine's speed and the fleet's KV, as configured."""
    sim, parts = fleet.get("sim") or {}, []
    if "prefill_tokens_per_s" in sim:
        parts.append(f"{sim['prefill_tokens_per_s']:,} prefill tokens/s")
    if "step_base_s" in sim:
        parts.append(f"{sim['step_base_s'] * 1000:g} ms decode steps")
    if "num_blocks" in sim and "block_size" in sim:
        parts.append(f"{sim['num_blocks']:,} KV blocks of {sim['block_size']} tokens each")
    parts.append(f"{fleet['kv_capacity_tokens']:,} tokens of KV in all")
    if fleet.get("time_scale"):
        parts.append(f"time scale {fleet['time_scale']:g}")
    return ", ".join(parts)


def _setup(res: dict[str, Any]) -> str:
    fleet, slo = res["fleet"], res["slo"]
    params = ", ".join(
        f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
        for k, v in res["workload"]["params"].items()
    )
    text = f"{fleet['engines']} {fleet['kind']} engines"
    if fleet.get("kv_capacity_tokens"):
        text += f" ({_engine(fleet)})"
    text += ", KV events on" if fleet.get("kv_events") else ""
    text += f"; workload `{res['workload']['name']}` ({params})"
    ws, cap = res.get("working_set_tokens"), fleet.get("kv_capacity_tokens")
    if ws and cap:
        text += f", a working set of {ws:,} tokens ({ws / cap:.0%} of the fleet's KV)"
    unit = "req/s" if res["load"] == "rate" else "users"
    text += f"; {', '.join(f'{p:g}' for p in res['points'])} {unit}"
    text += f", {res['duration_s']:g} s per front end per load point, seed {res['seed']}"
    bounds = [
        f"{k} ≤ {num(v)} s"
        for k, v in (("TTFT", slo["ttft_s"]), ("TPOT", slo["tpot_s"]))
        if v is not None
    ]
    return text + (f"; SLO {' and '.join(bounds)}." if bounds else ".")


def _summary(res: dict[str, Any]) -> list[str]:
    rows = res["rows"]
    top = max(r["point"] for r in rows)
    ran = sorted(
        (r for r in rows if r["point"] == top and "error" not in r),
        key=lambda r: (-r["goodput"], r["ttft_p90_s"] or 0.0),
    )
    unit = "req/s" if res["load"] == "rate" else "users"
    lines = []
    if ran:
        arms = "; ".join(
            f"{r['frontend']} {_s(r['goodput'])}/s at {_s(r['ttft_p90_s'])} s" for r in ran
        )
        lines.append(f"At {f'{top:g}'} {unit}, goodput and TTFT p90 from best to worst: {arms}.")
    lagging = [r for r in rows if "error" not in r and r["lag_share"] > LAG_WARNING]
    if lagging:
        worst = max(r["lag_share"] for r in lagging)
        lines.append(
            f"In {len(lagging)} of {len(rows)} runs an engine fell behind its schedule for more "
            f"than {LAG_WARNING:.0%} of the run (worst {worst:.0%}): those rows measure the "
            "machine as much as the front end."
        )
    return lines


def _section(r: Result) -> str:
    res = r.result
    title = TITLES.get(res["variant"], res["variant"].removeprefix("router-"))
    parts = [f"### {title} — `{r.command}`", "", _setup(res), "", stale_line(r), ""]
    parts += [_table(res["rows"]), ""]
    summary = _summary(res)
    load_average, cores = r.machine.get("load_average"), r.machine.get("cores")
    if load_average is not None:
        summary.append(
            f"The machine's one-minute load average when the run ended: {load_average:g}"
            + (f" on {cores} cores." if cores else ".")
        )
    parts += [" ".join(summary)]
    return "\n".join(parts).rstrip()


def render(results: Path) -> str:
    sections = [newest(results, "compare", variant=v) for v in _variants(results)]
    found = [s for s in sections if s is not None]
    if not found:
        return "_No committed result of `kvstack bench compare` yet._"
    intro = (
        "Bold: the best goodput, TTFT p50 and TTFT p90 at each load point, picked by comparing "
        "the printed figures. Goodput counts requests within the SLO per second; spread is the "
        "busiest engine's requests over the mean; lag the engines' worst delay against their "
        "schedule."
    )
    return "\n\n".join([intro, *(_section(r) for r in found)])


def _row(res: dict[str, Any], frontend: str, point: float) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in res["rows"]
            if r["frontend"] == frontend and r["point"] == point and "error" not in r
        ),
        None,
    )


def _arm(res: dict[str, Any], label: str, frontend: str, point: float, fig: str) -> str | None:
    r = _row(res, frontend, point)
    if r is None:
        return None
    if fig == "goodput":
        return f"{label} {_s(r['goodput'])}/s at {_s(r['ttft_p90_s'])} s"
    return f"{label} {_s(r['ttft_p50_s'])} / {_s(r['ttft_p90_s'])} s"


def _headline_row(r: Result, what: str, fig: str) -> tuple[str, str, str] | None:
    res = r.result
    top = max(row["point"] for row in res["rows"])
    mine = _arm(res, "", KVSTACK, top, fig)
    if mine is None:
        return None
    others = [
        _arm(res, "vllm-router `cache_aware`", "vllm-router cache_aware", top, fig),
        _arm(res, "`kv_aware`", "vllm-router kv_aware", top, fig),
        _arm(res, "`round_robin`", "vllm-router round_robin", top, fig),
    ]
    listed = "; ".join(o for o in others if o)
    text = mine.strip() + (f" ({listed})" if listed else "")
    ran = [x for x in res["rows"] if x["point"] == top and "error" not in x]
    lag = max((x["lag_share"] for x in ran), default=0.0)
    if lag > LAG_WARNING:
        text += f"; engines up to {lag:.0%} behind schedule there: a loaded machine"
    if r.stale:
        text += f"; stale: measured {r.day} at `{r.commit}`"
    return (what.format(engines=res["fleet"]["engines"], point=f"{top:g}"), text, r.command)


def headline(results: Path) -> list[tuple[str, str, str]]:
    """README rows: shared-prefix past saturation (goodput, TTFT p90) and multi-round-qa at its
    highest rate (TTFT p50 / p90), kvstack's default policy against vllm-router's."""
    rows = []
    sp = newest(results, "compare", variant="router-shared-prefix")
    if sp is not None:
        what = (
            "router scheduling, shared-prefix on {engines} simulated engines past "
            "saturation ({point} req/s): goodput at TTFT p90"
        )
        rows.append(_headline_row(sp, what, "goodput"))
    mq = newest(results, "compare", variant="router-multi-round-qa")
    if mq is not None:
        what = "router scheduling, multi-round-qa at {point} req/s: TTFT p50 / p90"
        rows.append(_headline_row(mq, what, "ttft"))
    return [r for r in rows if r is not None]
