"""The published tables of ``kvstack bench index``, rendered from its committed result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.bench.report import stale_line, table, target
from kvstack.bench.results import newest

__all__ = ["headline", "render"]

_NAMES = {
    "in_process": "in process (reference)",
    "service": "index server",
    "service_zmq": "index server, ZMQ",
    "service_http": "index server, HTTP (msgpack)",
    "service_http_json": "index server, HTTP (JSON)",
    "valkey": "Valkey",
    "valkey_one_trip": "Valkey, `send_ahead=0` (one pipelined trip)",
    "valkey_cluster": "Valkey cluster",
}


def render(results: Path) -> str:
    r = newest(results, "index")
    if r is None:
        return "_No committed result of `kvstack bench index` yet._"
    res, rows = r.result, []
    lookups = res["lookup_128k"]
    zmq = lookups["service_zmq"]["p99_ms"]
    bar = res.get("bar_p99_ms", 5.0)
    for name, f in lookups.items():
        cells = ""
        if name == "valkey":
            cells = (
                target(f["p99_ms"] <= zmq, "p99 ≤ ZMQ's")
                + _round_ratios(f, lookups["service_zmq"])
                + "; "
                + target(f["p99_ms"] <= bar, f"≤ {bar:g} ms")
            )
        server = f"{f['server_cpu_ms']:.2f}" if f.get("server_cpu_ms") is not None else ""
        rows.append(
            (
                _NAMES.get(name, name),
                f"{f['p50_ms']:.2f}",
                f"{f['p99_ms']:.2f}",
                f"{f['cpu_p50_ms']:.2f} / {f['cpu_p99_ms']:.2f}",
                server,
                f["n"],
                cells,
            )
        )
    ann = [
        (
            _NAMES.get(name, name),
            f"{a['bulk_events_per_s']:,.0f}",
            f"{a['steady_events_per_s']:,.0f}",
            f"{a['bulk_server_cpu_us_per_event']:.2f}",
            f"{res['memory_mb'][name]:.0f}",
        )
        for name, a in res["announce"].items()
    ]
    return "\n".join(
        [
            stale_line(r),
            "",
            f"Lookup of a {res['prompt_tokens']:,}-token prompt ({res['chunk_size']}-token chunks) "
            f"against {res['entries']:,} entries from {res['instances']} instances, wall clock "
            "with the client's CPU time beside it:",
            "",
            table(
                (
                    "backend",
                    "p50 ms",
                    "p99 ms",
                    "client CPU p50 / p99 ms",
                    "server CPU ms",
                    "lookups",
                    "target",
                ),
                rows,
                "lrrrrrl",
            ),
            *_routers(res),
            "",
            "Announces (events/s, bulk load and steady state):",
            "",
            table(
                ("backend", "bulk events/s", "steady events/s", "server CPU µs/event", "memory MB"),
                ann,
                "lrrrr",
            ),
        ]
    )


def _round_ratios(valkey: dict[str, Any], zmq: dict[str, Any]) -> str:
    """Valkey's p99 over ZMQ's in each round (the arms take turns within each), as a range: how
    far one run's verdict is from a tie."""
    pairs = list(zip(valkey.get("round_p99_ms", []), zmq.get("round_p99_ms", []), strict=False))
    ratios = [v / z for v, z in pairs if z > 0]
    if len(ratios) < 2:
        return ""
    return f" (rounds: {min(ratios):.2f}×–{max(ratios):.2f}×)"


def _routers(res: dict[str, object]) -> list[str]:
    """The several-routers table (``--routers``), where the result has one."""
    fleet = res.get("routers")
    if not isinstance(fleet, dict) or not fleet:
        return []
    rows = []
    for count, arms in fleet.items():
        zmq = arms["service_zmq"]
        for name, f in arms.items():
            ratio = "" if name == "service_zmq" else f"{f['p99_ms'] / zmq['p99_ms']:.2f}×"
            rate = f"{f['lookups_per_s']:,.0f}"
            cells = (f"{f['p50_ms']:.2f}", f"{f['p99_ms']:.2f}", ratio, rate, f"{f['n']:,}")
            rows.append((count, _NAMES.get(name, name), *cells, *_paced(f, zmq, name)))
    return [
        "",
        "The same lookup from several routers asking at once, each its own process on this "
        "machine (the chart runs 2 to 8 router replicas; here they share its cores with the "
        "index, so what a router's own CPU buys in a fleet does not show). Back to back, a "
        "backend that answers faster is asked more often; paced, every backend is asked at the "
        f"same offered load ({_share(fleet)} of the slowest backend's back-to-back rate, "
        "Poisson arrivals, each lookup timed from its arrival):",
        "",
        table(
            (
                "routers",
                "backend",
                "p50 ms",
                "p99 ms",
                "p99 / ZMQ's",
                "lookups/s, all",
                "lookups",
                "paced: lookups/s",
                "paced p50 / p99 ms",
                "paced p99 / ZMQ's",
            ),
            rows,
            "llrrrrrrrr",
        ),
    ]


def _share(fleet: dict[str, Any]) -> str:
    """The paced load as a share of the slowest backend's back-to-back rate ("a share" in
    results from before the bench paced its routers)."""
    arms = next(iter(fleet.values()))
    if not all("paced_per_s" in f for f in arms.values()):
        return "a share"
    slowest = min(f["lookups_per_s"] for f in arms.values())
    return f"{next(iter(arms.values()))['paced_per_s'] / slowest:.0%}"


def _paced(f: dict[str, Any], zmq: dict[str, Any], name: str) -> tuple[str, str, str]:
    """The paced cells (empty for results from before the bench paced its routers)."""
    if "paced_p99_ms" not in f:
        return "", "", ""
    ratio = "" if name == "service_zmq" else f"{f['paced_p99_ms'] / zmq['paced_p99_ms']:.2f}×"
    return (
        f"{f['paced_per_s']:,.0f}",
        f"{f['paced_p50_ms']:.2f} / {f['paced_p99_ms']:.2f}",
        ratio,
    )


def headline(results: Path) -> list[tuple[str, str, str]]:
    r = newest(results, "index")
    if r is None:
        return []
    look = r.result["lookup_128k"]
    return [
        (
            f"cluster KV index: lookup of a {r.result['prompt_tokens']:,}-token prompt, p99",
            f"Valkey {look['valkey']['p99_ms']:.2f} ms, index server over ZMQ "
            f"{look['service_zmq']['p99_ms']:.2f} ms "
            f"(in process {look['in_process']['p99_ms']:.2f} ms)",
            f"`{r.command}`",
        )
    ]
