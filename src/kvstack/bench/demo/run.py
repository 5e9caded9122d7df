"""``kvstack demo``: prefill once, measured live — a story, then a short load comparison.

With no arguments it builds (once, cached) a small random-weight Llama and a tokenizer, starts
two vLLM engines with kvstack's connector (engines A and B, a CPU tier each and one shared disk
tier) and a third without it ("vLLM alone", on B's cores), each on its own cores through
``kvstack up``'s core plan, and tells the story of :mod:`kvstack.bench.demo.story`: a long
document prefilled once, answered by another process and after a restart, the answers token for
token those of vLLM alone. Then it sends the same requests through the router to two engines
with kvstack and to two without (``multi-round-qa`` and ``long-doc-qa``, a fixed number of
requests each, each engine's own KV cache smaller than the working set) and prints TTFT
percentiles. Without vLLM it runs on simulated engines and says so.

It writes ``demo.png`` (the story's bars and the TTFT distributions) and ``demo.json`` (the
``story`` object and the load rows) and exits non-zero if the answers differ, the control shows
that the check could not tell, or any request failed. ``--quick`` or ``KVSTACK_DEMO_QUICK=1``:
the story only (three engine starts and a restart: minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvstack.bench.demo import settings as S
from kvstack.bench.demo.ask import warm_up
from kvstack.bench.demo.load import LoadCell, measure_cell
from kvstack.bench.demo.plot import plot
from kvstack.bench.demo.report import DemoRow, print_table, verdicts, write_json
from kvstack.bench.demo.story import (
    Story,
    StoryEngines,
    make_prompts,
    print_check,
    tell_story,
)
from kvstack.bench.demo.ui import DemoConsole
from kvstack.bench.workloads.prompts import PromptBuilder, make_prompt_builder
from kvstack.stack.components import resolve_model
from kvstack.stack.config import ConnectorSpec, RouterSpec, StackConfig, StackEngineSpec
from kvstack.stack.cores import BIND_ENV, engine_core_plan
from kvstack.stack.supervisor import Stack

__all__ = ["run_demo"]

ALONE = "vllm-alone"
ENGINES = ["engine-0", "engine-1"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack demo", description=__doc__.split("\n")[0])
    p.add_argument("--engines", choices=["auto", "vllm", "sim"], default="auto")
    p.add_argument("--model", default="demo", help="demo (default), toy, toy-small or a directory")
    p.add_argument("--quick", action="store_true", help="the story only (KVSTACK_DEMO_QUICK=1)")
    p.add_argument("--requests", type=int, default=S.REQUESTS_PER_CELL,
                   help="requests per workload and mode")  # fmt: skip
    p.add_argument("--duration", type=float, help=argparse.SUPPRESS)  # deprecated: --requests
    p.add_argument("--out", default=".kvstack/demo", help="where the plot, JSON and logs go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    return p


def _engine_spec(args: argparse.Namespace, cache_on: bool) -> StackEngineSpec:
    if args.engines == "vllm":
        engine_args = ["--dtype", "float32", "--num-gpu-blocks-override", str(S.KV_BLOCKS)]
    else:
        engine_args = ["--block-size", "128", "--num-blocks", str(S.KV_BLOCKS),
                       "--prefill-tokens-per-s", str(S.SIM_PREFILL_TOKENS_PER_S),
                       "--kv-bytes-per-token", str(S.KV_BYTES_PER_TOKEN)]  # fmt: skip
    connector = ConnectorSpec(tiers=S.TIERS, chunk_size=S.CHUNK_TOKENS) if cache_on else None
    return StackEngineSpec(
        name="engine", kind=args.engines, replicas=2, model=args.model_dir,
        served_model_name="demo", connector=connector, max_model_len=S.MAX_MODEL_LEN,
        args=engine_args,
    )  # fmt: skip


def stack_config(args: argparse.Namespace, cache_on: bool, run_dir: Path) -> StackConfig:
    """Two engines behind a round-robin router (the same in both arms: the only difference is
    the kvstack cache); with the cache on, also vLLM alone on engine B's cores, unrouted."""
    engine = _engine_spec(args, cache_on)
    router = RouterSpec(port=None, policy="round_robin")
    config = StackConfig(run_dir=str(run_dir), engines=[engine], router=router)
    if not cache_on:
        return config
    plan = engine_core_plan(config)
    env = {BIND_ENV: plan.bind(ENGINES[1])} if plan is not None else {}
    alone = engine.model_copy(
        update={"name": ALONE, "replicas": 1, "connector": None, "routed": False, "env": env}
    )
    return config.model_copy(update={"engines": [engine, alone]})


