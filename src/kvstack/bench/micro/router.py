"""``kvstack bench router``: what a router adds, kvstack's against vllm-router, in one run.

Setup (all on loopback, each its own process): a trivial fast upstream serving two worker
ports (:mod:`kvstack.bench.micro.router_upstream`), the kvstack router and the Rust ``vllm-router``
(both round-robin over the two workers), and a load generator process per measurement.

Method: the machine may be shared, so the targets (the upstream directly, each router) are
measured in interleaved rounds (``--rounds`` of ``--round-s`` seconds, order rotated every
round) and every figure is a median over rounds; a router's added latency is the median over
rounds of (its percentile − the direct percentile in the same round).

1. Latency: open loop at ``--rate`` req/s (default 500), non-streaming. The kvstack router's
   own view (its ``kvstack_router_added_latency_seconds`` histogram) is printed next to it.
2. Throughput: closed loop with ``--connections`` (wrk when installed, else the Python
   loadgen): the maximum sustained non-streaming req/s, and the CPU each process burnt per
   request (where the cores went).

The bars from the issue are checked: added p50 <= 1 ms and p99 <= 5 ms at 500 req/s, and
>= 2,000 req/s. ``--runs N`` repeats the whole measurement N times with fresh processes (the
tail depends on what else the cores did, so one run says little) and reports each run and the
median over runs. Ends with :func:`kvstack.bench.results.save` (``--json FILE``, else
``bench-results/router/``); :mod:`kvstack.bench.micro.router_report` renders the published
table from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from kvstack.bench.micro import router_report
from kvstack.bench.micro.router_harness import (
    cpu_seconds,
    run_open_loop,
    run_throughput,
    start_kvstack_router,
    start_upstream,
    start_vllm_router,
    vllm_router_binary,
)
from kvstack.bench.results import save
from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

__all__ = ["run"]

PATH = "/v1/completions"
BARS = router_report.BARS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench router", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=500.0, help="open-loop rate (req/s)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per measurement")
    p.add_argument("--round-s", type=float, default=3.0, help="length of one round")
    p.add_argument("--connections", type=int, default=64, help="closed-loop connections")
    p.add_argument("--policy", default="round_robin", help="kvstack router policy")
    p.add_argument("--no-vllm-router", action="store_true", help="skip vllm-router")
    p.add_argument("--runs", type=int, default=1, help="whole runs, each with fresh processes")
    p.add_argument("--json", help="the result file (default: bench-results/router/)")
    return p


def run(argv: list[str]) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1} of {args.runs}")
        runs.append(_one_run(args))
        _print(runs[-1], args)
    document = {"settings": vars(args), "runs": runs, "median": _median_over_runs(runs)}
    print(router_report.markdown(document), flush=True)
    save("router", argv, document, args.json, started=started)
    return 0


def _one_run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        targets, procs = _start_all(args, workdir, stack)
        latency = _latency_rounds(targets, args, workdir)
        internal = _internal_added_ms(targets["kvstack"])
        throughput = _throughput_rounds(targets, procs, args, workdir)
    report = _report(latency, throughput, internal)
    report["load_average"] = {"before": load_before, "after": os.getloadavg()[0]}
    return report


def _median_over_runs(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each router's added p50, added p99 and max req/s: the median over runs."""
    out: dict[str, dict[str, float]] = {}
    for name in runs[0]["routers"]:
        figures = [r["routers"][name] for r in runs]
        out[name] = {
            "added_p50_ms": statistics.median(f["added_p50_ms"] for f in figures),
            "added_p99_ms": statistics.median(f["added_p99_ms"] for f in figures),
            "req_per_s": statistics.median(f["throughput"]["req_per_s"] for f in figures),
        }
    return out


def _start_all(
    args: argparse.Namespace, workdir: Path, stack: ExitStack
) -> tuple[dict[str, str], dict[str, ManagedProcess]]:
    ports = [free_port(), free_port()]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    procs = {"upstream": _owned(stack, start_upstream(ports, workdir))}
    targets = {"direct": workers[0]}
    port = free_port()
    procs["kvstack"] = _owned(stack, start_kvstack_router(port, workers, args.policy, workdir))
    targets["kvstack"] = f"http://127.0.0.1:{port}"
    binary = vllm_router_binary()
    if binary and not args.no_vllm_router:
        port = free_port()
        procs["vllm-router"] = _owned(stack, start_vllm_router(binary, port, workers, workdir))
        targets["vllm-router"] = f"http://127.0.0.1:{port}"
    return targets, procs


def _owned(stack: ExitStack, proc: ManagedProcess) -> ManagedProcess:
    """Stop ``proc`` (already started) when the stack unwinds."""
    stack.callback(proc.stop)
    return proc


def _rotations(names: list[str], rounds: int) -> list[list[str]]:
    return [names[r % len(names) :] + names[: r % len(names)] for r in range(rounds)]


