"""The demo's published figures (docs/benchmarks.md, README), from committed ``demo.json`` files.

A full run is committed as ``benchmarks/results/demo/demo-full-<day>.json``, the story-only run
(``--quick``) as ``demo-quick-<day>.json``; both are the ``demo.json`` the run wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import Result, newest

__all__ = ["headline", "render"]

STORY_BAR = 0.1  # steps 2 and 4 at most 1/10 of the cold TTFT
MIN_REQUESTS = 30  # per load cell
WALL_BAR_S = {"full": 360.0, "quick": 120.0}


def _wall(r: Result, kind: str) -> str:
    wall = r.result.get("wall_s")
    if wall is None:
        return ""
    text = f"{wall // 60:.0f} min {wall % 60:.0f} s"
    return target(wall <= WALL_BAR_S[kind], f"{text} (target < {WALL_BAR_S[kind] / 60:.0f} min)")


def _story_rows(story: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    cold = story["cold_ttft_s"]
    rows = [("1. engine A reads the document cold", f"{cold:.2f} s", "1", "")]
    for step, key, bar in (
        ("2. engine B, through kvstack's shared tier (A stopped)", "other_instance_ttft_s", True),
        ("3. engine B, vLLM alone (no kvstack)", "other_instance_without_kvstack_ttft_s", False),
        ("4. after both engines restart, from disk", "after_restart_ttft_s", True),
    ):
        ratio = story[key] / cold
        cell = target(ratio <= STORY_BAR, f"≤ {STORY_BAR:g}× cold") if bar else ""
        rows.append((step, f"{story[key]:.2f} s", f"{ratio:.3f}×", cell))
    return rows


def render(results: Path) -> str:
    out: list[str] = []
    for kind in ("full", "quick"):
        r = newest(results, "demo", kind)
        if r is None:
            continue
        res = r.result
        title = "Full run" if kind == "full" else "Story only (`--quick`)"
        out += [f"**{title}.** " + stale_line(r), ""]
        out.append(table(("step", "TTFT", "× cold", "target"), _story_rows(res["story"]), "lrrl"))
        same = res["story"]["identical_tokens"]
        control = res.get("story_details", {}).get("control_differs")
        proof = "; a changed chunk of KV changes the answer: yes." if control else "."
        out += ["", f"Greedy answers of steps 2 and 4 against vLLM's own: "
                f"{target(bool(same), 'identical')}{proof}"]  # fmt: skip
        if res.get("load"):
            rows = []
            by_workload: dict[str, dict[str, Any]] = {}
            for row in res["load"]:
                by_workload.setdefault(row["workload"], {})[row["mode"]] = row
            for workload, modes in by_workload.items():
                for mode in ("off", "on"):
                    c = modes.get(mode)
                    if c is None:
                        continue
                    cell = ""
                    if mode == "on" and "off" in modes:
                        won = c["ttft_p50_s"] < modes["off"]["ttft_p50_s"]
                        enough = min(c["requests"], modes["off"]["requests"]) >= MIN_REQUESTS
                        cell = target(won and enough, f"p50 below off's, ≥ {MIN_REQUESTS} requests")
                    rows.append((workload, mode, c["requests"], c["errors"],
                                 f"{c['ttft_p50_s']:.2f} s", f"{c['ttft_p90_s']:.2f} s",
                                 f"{c['output_tokens_per_s']:.1f}",
                                 f"{c['cache_hit_rate'] * 100:.0f}%", cell))  # fmt: skip
            heads = ("workload", "cache", "requests", "errors", "TTFT p50", "TTFT p90",
                     "output tok/s", "hit rate", "target")  # fmt: skip
            out += ["", table(heads, rows, "llrrrrrrl")]
        out += ["", f"Wall time: {_wall(r, kind)}.", ""]
    return "\n".join(out).rstrip() or "_No committed demo result yet._"


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "demo", "full") or newest(results, "demo", "quick")
    if r is None:
        return []
    s = r.result["story"]
    cold, tokens = s["cold_ttft_s"], r.result["story_details"]["document_tokens"]
    return [(
        f"the demo: a {tokens:,}-token document on another vLLM instance / after a restart",
        f"{s['other_instance_ttft_s']:.2f} s / {s['after_restart_ttft_s']:.2f} s against "
        f"{cold:.2f} s cold ({s['other_instance_ttft_s'] / cold:.2f}× / "
        f"{s['after_restart_ttft_s'] / cold:.2f}×)",
        "`./scripts/demo.sh`",
    )]  # fmt: skip
