"""``kvstack demo``: two engines behind the router, the kvstack cache off and then on.

With no arguments it builds (once, cached) a small random-weight Llama and a tokenizer, starts
two real vLLM engines (or simulated ones when vLLM is not installed, labelled as such) behind
the kvstack router, and runs the ``multi-round-qa`` and ``long-doc-qa`` workloads twice:

- **off**: plain vLLM engines (their own prefix cache only);
- **on**: every engine with kvstack's connector (a CPU tier each, one shared disk tier).

Each engine's own KV cache holds only part of the working set, as in production, and requests
are routed round-robin in both modes, so the only difference is the kvstack cache (the router's
cache-aware policies are compared by ``kvstack bench compare``).

It prints TTFT p50/p90, throughput and the share of prompt tokens served from a cache, writes a
PNG plot and the numbers as JSON, and exits non-zero if any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstack.bench.demo.engine_metrics import cache_counters
from kvstack.bench.demo.report import DemoRow, plot, print_table
from kvstack.bench.load.loadgen import LoadPlan
from kvstack.bench.load.serve import run_serve
from kvstack.bench.load.stats import SLO
from kvstack.stack.components import resolve_model
from kvstack.stack.config import ConnectorSpec, RouterSpec, StackConfig, StackEngineSpec
from kvstack.stack.supervisor import Stack

__all__ = ["run_demo"]

WORKLOADS: dict[str, dict[str, Any]] = {
    "multi-round-qa": {
        "num_users": 4, "num_rounds": 3, "system_prompt_tokens": 600,
        "user_context_tokens": 1200, "question_tokens": 40, "output_tokens": 24,
    },
    "long-doc-qa": {
        "num_documents": 3, "document_tokens": 3000, "question_tokens": 30, "output_tokens": 24,
    },
}  # fmt: skip
QUICK_SCALE = 0.25


def _params(name: str, quick: bool) -> dict[str, Any]:
    params = dict(WORKLOADS[name])
    if quick:
        for key, value in params.items():
            if key.endswith("_tokens") and key != "output_tokens":
                params[key] = max(64, int(value * QUICK_SCALE))
    return params


def stack_config(args: argparse.Namespace, cache_on: bool, run_dir: Path) -> StackConfig:
    """Two engines whose own KV cache holds only part of the working set (as in production,
    where many users and documents compete for GPU memory), round-robin routing in both
    modes so that the only difference is the kvstack cache."""
    blocks, max_len = (12, 1024) if args.quick else (40, 4096)
    connector = None
    if cache_on:
        connector = ConnectorSpec(tiers=["cpu://?size=512MiB", "file://{run_dir}/kv?size=4GiB"])
    if args.engines == "vllm":
        engine_args = ["--num-gpu-blocks-override", str(blocks)]
    else:  # the simulator, timed like the ~150M model on two CPU cores
        engine_args = ["--block-size", "128", "--num-blocks", str(blocks)]
        engine_args += ["--prefill-tokens-per-s", "1100", "--kv-bytes-per-token", "12288"]
    engine = StackEngineSpec(
        name="engine",
        kind=args.engines,
        replicas=2,
        model=args.model,
        served_model_name="demo",
        connector=connector,
        max_model_len=max_len,
        args=engine_args,
    )
    return StackConfig(
        run_dir=str(run_dir), engines=[engine], router=RouterSpec(port=None, policy="round_robin")
    )


async def _measure(
    stack: Stack, workload: str, mode: str, args: argparse.Namespace, tokenizer: str
) -> DemoRow:
    before = await asyncio.to_thread(cache_counters, stack.engine_urls())
    plan = LoadPlan(concurrency=2, duration_s=args.duration, seed=args.seed, timeout_s=600)
    result = await run_serve(
        stack.url("router"), workload, _params(workload, args.quick), plan, SLO(None, None),
        tokenizer=tokenizer, model="demo", progress=not args.no_progress,
    )  # fmt: skip
    after = await asyncio.to_thread(cache_counters, stack.engine_urls())
    s = result.summary.overall
    return DemoRow(
        workload=workload,
        mode=mode,
        requests=s.num_requests,
        errors=s.num_errors,
        ttft_p50_s=s.ttft_s.p50 or 0.0,
        ttft_p90_s=s.ttft_s.p90 or 0.0,
        output_tokens_per_s=s.output_throughput,
        cache_hit_rate=after.hit_rate_since(before),
    )


def run_demo(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="kvstack demo", description=__doc__.split("\n")[0])
    p.add_argument("--engines", choices=["auto", "vllm", "sim"], default="auto")
    p.add_argument("--model", default="toy-small", help="toy, toy-small or a model directory")
    p.add_argument("--duration", type=float, default=None, help="seconds per workload and mode")
    p.add_argument("--quick", action="store_true", help="tiny model, short prompts and runs (CI)")
    p.add_argument("--out", default=".kvstack/demo", help="where the plot, JSON and logs go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.engines == "auto":
        args.engines = "vllm" if importlib.util.find_spec("vllm") else "sim"
        if args.engines == "sim":
            print("vLLM is not installed: running the demo on SIMULATED engines")
    if args.quick and args.model == "toy-small":
        args.model = "toy"
    args.duration = args.duration or (12.0 if args.quick else 45.0)
    out = Path(args.out)
    shutil.rmtree(out / "run", ignore_errors=True)
    tokenizer = resolve_model(args.model) if args.engines == "vllm" else "sim"
    rows = [row for mode in ("off", "on") for row in _run_mode(args, mode, out, tokenizer)]
    label = "simulated engines" if args.engines == "sim" else f"vLLM engines, model {args.model}"
    print_table(rows, label)
    png = plot(rows, out / "demo.png", label)
    (out / "demo.json").write_text(json.dumps([asdict(r) for r in rows], indent=2))
    print(f"plot: {png}\nnumbers: {out / 'demo.json'}")
    failed = sum(r.errors for r in rows)
    if failed or any(r.requests == 0 for r in rows):
        print(f"kvstack demo: {failed} request(s) failed")
        return 1
    return 0


def _run_mode(args: argparse.Namespace, mode: str, out: Path, tokenizer: str) -> list[DemoRow]:
    run_dir = out / "run" / mode
    print(f"\n== kvstack cache {mode.upper()}: starting 2 {args.engines} engines and the router")
    with Stack(stack_config(args, mode == "on", run_dir)) as stack:
        return [
            asyncio.run(_measure(stack, workload, mode, args, tokenizer)) for workload in WORKLOADS
        ]
