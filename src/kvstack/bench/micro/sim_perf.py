"""``kvstack bench sim``: how much traffic the simulator carries on this machine.

1. **One engine**: short requests (32-token prompt, 16 or 4 streamed tokens) in a closed loop
   against one ``kvstack sim-engine`` process with a large time scale (so the modelled GPU is
   never the limit), and, as the reference measured in the same run with the same client,
   against a trivial canned upstream (``kvstack.bench.micro.router_upstream``: 4-chunk streams, no
   simulation). Reports requests/s and the ratio.
2. **A fleet**: N engines in one process at time scale S, a router in front, this process as
   the load generator, all on this machine; at each simulated rate, the client's mean TTFT
   against the engines' own (the modelled one), the engines' step lag, and each process's CPU.
   A rate "fits" when the engines lost under 5% of the run to lag, the three processes used
   under 90% of the CPUs, and nothing failed. The client's TTFT exceeds the engines' by the
   wall time the router and HTTP add, multiplied by the time scale (the price of running
   faster than real time, the same for every front end); it is reported, not judged. On a host
   shared with other work that test says more about the neighbours than about the simulator,
   so each point also reports the CPU milliseconds each process spent per request and the
   rate those costs would allow if the processes had this host's CPUs to themselves.

Prints each figure as it is measured and ends with :func:`kvstack.bench.results.save`
(``--json FILE``, else ``bench-results/sim/``); :mod:`kvstack.bench.micro.sim_report` renders
the published tables from that result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvstack.bench.compare.experiment import FleetSpec, FrontendSpec
from kvstack.bench.compare.fleet import SimBenchFleet
from kvstack.bench.compare.frontends import FrontendProcess
from kvstack.bench.load.loadgen import LoadPlan
from kvstack.bench.load.serve import run_serve
from kvstack.bench.load.stats import SLO
from kvstack.bench.results import save
from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

__all__ = ["FleetPoint", "SinglePoint", "run"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass(frozen=True)
class SinglePoint:
    target: str
    output_tokens: int
    requests_per_s: float
    server_cpu_s_per_request: float


@dataclass(frozen=True)
class FleetPoint:
    rate: float
    requests: int
    errors: int
    client_ttft_mean_s: float
    engine_ttft_mean_s: float
    ttft_ratio: float
    lag_share: float  # max over engines of lag wall seconds / run wall seconds
    cpu_share: dict[str, float]  # process -> CPU seconds per wall second
    cpu_ms_per_request: dict[str, float]  # process -> CPU milliseconds per request
    projected_wall_rps: float  # requests/s these processes could carry on the CPUs here
    fits: bool


def _closed_loop(url: str, output_tokens: int, duration_s: float, concurrency: int) -> float:
    plan = LoadPlan(concurrency=concurrency, duration_s=duration_s, drain_timeout_s=10)
    params = {"prompt_tokens": 32, "output_tokens": output_tokens}
    result = asyncio.run(run_serve(url, "unique", params, plan, SLO(), tokenizer="sim"))
    return result.summary.overall.request_throughput


def single_engine(workdir: Path, duration_s: float, concurrency: int) -> list[SinglePoint]:
    out = []
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvstack",
        "sim-engine",
        "--port",
        str(port),
        "--time-scale",
        "1000",
        "--max-num-seqs",
        "1024",
    ]
    with ManagedProcess("sim", argv, workdir / "sim-single.log") as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_healthy(url + "/health", 60)
        for tokens in (16, 4):
            before = cpu_s(proc.pid or 0)
            rps = _closed_loop(url, tokens, duration_s, concurrency)
            used = cpu_s(proc.pid or 0) - before
            out.append(SinglePoint("sim-engine", tokens, rps, used / max(rps * duration_s, 1)))
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvstack.bench.micro.router_upstream",
        "--port",
        str(port),
        "--model",
        "sim-model",
    ]
    with ManagedProcess("upstream", argv, workdir / "upstream.log") as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_healthy(url + "/health", 60)
        before = cpu_s(proc.pid or 0)
        rps = _closed_loop(url, 4, duration_s, concurrency)
        used = cpu_s(proc.pid or 0) - before
        out.append(SinglePoint("canned upstream", 4, rps, used / max(rps * duration_s, 1)))
    return out


def _engine_ttft_and_lag(urls: list[str]) -> tuple[float, float]:
    total = count = 0.0
    lag = 0.0
    with httpx.Client(timeout=30) as client:
        for url in urls:
            text = client.get(url + "/metrics").text
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "vllm:time_to_first_token_seconds_sum":
                        total += s.value
                    elif s.name == "vllm:time_to_first_token_seconds_count":
                        count += s.value
                    elif s.name == "kvstack_sim_step_lag_seconds_total":
                        lag = max(lag, s.value)
    return (total / count if count else 0.0), lag


def fleet_point(args: argparse.Namespace, rate: float, workdir: Path) -> FleetPoint:
    sim = {
        "time_scale": args.time_scale,
        "num_blocks": args.num_blocks,
        "stream_interval": args.stream_interval,
    }
    fleet = SimBenchFleet(FleetSpec(kind="sim", engines=args.engines, sim=sim), workdir, 120)
    fleet.start()
    try:
        front = FrontendSpec(name="router", preset=args.router)
        with FrontendProcess(front, fleet, workdir / "router.log", 120) as url:
            assert fleet.proc is not None and fleet.proc.pid is not None
            pids = {"fleet": fleet.proc.pid}
            router_proc = _frontend_pid(url)
            if router_proc:
                pids["router"] = router_proc
            before = {k: cpu_s(p) for k, p in pids.items()}
            client_before, wall_before = time.process_time(), time.perf_counter()
            plan = LoadPlan(
                rate=rate,
                duration_s=args.duration,
                seed=0,
                time_scale=args.time_scale,
                drain_timeout_s=30,
            )
            params = {
                "groups": args.groups,
                "users_per_group": 4,
                "system_prompt_tokens": args.prefix_tokens,
                "question_tokens": 64,
                "output_tokens": args.output_tokens,
            }
            result = asyncio.run(run_serve(url, "shared-prefix", params, plan, SLO(), "sim"))
            wall = time.perf_counter() - wall_before
            used = {k: cpu_s(p) - before[k] for k, p in pids.items()}
            used["loadgen"] = time.process_time() - client_before
        engine_ttft, lag = _engine_ttft_and_lag(fleet.urls)
    finally:
        fleet.stop()
    o = result.summary.overall
    share = {k: v / wall for k, v in used.items()}
    per_request = {k: v * 1e3 / max(o.num_requests, 1) for k, v in used.items()}
    projected = (os.cpu_count() or 1) * 1e3 / max(sum(per_request.values()), 1e-9)
    client_ttft = o.ttft_s.mean or 0.0
    ratio = client_ttft / engine_ttft if engine_ttft else 0.0
    lag_share = lag / wall
    busy = sum(share.values()) / (os.cpu_count() or 1)
    fits = lag_share < 0.05 and busy < 0.9 and o.num_errors == 0
    return FleetPoint(
        rate, o.num_requests, o.num_errors, client_ttft, engine_ttft, ratio, lag_share, share,
        per_request, projected, fits,
    )  # fmt: skip


def _frontend_pid(url: str) -> int | None:
    """The pid listening on the front end's port (from /proc/net/tcp and /proc/*/fd)."""
    port = int(url.rsplit(":", 1)[1])
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if int(parts[1].split(":")[1], 16) == port and parts[3] == "0A":
            inode = parts[9]
    if inode is None:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    return None


