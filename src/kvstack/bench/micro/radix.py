"""``kvstack bench radix``: the router's prefix radix tree — match and insert of a long prompt
on a large tree (see :mod:`kvstack.bench.micro.radix_measure` for the method).

The bar from the issue: insert and match of a 32K-token prompt on a tree of 1M tokens well
under a millisecond. Figures are CPU time per operation (thread time), medians and p99 over
``--rounds`` fresh queries, next to the cost of merely copying the query, measured in the same
run. ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from kvstack.bench.micro.radix_measure import RadixBenchResult, Timing, run_radix_bench

__all__ = ["run"]

BAR_US = 1000.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench radix", description=__doc__.split("\n")[0])
    p.add_argument("--tree-tokens", type=int, default=1_000_000, help="tokens in the tree")
    p.add_argument("--prompt-tokens", type=int, default=32_768, help="tokens per query")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page")
    p.add_argument("--backends", type=int, default=16, help="owners holding the tree")
    p.add_argument("--rounds", type=int, default=300, help="queries per operation")
    p.add_argument("--seed", type=int, default=0, help="seed of the token streams")
    p.add_argument("--json", type=Path, help="write all figures to this file")
    return p


def _row(name: str, t: Timing, ref: Timing) -> str:
    return (
        f"| {name} | {t.p50_us:,.0f} | {t.p99_us:,.0f} | {t.mean_us:,.0f} "
        f"| {t.p50_us / ref.p50_us:.1f}x |"
    )


def report(r: RadixBenchResult) -> str:
    lines = [
        f"tree: {r.tree_tokens:,} tokens in {r.tree_nodes:,} nodes (built in {r.build_s:.1f} s); "
        f"query: {r.prompt_tokens:,} tokens, {r.matched_tokens:,} matched on average",
        "",
        "| operation | p50 µs | p99 µs | mean µs | p50 vs copy |",
        "|---|---:|---:|---:|---:|",
        _row("match (every owner's prefix)", r.match, r.copy_reference),
        _row("insert (one owner)", r.insert, r.copy_reference),
        _row("match + insert", r.match_insert, r.copy_reference),
        _row("reference: list(tokens)", r.copy_reference, r.copy_reference),
    ]
    verdict = "meets" if r.match_insert.p50_us < BAR_US else "MISSES"
    lines.append(f"\nmatch + insert p50 {r.match_insert.p50_us:,.0f} µs: {verdict} the 1 ms bar")
    return "\n".join(lines)


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    load_before = os.getloadavg()[0]
    result = run_radix_bench(
        tree_tokens=args.tree_tokens,
        prompt_tokens=args.prompt_tokens,
        page_size=args.page_size,
        num_backends=args.backends,
        rounds=args.rounds,
        seed=args.seed,
    )
    print(report(result))
    load_after = os.getloadavg()[0]
    print(f"load average: {load_before:.2f} before, {load_after:.2f} after (CPU time per op)")
    if args.json:
        document = dataclasses.asdict(result)
        document["load_average"] = {"before": load_before, "after": load_after}
        args.json.write_text(json.dumps(document, indent=1))
    return 0
