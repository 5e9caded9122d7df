"""Processes and probes for ``kvstack bench router``: the upstream, the routers, the loads.

Everything under test runs as its own process (own interpreter, own event loop), like in
production, and the load comes from yet another process: ``wrk`` when installed (C, so it takes
the least CPU from the system under test), else :mod:`kvstack.bench.micro.router_loadgen`. CPU
seconds of each process are read from ``/proc`` around a run to show where the two cores went.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess

__all__ = [
    "ThroughputResult",
    "cpu_seconds",
    "run_open_loop",
    "run_throughput",
    "start_kvstack_router",
    "start_upstream",
    "start_vllm_router",
    "vllm_router_binary",
]

_POST_LUA = """wrk.method = "POST"
wrk.body = '{"model": "fast-model", "prompt": "hello world", "max_tokens": 1}'
wrk.headers["Content-Type"] = "application/json"
"""


def vllm_router_binary() -> str | None:
    local = Path(sys.executable).with_name("vllm-router")
    return str(local) if local.exists() else shutil.which("vllm-router")


def start_upstream(ports: list[int], logs: Path) -> ManagedProcess:
    """Started and healthy (each ``start_*`` returns a started process; the caller stops it)."""
    argv = [sys.executable, "-m", "kvstack.bench.micro.router_upstream"]
    argv += [x for p in ports for x in ("--port", str(p))]
    proc = ManagedProcess("upstream", argv, logs / "upstream.log")
    return _healthy(proc, [f"http://127.0.0.1:{p}/health" for p in ports])


def start_kvstack_router(port: int, backends: list[str], policy: str, logs: Path) -> ManagedProcess:
    argv = [sys.executable, "-m", "kvstack", "router", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--policy", policy]
    argv += [x for url in backends for x in ("--backend", url)]
    env = dict(os.environ, KVSTACK_LOG_LEVEL="WARNING")
    proc = ManagedProcess(f"kvstack-router-{policy}", argv, logs / f"kvstack-{policy}.log", env)
    return _healthy(proc, [f"http://127.0.0.1:{port}/health"])


def start_vllm_router(binary: str, port: int, backends: list[str], logs: Path) -> ManagedProcess:
    argv = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin"]
    argv += ["--log-level", "warning", "--worker-urls", *backends]
    # Its Prometheus exporter binds a fixed default port: give it a free one.
    argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    proc = ManagedProcess("vllm-router", argv, logs / "vllm-router.log")
    return _healthy(proc, [f"http://127.0.0.1:{port}/health"])


def _healthy(proc: ManagedProcess, urls: list[str], timeout_s: float = 60.0) -> ManagedProcess:
    """Start ``proc`` and wait for every URL; stop it again if that fails."""
    proc.start()
    try:
        for url in urls:
            proc.wait_healthy(url, timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its threads (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_open_loop(url: str, rate: float, duration_s: float, out: Path) -> dict[str, float]:
    """Open-loop latency at ``rate`` from a separate loadgen process; its summary dict."""
    argv = [sys.executable, "-m", "kvstack.bench.micro.router_loadgen", "--url", url]
    argv += ["--rate", str(rate), "--duration-s", str(duration_s), "--json", str(out)]
    subprocess.run(argv, check=True, capture_output=True, timeout=duration_s + 120)
    summary: dict[str, float] = json.loads(out.read_text())["summary"]
    return summary


@dataclass(frozen=True)
class ThroughputResult:
    req_per_s: float
    errors: int
    p50_ms: float
    p99_ms: float
    tool: str


def run_throughput(
    url: str, connections: int, duration_s: float, workdir: Path
) -> ThroughputResult:
    """Closed-loop maximum: wrk with one thread when installed, else the Python loadgen."""
    wrk = shutil.which("wrk")
    if wrk is None:
        argv = [sys.executable, "-m", "kvstack.bench.micro.router_loadgen", "--url", url]
        argv += ["--connections", str(connections), "--duration-s", str(duration_s)]
        done = subprocess.run(argv, check=True, capture_output=True, text=True)
        s = json.loads(done.stdout.strip().splitlines()[-1])
        return ThroughputResult(s["req_per_s"], s["errors"], s["p50_ms"], s["p99_ms"], "loadgen")
    script = workdir / "post.lua"
    script.write_text(_POST_LUA)
    argv = [wrk, "-t1", f"-c{connections}", f"-d{duration_s:.0f}s", "--latency", "-s"]
    argv += [str(script), url]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return _parse_wrk(done.stdout)


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _parse_wrk(text: str) -> ThroughputResult:
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", text))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", text))

    def pct(p: str) -> float:
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\b", text, re.MULTILINE)
        return float(m.group(1)) * _UNITS_MS[m.group(2)] if m else float("nan")

    return ThroughputResult(rate, errors, pct("50"), pct("99"), "wrk")