def cpu_pressure() -> str:
    """The host's CPU pressure (PSI: share of time some task waited for a CPU), if known."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"
    return line.split()[1].removeprefix("avg10=") + "%"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench sim", description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["single", "fleet", "all"], default="all")
    p.add_argument("--duration", type=float, default=60.0, help="fleet: simulated seconds per rate")
    p.add_argument("--single-duration", type=float, default=8.0, help="one engine: wall seconds")
    p.add_argument("--concurrency", type=int, default=64, help="one engine: closed-loop users")
    p.add_argument("--engines", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--num-blocks", type=int, default=2048)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument(
        "--rates", default="2,4,8,16", help="fleet: simulated requests/s, comma-separated"
    )
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--prefix-tokens", type=int, default=2000)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--router", default="kvstack-router:least_load", help="frontend preset")
    p.add_argument("--json", type=Path, help="the result file (default: bench-results/sim/)")
    p.add_argument("--workdir", type=Path, default=Path("bench-results/sim"))
    return p


def _print_single(points: list[SinglePoint]) -> None:
    ref = next((p for p in points if p.target == "canned upstream"), None)
    print(
        f"one engine, closed loop, 32-token prompts, streamed ({os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[0]:.1f}, CPU pressure {cpu_pressure()}):"
    )
    for p in points:
        ratio = (
            f"  ({p.requests_per_s / ref.requests_per_s:.2f} x the canned upstream)" if ref else ""
        )
        print(
            f"  {p.target:<16} {p.output_tokens:>2} tokens: {p.requests_per_s:8.0f} req/s, "
            f"server {p.server_cpu_s_per_request * 1e3:.2f} ms CPU/request{ratio}"
        )


def _print_fleet(args: argparse.Namespace, points: list[FleetPoint]) -> None:
    print(
        f"fleet: {args.engines} engines in one process at time scale {args.time_scale}, "
        f"{args.router}, load generator here; shared-prefix {args.groups} groups x "
        f"{args.prefix_tokens} tokens, {args.output_tokens} output tokens; CPU pressure "
        f"{cpu_pressure()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    for p in points:
        added_ms = (p.client_ttft_mean_s - p.engine_ttft_mean_s) / args.time_scale * 1e3
        cpu = ", ".join(
            f"{k} {p.cpu_share[k]:.0%} ({p.cpu_ms_per_request[k]:.1f} ms/req)" for k in p.cpu_share
        )
        print(
            f"  rate {p.rate:>5g}/s (x{args.time_scale:g} = {p.rate * args.time_scale:g}/s wall): "
            f"{p.requests} req, TTFT client {p.client_ttft_mean_s:.3f} s vs engine "
            f"{p.engine_ttft_mean_s:.3f} s (+{added_ms:.1f} ms wall), lag {p.lag_share:.1%}, "
            f"CPU {cpu} -> {'fits' if p.fits else 'does not fit'}; the CPUs here could carry "
            f"{p.projected_wall_rps:.0f}/s wall = {p.projected_wall_rps / args.time_scale:.1f}/s "
            "simulated"
        )


def run(argv: list[str]) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"args": vars(args), "cpus": os.cpu_count()}
    if args.part in ("single", "all"):
        single = single_engine(args.workdir, args.single_duration, args.concurrency)
        _print_single(single)
        document["single"] = [asdict(p) for p in single]
        document["single_load"] = _load()
    if args.part in ("fleet", "all"):
        points = []
        for rate in (float(r) for r in args.rates.split(",")):
            points.append(fleet_point(args, rate, args.workdir))
            _print_fleet(args, points[-1:])
        document["fleet"] = [asdict(p) for p in points]
        document["fleet_load"] = _load()
        fitting = [p.rate for p in points if p.fits]
        document["highest_fitting_rate"] = max(fitting) if fitting else None
        print(f"highest simulated rate that fits: {max(fitting) if fitting else 'none'}")
    save("sim", argv, document, args.json, started=started)
    return 0


def _load() -> dict[str, Any]:
    """Other work on this host when a part ended: load average and CPU pressure."""
    return {"load_average": round(os.getloadavg()[0], 2), "cpu_pressure": cpu_pressure()}
