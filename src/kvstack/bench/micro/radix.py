"""``kvstack bench radix``: the router's prefix radix tree — match and insert of a long prompt
on a large tree (see :mod:`kvstack.bench.micro.radix_measure` for the method).

The bar from the issue: insert and match of a 32K-token prompt on a tree of 1M tokens well
under a millisecond. Figures are wall-clock latency per operation (``perf_counter``) with this
thread's CPU time beside it (``thread_time``), p50 and p99 of each over ``--rounds`` fresh
queries, next to the cost of merely copying the query, measured in the same run; the bar is
judged on the wall clock. Prints the table the docs publish
(:mod:`kvstack.bench.micro.radix_report`) and ends with :func:`kvstack.bench.results.save`
(``--json FILE``, else ``bench-results/radix/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from kvstack.bench.micro import radix_report
from kvstack.bench.micro.radix_measure import run_radix_bench
from kvstack.bench.results import save

__all__ = ["run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench radix", description=__doc__.split("\n")[0])
    p.add_argument("--tree-tokens", type=int, default=1_000_000, help="tokens in the tree")
    p.add_argument("--prompt-tokens", type=int, default=32_768, help="tokens per query")
    p.add_argument("--page-size", type=int, default=16, help="tokens per page")
    p.add_argument("--backends", type=int, default=16, help="owners holding the tree")
    p.add_argument("--rounds", type=int, default=300, help="queries per operation")
    p.add_argument("--seed", type=int, default=0, help="seed of the token streams")
    p.add_argument("--json", type=Path, help="the result file (default: bench-results/radix/)")
    return p


def run(argv: list[str]) -> int:
    started = time.time()
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
    document = dataclasses.asdict(result)
    document["bar_us"] = radix_report.BAR_US
    document["load_average"] = {"before": load_before, "after": os.getloadavg()[0]}
    document["args"] = vars(args)
    print(radix_report.markdown(document))
    save("radix", argv, document, args.json, started=started)
    return 0
