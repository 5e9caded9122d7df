"""``kvstack bench <name>``: each benchmark is a module exposing ``run(argv) -> int``."""

from __future__ import annotations

import importlib

__all__ = ["run"]

BENCHMARKS: dict[str, tuple[str, str]] = {
    "kv": (
        "kvstack.bench.micro.kv",
        "KV tier store/retrieve throughput against memcpy and raw file I/O",
    ),
    "fetch": (
        "kvstack.bench.micro.fetch_step",
        "a file-tier fetch beside a busy step: loader threads against a helper process",
    ),
    "serve": ("kvstack.bench.load.serve", "load generator against an OpenAI endpoint"),
    "compare": ("kvstack.bench.compare.runner", "fleet + front ends side by side, table and plots"),
    "vllm": ("kvstack.bench.micro.vllm", "TTFT with the kvstack connector on a real vLLM engine"),
    "router": ("kvstack.bench.micro.router", "router-added latency and throughput"),
    "epp": ("kvstack.bench.micro.epp", "endpoint picker decisions/s and added decision latency"),
    "index": ("kvstack.bench.micro.index", "both cluster KV index backends: lookups, announces"),
    "routers": ("kvstack.bench.routers.cli", "1, 2, 4 router replicas on one fleet: hits, goodput"),
    "shared": ("kvstack.bench.micro.shared_tiers", "Redis, S3 and peer tiers against loopback TCP"),
    "radix": ("kvstack.bench.micro.radix", "the router's radix prefix index: insert and match"),
    "lora": ("kvstack.bench.lora.cli", "adapter cache policies on the lora-zipf workload"),
    "sim": (
        "kvstack.bench.micro.sim_perf",
        "simulator capacity: one engine's req/s, a fleet on this host",
    ),
    "all": (
        "kvstack.bench.all",
        "--quick: a small run of every benchmark beside its committed figures",
    ),
    "report": (
        "kvstack.bench.report",
        "regenerate the published tables from benchmarks/results (--check: verify only)",
    ),
}


def run(command: str, argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        width = max(map(len, BENCHMARKS))
        print("usage: kvstack bench <name> [options]\n\nbenchmarks:")
        for name, (_, help_) in BENCHMARKS.items():
            print(f"  {name:<{width}}  {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(BENCHMARKS[argv[0]][0])
    result: int = module.run(argv[1:])
    return result
