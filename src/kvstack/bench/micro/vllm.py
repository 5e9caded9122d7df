"""``kvstack bench vllm``: TTFT with the kvstack connector in real vLLM engines.

Scenarios, each the median of ``--reps`` prompts of ``--prompt-tokens`` random tokens:

- ``cold``: no cache anywhere (plain vLLM);
- ``vllm_prefix_hit``: vLLM's own prefix cache, same instance, second request;
- ``kvstack_cpu_hit``: the kvstack CPU tier, same instance, after vLLM's own cache has lost the
  blocks (emulated with vLLM's ``/reset_prefix_cache``: the preemption and capacity case);
- ``kvstack_cross_instance``: another engine process loads through the shared ``file://`` tier,
  started after the engine that stored the chunks was stopped (so it has the cores to itself);
- ``kvstack_disk_restart``: an engine restarted with the file tier only and the chunk files
  dropped from the page cache (``posix_fadvise(DONTNEED)``, checked with ``fincore``);
- ``example_connector``: vLLM's bundled ExampleConnector at the longest prompt it handles, with
  kvstack at the same length for comparison.

The connector's overhead on unique prompts is not measured here (a median of a few TTFTs on
engines minutes apart cannot show a few percent): ``--scenario overhead`` measures it in paired,
interleaved rounds with an interval.

Prints a table and saves the result file (:func:`kvstack.bench.results.save`: ``--json FILE``,
else ``bench-results/vllm/``). Uses the ~150M-parameter toy Llama unless ``--quick``.
``--scenario`` picks another measurement instead (interference, multi-turn, preemption,
overhead, pipelining: :mod:`kvstack.bench.micro.vllm_scenarios`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvstack.bench import results as bench_results
from kvstack.bench.micro.vllm_harness import drop_page_cache
from kvstack.bench.micro.vllm_probe import PromptFactory, reset_prefix_cache, ttft
from kvstack.bench.micro.vllm_scenarios import SCENARIOS, run_scenario
from kvstack.models.toy import SMALL, TINY, build_toy_model
from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec, connector_config

__all__ = ["run"]

# Rounds of --scenario overhead / pipelining unless --reps says otherwise: enough for a
# distribution-free 95% interval of the median ratio (x(14)-x(27) of 40).
PAIRED_ROUNDS, PAIRED_ROUNDS_QUICK = 40, 6


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = _work_dir(args)
        self.model = build_toy_model(spec=TINY if args.quick else SMALL)
        self.prompts = PromptFactory(seed=args.seed)
        self.results: dict[str, Any] = {
            "scenario": "ttft",
            "prompt_tokens": args.prompt_tokens,
            "reps": args.reps,
            "model": self.model.name,
            "args": {"quick": args.quick, "seed": args.seed, "skip": sorted(args.skip)},
        }
        self.kv_dir = self.work / "kv"

    @contextlib.contextmanager
    def engine(
        self, name: str, kv_transfer: dict[str, Any] | None, prefix_caching: bool = True
    ) -> Iterator[VLLMServer]:
        extra = [] if prefix_caching else ["--no-enable-prefix-caching"]
        spec = VLLMServerSpec(
            model=str(self.model),
            port=free_port(),
            served_model_name="bench",
            max_model_len=max(16384, self.args.prompt_tokens + 64),
            kv_transfer_config=kv_transfer,
            extra_args=extra,
            env={"VLLM_SERVER_DEV_MODE": "1"},
        )
        server = VLLMServer(spec, self.work / f"{name}.log", start_timeout_s=600)
        print(f"  starting {name} ...", flush=True)
        server.start()
        try:
            yield server
        finally:
            server.stop()

    def kvstack(self, tiers: list[str]) -> dict[str, Any]:
        return connector_config(tiers, chunk_size=256)

    def sample(self, key: str, fn: Callable[[], float]) -> float:
        return self.median(key, [fn() for _ in range(self.args.reps)])

    def median(self, key: str, samples: list[float]) -> float:
        """The median of figure ``key``'s samples; every sample is kept in ``samples_s``."""
        self.results.setdefault("samples_s", {})[key] = samples
        return float(statistics.median(samples))

    # -- scenarios ---------------------------------------------------------------------------
    def plain(self) -> None:
        n = self.args.prompt_tokens
        with self.engine("plain", None) as e:
            ttft(e, self.prompts(256))  # warm up
            self.results["cold_s"] = self.sample("cold_s", lambda: ttft(e, self.prompts(n)))
            p = self.prompts(n)
            ttft(e, p)
            self.results["vllm_prefix_hit_s"] = self.sample("vllm_prefix_hit_s", lambda: ttft(e, p))

    def kvstack_same_instance(self) -> None:
        n = self.args.prompt_tokens
        tiers = ["cpu://?size=4GiB", f"file://{self.kv_dir}?size=20GiB"]
        with self.engine("kvstack-a", self.kvstack(tiers)) as e:
            ttft(e, self.prompts(256))
            self.results["kvstack_cold_s"] = self.sample(
                "kvstack_cold_s", lambda: ttft(e, self.prompts(n))
            )
            p = self.prompts(n)
            ttft(e, p)

            def cpu_hit() -> float:
                reset_prefix_cache(e)
                return ttft(e, p)

            self.results["kvstack_cpu_hit_s"] = self.sample("kvstack_cpu_hit_s", cpu_hit)
            self.cross = [self.prompts(n) for _ in range(self.args.reps)]
            self.disk = [self.prompts(n) for _ in range(self.args.reps)]
            for q in self.cross + self.disk:
                ttft(e, q)
        # Engine A is stopped (which flushes its file tier's writes) before B starts: B is
        # measured with the cores to itself, as another machine sharing the tier would be.
        self.results["cross_instance_storing_engine"] = "stopped"
        with self.engine("kvstack-b", self.kvstack(tiers)) as b:
            ttft(b, self.prompts(256))
            samples = [ttft(b, q) for q in self.cross]
            self.results["kvstack_cross_instance_s"] = self.median(
                "kvstack_cross_instance_s", samples
            )

    def kvstack_restart(self) -> None:
        resident = drop_page_cache(self.kv_dir)
        self.results["page_cache_after_drop_bytes"] = resident
        tiers = [f"file://{self.kv_dir}?size=20GiB"]
        with self.engine("kvstack-restarted", self.kvstack(tiers)) as e:
            samples = [ttft(e, q) for q in self.disk]
            self.results["kvstack_disk_restart_s"] = self.median("kvstack_disk_restart_s", samples)

    def example_connector(self) -> None:
        """vLLM's bundled ExampleConnector: cold then hit at the longest length it survives."""
        path = self.work / "example"
        outcome: dict[str, Any] = {}
        for n in (
            self.args.prompt_tokens,
            self.args.prompt_tokens // 2,
            self.args.prompt_tokens // 4,
        ):
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
            config = {
                "kv_connector": "ExampleConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(path)},
            }
            with self.engine(f"example-{n}", config, prefix_caching=False) as e:
                try:
                    p = self.prompts(n)
                    cold = ttft(e, p)
                    hit = self.sample(f"example_connector_{n}_hit_s", functools.partial(ttft, e, p))
                except Exception as exc:  # the engine dies or errors on long prompts
                    outcome.setdefault("failed", []).append(
                        {"prompt_tokens": n, "error": repr(exc)[:200]}
                    )
                    continue
            outcome.update({"prompt_tokens": n, "cold_s": cold, "hit_s": hit})
            break
        self.results["example_connector"] = outcome
        if "prompt_tokens" in outcome:
            self.kvstack_at(outcome["prompt_tokens"])

    def kvstack_at(self, n: int) -> None:
        tiers = ["cpu://?size=4GiB", f"file://{self.work / 'kv-example-len'}?size=20GiB"]
        with self.engine("kvstack-same-length", self.kvstack(tiers), prefix_caching=False) as e:
            p = self.prompts(n)
            cold = ttft(e, p)
            self.results["kvstack_at_example_length"] = {
                "prompt_tokens": n,
                "cold_s": cold,
                "hit_s": self.sample("kvstack_at_example_length_hit_s", lambda: ttft(e, p)),
            }


