"""The published tables of ``kvstack bench sim``, rendered from its committed result.

Part one: one simulated engine's closed-loop requests/s against a canned upstream measured with
the same client in the same run. Part two: a fleet in one process with a router and the load
generator on the same host, at each simulated rate the client's TTFT against the engines' own,
the engines' lag and each process's CPU; a rate fits when lag < 5%, the processes used < 90% of
the CPUs and nothing failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import num, stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["BAR_REQ_PER_S", "headline", "markdown", "render"]

BAR_REQ_PER_S = 500.0  # one engine's closed-loop capacity on this machine (the bar)


def _single(points: list[dict[str, Any]]) -> str:
    ref = next((p for p in points if p["target"] == "canned upstream"), None)
    rows = []
    for p in points:
        engine = p["target"] == "sim-engine"
        vs = f"{p['requests_per_s'] / ref['requests_per_s']:.2f}×" if ref else ""
        rows.append(
            (p["target"] if engine else "canned upstream (reference)", p["output_tokens"],
             num(p["requests_per_s"]), f"{p['server_cpu_s_per_request'] * 1e3:.2f}", vs,
             target(p["requests_per_s"] >= BAR_REQ_PER_S, f"≥ {BAR_REQ_PER_S:g} req/s")
             if engine else "")
        )  # fmt: skip
    return table(
        ("server", "output tokens", "req/s", "server CPU ms/request", "vs canned", "target"),
        rows,
        "lrrrrl",
    )


def _fleet(points: list[dict[str, Any]], scale: float) -> str:
    rows = []
    for p in points:
        added_ms = (p["client_ttft_mean_s"] - p["engine_ttft_mean_s"]) / scale * 1e3
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in p["cpu_ms_per_request"].items())
        rows.append(
            (f"{p['rate']:g}", f"{p['rate'] * scale:g}", p["requests"], p["errors"],
             f"{p['client_ttft_mean_s']:.3f}", f"{p['engine_ttft_mean_s']:.3f}",
             f"{added_ms:+.1f}", f"{p['lag_share']:.1%}", cpu,
             f"{p['projected_wall_rps'] / scale:.1f}",
             target(p["fits"], "lag < 5%, CPUs < 90%, no errors"))
        )  # fmt: skip
    headers = ("simulated req/s", "wall req/s", "requests", "errors", "client TTFT s",
               "engine TTFT s", "added wall ms", "engine lag", "CPU ms/request",
               "CPUs here could carry (simulated req/s)", "target")  # fmt: skip
    return table(headers, rows, "rrrrrrrrlrl")


def markdown(result: dict[str, Any]) -> str:
    """The tables of one result (either part may be missing)."""
    a, out = result["args"], []
    if "single" in result:
        load = result.get("single_load", {})
        out += [
            f"One `kvstack sim-engine`, closed loop with {a['concurrency']} users for "
            f"{a['single_duration']:g} s per row, 32-token prompts streamed (load average "
            f"{load.get('load_average', '?')}, CPU pressure {load.get('cpu_pressure', '?')}):",
            "",
            _single(result["single"]),
        ]
    if "fleet" in result:
        load = result.get("fleet_load", {})
        best = result.get("highest_fitting_rate")
        fits = f"{best:g} req/s" if best is not None else "none"
        out += [
            "",
            f"{a['engines']} engines in one process at time scale {a['time_scale']:g}, "
            f"`{a['router']}` in front and the load generator on the same "
            f"{result.get('cpus', '?')} cores; shared-prefix ({a['groups']} groups × "
            f"{a['prefix_tokens']:,} tokens, {a['output_tokens']} output tokens), "
            f"{a['duration']:g} simulated s per rate (load average "
            f"{load.get('load_average', '?')}, CPU pressure {load.get('cpu_pressure', '?')}). "
            "Added wall ms is the client's TTFT over the engines', in wall time:",
            "",
            _fleet(result["fleet"], a["time_scale"]),
            "",
            f"Highest simulated rate that fits: {fits}.",
        ]
    return "\n".join(out).strip("\n")


def render(results: Path) -> str:
    r = newest(results, "sim")
    if r is None:
        return "_No committed result of `kvstack bench sim` yet._"
    return stale_line(r) + "\n\n" + markdown(r.result)


def headline(results: Path) -> list[tuple[str, str, str]]:
    """The README's table has no simulator row: the simulator is a test rig, not a feature."""
    return []
