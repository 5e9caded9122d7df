"""``kvstack bench serve``: drive an OpenAI endpoint with a workload and report.

    kvstack bench serve --url http://127.0.0.1:8000 --workload shared-prefix --rate 4 \\
        --duration 60 [--set groups=8 --set system_prompt_tokens=2000] [--json out.json]

Prompts are built for the endpoint's tokenizer so token counts are exact: ``--tokenizer auto``
(default) reads ``/v1/models`` and uses transformers on the model's ``root`` when it is a local
directory (a real vLLM), else the simulator's tokenizer; ``--tokenizer sim`` or a model path
force one. The report gives TTFT, time per output token, inter-token latency and end-to-end
percentiles, throughput, goodput under the SLO, error and 429 rates, overall and per priority
class, adapter and tenant tier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from kvstack.bench.config import BenchConfig
from kvstack.bench.load.loadgen import LoadPlan, LoadRun, run_load
from kvstack.bench.load.progress import progress_bar
from kvstack.bench.load.report_text import format_summary
from kvstack.bench.load.stats import SLO, RunSummary, summarize
from kvstack.bench.workloads import WORKLOADS, make_workload
from kvstack.bench.workloads.prompts import PromptBuilder, make_prompt_builder
from kvstack.errors import ConfigError
from kvstack.section import load_section

__all__ = ["ServeResult", "build_parser", "parse_sets", "run", "run_serve"]


def _workload_help() -> str:
    lines = ["workload parameters (--set KEY=VALUE):"]
    for name in WORKLOADS.names():
        fields = WORKLOADS.get(name).params_cls.model_fields
        params = ", ".join(f"{key}={field.default}" for key, field in fields.items())
        lines.append(f"  {name}: {params}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvstack bench serve",
        description="Drive an OpenAI endpoint with a workload and report latency, throughput "
        "and goodput.",
        epilog=_workload_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="base URL of the OpenAI endpoint")
    p.add_argument("--workload", required=True, choices=WORKLOADS.names())
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    load.add_argument("--concurrency", type=int, help="closed loop: concurrent users")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of issuing requests")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the arrivals")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload parameter (repeatable), e.g. --set groups=8",
    )
    p.add_argument("--model", help="model name (default: the server's first)")
    p.add_argument("--tokenizer", default="auto", help="auto, sim, or a model path")
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the server's simulated speed-up; rates and times are in simulated units",
    )
    p.add_argument("--slo-ttft", type=float, help="SLO on time to first token, seconds")
    p.add_argument("--slo-tpot", type=float, help="SLO on time per output token, seconds")
    p.add_argument("--json", type=Path, help="write the summary and every request here")
    p.add_argument(
        "--load-adapters",
        metavar="PATH",
        help="first load the workload's LoRA adapters on the endpoint from PATH",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["groups=8", "api=chat"]`` -> ``{"groups": 8, "api": "chat"}`` (YAML scalars)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    return out


async def resolve_builder(url: str, tokenizer: str) -> PromptBuilder:
    """``auto``: the model's local directory (transformers) if ``/v1/models`` names one."""
    if tokenizer != "auto":
        return await asyncio.to_thread(make_prompt_builder, tokenizer)
    from kvstack.bench.load.client import StreamClient

    async with StreamClient(url, 30) as client:
        models = await client.get_json("/v1/models")
    root = str(models["data"][0].get("root") or "")
    local = bool(root) and await asyncio.to_thread(os.path.isdir, root)
    return await asyncio.to_thread(make_prompt_builder, root if local else "sim")


async def load_adapters(url: str, names: list[str], path: str) -> None:
    """``/v1/load_lora_adapter`` for each name (an adapter already loaded is fine)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for name in names:
            body = {"lora_name": name, "lora_path": path}
            async with session.post(url + "/v1/load_lora_adapter", json=body) as resp:
                text = await resp.text()
                if resp.status != 200 and "already been loaded" not in text:
                    raise ConfigError(f"loading adapter {name!r} failed ({resp.status}): {text}")


class ServeResult:
    """A finished run: the raw load run, its summary and the JSON document."""

    def __init__(self, run: LoadRun, summary: RunSummary, document: dict[str, Any]) -> None:
        self.run = run
        self.summary = summary
        self.document = document


async def run_serve(
    url: str,
    workload_name: str,
    params: dict[str, Any],
    plan: LoadPlan,
    slo: SLO,
    tokenizer: str = "auto",
    model: str | None = None,
    progress: bool = False,
    adapter_path: str | None = None,
) -> ServeResult:
    builder = await resolve_builder(url, tokenizer)
    workload = make_workload(workload_name, params, builder, plan.seed)
    if adapter_path:
        await load_adapters(url, workload.adapters(), adapter_path)
    with progress_bar(workload_name, progress) as callback:
        run = await run_load(url, workload, plan, model, callback)
    summary = summarize(run.results, run.duration_s, slo)
    document = {
        "url": url,
        "model": run.model,
        "workload": workload.describe(),
        "plan": {
            "rate": plan.rate,
            "concurrency": plan.concurrency,
            "duration_s": plan.duration_s,
            "seed": plan.seed,
            "time_scale": plan.time_scale,
        },
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "summary": summary.to_dict(),
        "requests": [r.record() for r in run.results],
    }
    return ServeResult(run, summary, document)


def run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_section("bench", BenchConfig)
        params = parse_sets(args.set)
        plan = LoadPlan(
            rate=args.rate,
            concurrency=args.concurrency,
            duration_s=args.duration,
            seed=args.seed,
            time_scale=args.time_scale,
            drain_timeout_s=config.drain_timeout_s,
            timeout_s=config.timeout_s,
        )
        slo = SLO(args.slo_ttft or config.slo_ttft_s, args.slo_tpot or config.slo_tpot_s)
        result = asyncio.run(
            run_serve(
                args.url,
                args.workload,
                params,
                plan,
                slo,
                args.tokenizer,
                args.model,
                progress=not args.no_progress,
                adapter_path=args.load_adapters,
            )
        )
    except (ConfigError, ValueError) as exc:
        print(f"kvstack bench serve: {exc}", file=sys.stderr)
        return 2
    print(format_summary(result.document, result.summary))
    if args.json:
        args.json.write_text(json.dumps(result.document, indent=1))
        print(f"wrote {args.json}")
    return 0