def summarize(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    cold = r.get("cold_s", float("nan"))
    hit = r.get("vllm_prefix_hit_s", float("nan"))
    rows = []
    for key, label in (
        ("cold_s", "cold (plain vLLM)"),
        ("vllm_prefix_hit_s", "vLLM prefix hit, same instance"),
        ("kvstack_cold_s", "cold with kvstack (stores)"),
        ("kvstack_cpu_hit_s", "kvstack CPU tier, after vLLM evicted"),
        ("kvstack_cross_instance_s", "kvstack, another instance (file tier)"),
        ("kvstack_disk_restart_s", "kvstack disk tier after restart, cold page cache"),
    ):
        if key in r:
            v = r[key]
            rows.append(
                (label, f"{v * 1000:.0f} ms", f"{v / hit:.2f}x vLLM hit, 1/{cold / v:.1f} cold")
            )
    return rows


def print_report(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"TTFT, {r['prompt_tokens']}-token prompt (median of {r['reps']})")
    for col in ("scenario", "TTFT", "ratio"):
        table.add_column(col)
    for row in summarize(r):
        table.add_row(*row)
    ex = r.get("example_connector", {})
    if "prompt_tokens" in ex:
        k = r.get("kvstack_at_example_length", {})
        table.add_row(
            f"ExampleConnector at {ex['prompt_tokens']} tokens: cold / hit",
            f"{ex['cold_s'] * 1000:.0f} / {ex['hit_s'] * 1000:.0f} ms",
            f"kvstack same length: {k.get('cold_s', 0) * 1000:.0f}"
            f" / {k.get('hit_s', 0) * 1000:.0f} ms",
        )
    for failure in ex.get("failed", []):
        table.add_row(
            f"ExampleConnector at {failure['prompt_tokens']} tokens",
            "failed",
            failure["error"][:60],
        )
    Console().print(table)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstack bench vllm", description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the result file here (default: bench-results/vllm/)")
    parser.add_argument("--quick", action="store_true", help="tiny model, short prompts, 1 rep")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt length (default 8192, 2048 with --quick); the overhead and pipelining "
        "scenarios use a quarter of it, at least 256",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"prompts per TTFT figure (default 3); rounds of --scenario overhead and pipelining "
        f"(default {PAIRED_ROUNDS})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="where logs and tiers go (default: a temp dir)")
    parser.add_argument("--skip", action="append", default=[], choices=["example", "restart"])
    parser.add_argument("--scenario", choices=["ttft", *SCENARIOS], default="ttft")
    parser.add_argument(
        "--preempt-blocks", type=int, default=48, help="KV blocks for --scenario preemption"
    )
    parser.add_argument(
        "--background-arm",
        action="store_true",
        help="--scenario overhead: also a third engine with copy_out: background",
    )
    parser.add_argument(
        "--poll-s",
        type=float,
        default=0.0,
        help="--scenario interference: scrape /metrics this often during each load (and the "
        "quiet window) to measure ITL while an async load is in flight; 0 (default): no "
        "scrapes, which cost a small host's API server most of a core at 0.05",
    )
    parser.add_argument(
        "--finish-wait",
        type=float,
        default=0.0,
        help="--scenario interference: the connector's load_finish_wait on every kvstack arm "
        "(the opt-in bounded wait at a step's end for a load about to finish); 0 (default): "
        "the connector's default, off",
    )
    parser.add_argument(
        "--load-fetch",
        choices=("thread", "process"),
        default="thread",
        help="--scenario interference: the connector's load_fetch on every kvstack arm: "
        "thread (default, the connector's default) or process (the opt-in fetch helper "
        "process)",
    )
    parser.add_argument(
        "--file-readers",
        type=int,
        default=0,
        help="--scenario interference: the file tier's reader threads (its URL's readers=) on "
        "every kvstack arm that loads from it; 0 (default): the tier's default",
    )
    args = parser.parse_args(argv)
    started = time.time()
    args.prompt_tokens = args.prompt_tokens or (2048 if args.quick else 8192)
    args.reps = args.reps or _default_reps(args)
    if args.scenario != "ttft":
        return _scenario(args, argv, started)
    bench = Bench(args)
    print(f"kvstack bench vllm: model {bench.model.name}, work dir {bench.work}", flush=True)
    bench.plain()
    bench.kvstack_same_instance()
    if "restart" not in args.skip:
        bench.kvstack_restart()
    if "example" not in args.skip:
        bench.example_connector()
    print_report(bench.results)
    bench_results.save("vllm", argv, bench.results, path=args.json, started=started)
    return 0


TOKEN_COUNTING_SCENARIOS = ("preemption", "multi-turn")


def _work_dir(args: argparse.Namespace) -> Path:
    """``--work-dir``, created if missing (the engines' logs and the tiers' files go in it at
    once), or a fresh temporary directory."""
    if not args.work_dir:
        return Path(tempfile.mkdtemp(prefix="kvstack-bench-vllm-"))
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    return work


def _default_reps(args: argparse.Namespace) -> int:
    if args.scenario in ("overhead", "pipelining"):
        return PAIRED_ROUNDS_QUICK if args.quick else PAIRED_ROUNDS
    return 1 if args.quick else 3


def _scenario(args: argparse.Namespace, argv: list[str], started: float) -> int:
    work = _work_dir(args)
    # Preemption and multi-turn count tokens (recomputed; served from the tiers), not seconds:
    # the tiny model shows them in minutes, at the full prompt sizes.
    small = not args.quick and args.scenario not in TOKEN_COUNTING_SCENARIOS
    model = build_toy_model(spec=SMALL if small else TINY)
    print(f"kvstack bench vllm --scenario {args.scenario}: model {model.name}, work dir {work}")
    run_scenario(args, argv, model, work, started)
    return 0