def _latency_rounds(
    targets: dict[str, str], args: argparse.Namespace, workdir: Path
) -> list[dict[str, dict[str, float]]]:
    """One dict per round: target -> its open-loop summary."""
    for url in targets.values():  # warm-up: connections, pools, lazily imported paths
        run_open_loop(url + PATH, args.rate, min(1.0, args.round_s / 2), workdir / "warm.json")
    rounds: list[dict[str, dict[str, float]]] = []
    for order in _rotations(list(targets), args.rounds):
        rounds.append(
            {
                name: run_open_loop(
                    targets[name] + PATH, args.rate, args.round_s, workdir / f"{name}.json"
                )
                for name in order
            }
        )
    return rounds


def _throughput_rounds(
    targets: dict[str, str],
    procs: dict[str, ManagedProcess],
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, dict[str, Any]]:
    rates: dict[str, list[float]] = {n: [] for n in targets}
    errors: dict[str, int] = dict.fromkeys(targets, 0)
    tool = ""
    cpu: dict[str, dict[str, float]] = {n: dict.fromkeys(procs, 0.0) for n in targets}
    for order in _rotations(list(targets), args.rounds):
        for name in order:
            before = {p: cpu_seconds(proc.pid or 0) for p, proc in procs.items()}
            result = run_throughput(targets[name] + PATH, args.connections, args.round_s, workdir)
            for p, proc in procs.items():
                cpu[name][p] += cpu_seconds(proc.pid or 0) - before[p]
            rates[name].append(result.req_per_s)
            errors[name] += result.errors
            tool = result.tool
    out: dict[str, dict[str, Any]] = {}
    for name in targets:
        num_requests = sum(rates[name]) * args.round_s
        out[name] = {
            "req_per_s": round(statistics.median(rates[name]), 1),
            "rounds_req_per_s": [round(r) for r in rates[name]],
            "errors": errors[name],
            "tool": tool,
            "cpu_us_per_req": {
                p: round(s / num_requests * 1e6, 1) for p, s in cpu[name].items() if s > 0.05
            },
        }
    return out


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


def _median_of(rounds: list[dict[str, dict[str, float]]], name: str, key: str) -> float:
    return round(statistics.median(r[name][key] for r in rounds), 3)


def _added(rounds: list[dict[str, dict[str, float]]], name: str, key: str) -> float:
    """Median over rounds of the router's percentile minus the direct one (paired)."""
    return round(statistics.median(r[name][key] - r["direct"][key] for r in rounds), 3)


def _report(
    rounds: list[dict[str, dict[str, float]]],
    throughput: dict[str, dict[str, Any]],
    internal: dict[str, float],
) -> dict[str, Any]:
    def latency(name: str) -> dict[str, float]:
        keys = ("p50_ms", "p90_ms", "p99_ms", "max_lag_ms")
        return {k: _median_of(rounds, name, k) for k in keys}

    routers: dict[str, dict[str, Any]] = {
        name: {
            "latency": latency(name),
            "added_p50_ms": _added(rounds, name, "p50_ms"),
            "added_p99_ms": _added(rounds, name, "p99_ms"),
            "throughput": throughput[name],
        }
        for name in throughput
        if name != "direct"
    }
    report: dict[str, Any] = {
        "direct": {"latency": latency("direct"), "throughput": throughput["direct"]},
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


def _ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is not a positive figure (a ratio would mean nothing)."""
    return round(a / b, 2) if b > 0 else None


def _print(report: dict[str, Any], args: argparse.Namespace) -> None:
    s = vars(args)
    print(
        f"router bench: {s['rounds']} interleaved rounds of {s['round_s']:.0f} s; open loop "
        f"{s['rate']:.0f} req/s, closed loop {s['connections']} connections; non-streaming; "
        "medians over rounds"
    )
    d = report["direct"]
    rows = [("direct (no router)", d["latency"], None, None, d["throughput"])]
    for name, r in report["routers"].items():
        rows.append((name, r["latency"], r["added_p50_ms"], r["added_p99_ms"], r["throughput"]))
    print(
        f"{'target':<20}{'p50 ms':>9}{'p99 ms':>9}{'+p50 ms':>9}{'+p99 ms':>9}"
        f"{'max req/s':>11}  cpu µs/req (per process)"
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
        f"p99 <= {i['p99_le_ms']} ms (bucket bounds, {i['count']:.0f} requests)"
    )
    if "ratios_kvstack_over_vllm_router" in report:
        print("kvstack / vllm-router:", report["ratios_kvstack_over_vllm_router"])
    print("bars:", report["bars"])
    load = report["load_average"]
    print(
        f"1-minute load average {load['before']:.1f} before, {load['after']:.1f} after "
        f"(on {os.cpu_count()} CPUs; above the CPU count the figures include waiting for a CPU)"
    )
