"""``kvstack bench router``: what a router adds, kvstack's against vllm-router, in one run.

Setup (all on loopback, each its own process): a trivial fast upstream serving two worker
ports (:mod:`kvstack.router.perf.upstream`), the kvstack router and the Rust ``vllm-router``
(both round-robin over the two workers), and a load generator process.

1. Latency: open loop at ``--rate`` req/s (default 500) for ``--duration-s``, non-streaming,
   against the upstream directly and through each router. Router-added latency is the router's
   percentile minus the direct percentile (p50, p99). The kvstack router's own view (its
   ``kvstack_router_added_latency_seconds`` histogram) is printed next to it.
2. Throughput: closed loop with ``--connections`` (wrk when installed, else the Python
   loadgen) for ``--duration-s``; the maximum sustained non-streaming req/s of each, with the
   CPU seconds each process burnt per request (where the cores went).

The bars from the issue are checked and printed: added p50 <= 1 ms and p99 <= 5 ms at 500
req/s, >= 2,000 req/s; ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvstack.router.perf.harness import (
    cpu_seconds,
    free_port,
    run_open_loop,
    run_throughput,
    start_kvstack_router,
    start_upstream,
    start_vllm_router,
    vllm_router_binary,
)
from kvstack.stack.procs import ManagedProcess

__all__ = ["run"]

PATH = "/v1/completions"
BARS = {"added_p50_ms": 1.0, "added_p99_ms": 5.0, "req_per_s": 2000.0}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench router", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=500.0, help="open-loop rate (req/s)")
    p.add_argument("--duration-s", type=float, default=10.0, help="length of each run")
    p.add_argument("--connections", type=int, default=64, help="closed-loop connections")
    p.add_argument("--policy", default="round_robin", help="kvstack router policy")
    p.add_argument("--no-vllm-router", action="store_true", help="skip vllm-router")
    p.add_argument("--json", help="write all figures to this file")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        targets, procs = _start_all(args, workdir, stack)
        latency = {
            name: run_open_loop(url + PATH, args.rate, args.duration_s, workdir / f"{name}.json")
            for name, url in targets.items()
        }
        internal = _internal_added_ms(targets["kvstack"])
        throughput = {name: _throughput(url, args, workdir, procs) for name, url in targets.items()}
    report = _report(latency, throughput, internal, args)
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _start_all(
    args: argparse.Namespace, workdir: Path, stack: ExitStack
) -> tuple[dict[str, str], dict[str, list[ManagedProcess]]]:
    ports = [free_port(), free_port()]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    upstream = _owned(stack, start_upstream(ports, workdir))
    targets = {"direct": workers[0]}
    procs: dict[str, list[ManagedProcess]] = {"direct": [upstream]}
    port = free_port()
    kvstack = _owned(stack, start_kvstack_router(port, workers, args.policy, workdir))
    targets["kvstack"] = f"http://127.0.0.1:{port}"
    procs["kvstack"] = [kvstack, upstream]
    binary = vllm_router_binary()
    if binary and not args.no_vllm_router:
        port = free_port()
        vllm_router = _owned(stack, start_vllm_router(binary, port, workers, workdir))
        targets["vllm-router"] = f"http://127.0.0.1:{port}"
        procs["vllm-router"] = [vllm_router, upstream]
    return targets, procs


def _owned(stack: ExitStack, proc: ManagedProcess) -> ManagedProcess:
    """Stop ``proc`` (already started) when the stack unwinds."""
    stack.callback(proc.stop)
    return proc


def _throughput(
    url: str, args: argparse.Namespace, workdir: Path, procs: dict[str, list[ManagedProcess]]
) -> dict[str, Any]:
    pids = {p.name: p.pid for group in procs.values() for p in group if p.pid is not None}
    before = {n: cpu_seconds(pid) for n, pid in pids.items()}
    result = run_throughput(url + PATH, args.connections, args.duration_s, workdir)
    used = {n: cpu_seconds(pid) - before[n] for n, pid in pids.items()}
    num = result.req_per_s * args.duration_s
    return {
        "req_per_s": round(result.req_per_s, 1),
        "errors": result.errors,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "tool": result.tool,
        "cpu_us_per_req": {n: round(s / num * 1e6, 1) for n, s in used.items() if s > 0.05},
    }


def _internal_added_ms(router_url: str) -> dict[str, float]:
    """p50/p99 of the router's own added-latency histogram (bucket upper bounds)."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith("kvstack_router_added_latency_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0.0

    def quantile(q: float) -> float:
        return next((le * 1000 for le, n in buckets if n >= q * total), float("nan"))

    return {"p50_le_ms": quantile(0.5), "p99_le_ms": quantile(0.99), "count": total}