def run_demo(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(argv)
    started = time.monotonic()
    if not os.environ.get("KVSTACK_LOG_LEVEL"):  # the demo shows progress; logs are in files
        logging.getLogger("kvstack.stack").setLevel(logging.WARNING)
    ui = DemoConsole(live=not args.no_progress)
    _resolve_engines(args, ui)
    quick = args.quick or os.environ.get("KVSTACK_DEMO_QUICK", "") not in ("", "0")
    if quick and not args.quick:
        args.argv.append("--quick")  # the result's command line says what ran
    out = Path(args.out)
    shutil.rmtree(out / "run", ignore_errors=True)
    with ui.phase("building the model and its tokenizer (once)"):
        args.model_dir = resolve_demo_model(args.model) if args.engines == "vllm" else "demo"
        builder = make_prompt_builder(args.model_dir if args.engines == "vllm" else "sim")
    label = _label(args)
    ui.print(f"[bold]kvstack demo[/bold]: prefill once ({label})")
    story, rows = _story_and_load(args, quick, out, builder, ui)
    return _finish(args, story, rows, out, label, time.monotonic() - started, ui)


def _resolve_engines(args: argparse.Namespace, ui: DemoConsole) -> None:
    if args.duration is not None:
        ui.print("kvstack demo: --duration is deprecated and ignored; see --requests")
    if args.engines == "auto":
        args.engines = "vllm" if importlib.util.find_spec("vllm") else "sim"
        if args.engines == "sim":
            ui.print("vLLM is not installed: running the demo on SIMULATED engines", "yellow")


def resolve_demo_model(model: str) -> str:
    """``demo``: the demo's own random-weight model (built once); else as ``kvstack up``."""
    if model != "demo":
        return resolve_model(model)
    from kvstack.models.toy import build_toy_model

    return str(build_toy_model(spec=S.DEMO_MODEL))


def _label(args: argparse.Namespace) -> str:
    if args.engines == "sim":
        return "simulated engines"
    name = Path(args.model_dir).name.rsplit("-", 1)[0]
    return f"vLLM CPU engines, random-weight {name}, float32"


def _story_and_load(
    args: argparse.Namespace, quick: bool, out: Path, builder: PromptBuilder, ui: DemoConsole
) -> tuple[Story, list[DemoRow]]:
    run_dir = out / "run" / "on"
    ui.print("starting engines A and B (kvstack, sharing one disk tier) and vLLM alone "
             "(no kvstack, on B's cores)")  # fmt: skip
    with _started(stack_config(args, True, run_dir), ui) as stack:
        _print_cores(stack, ui)
        urls = stack.endpoints()
        warm_up([urls[name] for name in [*ENGINES, ALONE]], "demo", builder, args.seed)
        engines = StoryEngines(urls[ENGINES[0]], urls[ENGINES[1]], urls[ALONE], run_dir / "kv",
                               "demo", checks_tokens=args.engines == "vllm")  # fmt: skip
        prompts = make_prompts(builder, S.DOCUMENT_TOKENS, S.QUESTION_TOKENS)
        story = tell_story(engines, prompts, lambda: _restart(stack, builder, ui), ui,
                           stop_a=lambda: stack.stop_components([ENGINES[0]]))  # fmt: skip
        print_check(story, ui)
        if quick:
            return story, []
        stack.stop_components([ALONE])
        rows = _arm(stack, "on", args, builder, ui)
    ui.print("\nstarting two engines without kvstack (vLLM's own prefix cache only)")
    with _started(stack_config(args, False, out / "run" / "off"), ui) as stack:
        rows = _arm(stack, "off", args, builder, ui) + rows
    return story, sorted(rows, key=lambda r: (list(S.WORKLOADS).index(r.workload), r.mode))


@contextlib.contextmanager
def _started(config: StackConfig, ui: DemoConsole) -> Iterator[Stack]:
    stack = Stack(config)
    try:
        yield stack.start(show_progress=ui.live)
    finally:
        stack.stop()


def _print_cores(stack: Stack, ui: DemoConsole) -> None:
    if stack.core_plan is not None:
        ui.print(f"  {stack.core_plan.summary()}", "dim")


def _restart(stack: Stack, builder: PromptBuilder, ui: DemoConsole) -> None:
    ui.print("     stopping engines A and B and starting them again (their memory is gone)")
    stack.restart(ENGINES, show_progress=ui.live)
    urls = stack.endpoints()
    warm_up([urls[name] for name in ENGINES], "demo", builder, seed=1)


def _arm(
    stack: Stack, mode: str, args: argparse.Namespace, builder: PromptBuilder, ui: DemoConsole
) -> list[DemoRow]:
    urls = [c.url for c in stack.components if c.kind == "engine" and c.routed]
    warm_up(urls, "demo", builder, args.seed)
    rows = []
    for workload, params in S.WORKLOADS.items():
        cell = LoadCell(workload, params, mode, args.requests, S.CONCURRENCY, args.seed)
        row = measure_cell(stack.url("router"), urls, cell, builder, ui.live)
        ui.print(
            f"  {workload}, kvstack {mode}: {row.requests} requests, "
            f"TTFT p50 {row.ttft_p50_s:.2f} s, p90 {row.ttft_p90_s:.2f} s"
        )
        rows.append(row)
    return rows


def _finish(args: argparse.Namespace, story: Story, rows: list[DemoRow], out: Path, label: str,
            wall_s: float, ui: DemoConsole) -> int:  # fmt: skip
    if rows:
        print_table(rows, label)
        for won, line in verdicts(rows):
            ui.print(f"  {line}", None if won else "yellow")
    document = _document(args, story, label, wall_s)
    with ui.phase("drawing the plot"):
        png = plot(document["story"], rows, out / "demo.png", label, story.checks_tokens)
    write_json(out / "demo.json", document, rows, args.argv)
    ui.print(f"plot: {png}\nnumbers: {out / 'demo.json'}\ntook {wall_s // 60:.0f} min "
             f"{wall_s % 60:.0f} s")  # fmt: skip
    return _exit_code(story, rows, ui)


def _document(args: argparse.Namespace, story: Story, label: str, wall_s: float) -> dict[str, Any]:
    return {
        "engines": args.engines,
        "label": label,
        "story": story.to_json(),
        "story_details": {
            "document_tokens": story.document_tokens,
            "question_tokens": S.QUESTION_TOKENS,
            "answer_tokens": S.ANSWER_TOKENS,
            "loaded_tokens": list(story.loaded_tokens),
            "recomputed_tokens": story.recomputed_tokens,
            "tokens_checked": story.checks_tokens,
            "reference": "vLLM alone's own prefix-cache hit, on engine B's cores",
            "control_differs": story.control_differs,
            "answers": {
                "reference": list(story.reference.token_ids),
                "other_instance": list(story.other_instance.token_ids),
                "after_restart": list(story.after_restart.token_ids),
                "control": list(story.control.token_ids) if story.control else None,
            },
        },
        "requests_per_cell": args.requests,
        "wall_s": wall_s,
    }


def _exit_code(story: Story, rows: list[DemoRow], ui: DemoConsole) -> int:
    problems = []
    if story.checks_tokens and not story.identical_tokens:
        problems.append("kvstack's answers differ from vLLM's own: this is a bug, please report it")
    if story.checks_tokens and not story.control_differs:
        problems.append("the control answered like the reference: the identity check is blind")
    failed = sum(r.errors for r in rows)
    if failed or any(r.requests == 0 for r in rows):
        problems.append(f"{failed} request(s) failed")
    for problem in problems:
        ui.print(f"kvstack demo FAILED: {problem}", "bold red")
    return 1 if problems else 0