def _report(
    latency: dict[str, dict[str, float]],
    throughput: dict[str, dict[str, Any]],
    internal: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    direct = latency["direct"]
    routers: dict[str, Any] = {}
    for name in (n for n in latency if n != "direct"):
        lat = latency[name]
        routers[name] = {
            "latency": lat,
            "added_p50_ms": round(lat["p50_ms"] - direct["p50_ms"], 3),
            "added_p99_ms": round(lat["p99_ms"] - direct["p99_ms"], 3),
            "throughput": throughput[name],
        }
    report: dict[str, Any] = {
        "settings": {
            "rate": args.rate,
            "duration_s": args.duration_s,
            "connections": args.connections,
            "policy": args.policy,
        },
        "direct": {"latency": direct, "throughput": throughput["direct"]},
        "routers": routers,
        "kvstack_internal_added": internal,
    }
    if "vllm-router" in routers:
        kv, vr = routers["kvstack"], routers["vllm-router"]
        report["ratios_kvstack_over_vllm_router"] = {
            "added_p50": _ratio(kv["added_p50_ms"], vr["added_p50_ms"]),
            "added_p99": _ratio(kv["added_p99_ms"], vr["added_p99_ms"]),
            "req_per_s": _ratio(kv["throughput"]["req_per_s"], vr["throughput"]["req_per_s"]),
        }
    kv = routers["kvstack"]
    report["bars"] = {
        "added_p50_ms<=1": kv["added_p50_ms"] <= BARS["added_p50_ms"],
        "added_p99_ms<=5": kv["added_p99_ms"] <= BARS["added_p99_ms"],
        "req_per_s>=2000": kv["throughput"]["req_per_s"] >= BARS["req_per_s"],
    }
    return report


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else float("inf")


def _print(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(
        f"router bench: open loop {s['rate']:.0f} req/s and closed loop "
        f"{s['connections']} connections, {s['duration_s']:.0f} s each, non-streaming"
    )
    d = report["direct"]
    rows = [("direct (no router)", d["latency"], None, None, d["throughput"])]
    for name, r in report["routers"].items():
        rows.append((name, r["latency"], r["added_p50_ms"], r["added_p99_ms"], r["throughput"]))
    print(
        f"{'target':<20}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
        f"{'max req/s':>11}  cpu µs/req"
    )
    for name, lat, a50, a99, thr in rows:
        added = f"{a50:>9.3f}{a99:>9.3f}" if a50 is not None else f"{'':>9}{'':>9}"
        cpu = ", ".join(f"{k}={v}" for k, v in thr["cpu_us_per_req"].items())
        print(
            f"{name:<20}{lat['p50_ms']:>9.3f}{lat['p99_ms']:>9.3f}{added}"
            f"{thr['req_per_s']:>11.0f}  {cpu}"
        )
    i = report["kvstack_internal_added"]
    print(
        f"kvstack router's own added-latency histogram: p50 <= {i['p50_le_ms']} ms, "
        f"p99 <= {i['p99_le_ms']} ms (bucket bounds)"
    )
    if "ratios_kvstack_over_vllm_router" in report:
        print("kvstack / vllm-router:", report["ratios_kvstack_over_vllm_router"])
    print("bars:", report["bars"])
