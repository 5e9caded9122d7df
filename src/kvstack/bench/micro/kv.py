"""``kvstack bench kv [--json FILE] [--quick] [--dir DIR] [--rounds N] [--threads N] [--clock C]
[--shared] [--s3] [--device D]``

Store and retrieve throughput of each KV tier in GB/s on the chunk shape of Llama-3-8B (32
layers, 8 KV heads, head dim 128, bf16: 32 MiB per 256-token chunk) and of a small model, against
a memcpy and raw file write/read references measured in the same rounds (see
:mod:`kvstack.bench.micro.kv_measure`; each ratio is per round, then the median and range over
rounds), plus the time to look up a 128K-token prompt (512 chunks). The cluster secret is on
and off in the same run: ``cpu+mac`` and ``file+mac`` are the tiers of a cache that has it,
``cpu+verify`` what checking a MAC on every CPU-tier hit would cost. Prints the tables the
docs publish (:mod:`kvstack.bench.micro.kv_report`) and ends with
:func:`kvstack.bench.results.save`: ``--json FILE``, else ``bench-results/kv/``. The result::

    {"memcpy_gbps": x, "file_write_gbps": x, "file_read_gbps": x,
     "tiers": {"cpu": {"store_gbps": x, "store_ratio": x, "store_ratio_spread": {...}, ...}},
     "lookup_ms_128k": x, "shapes": {name: {"references": {...}, "tiers": {...},
     "samples": {...}}}, "bars": {...}, "settings": {...}, "args": {...}}

where the top-level figures are the Llama-3-8B shape's. ``--dir`` sets where files go (default:
a temporary directory; the figures describe that filesystem). ``--clock cpu`` times with this
process's CPU time instead of elapsed time (see :data:`kvstack.bench.micro.kv_measure.CLOCKS`).
``--shared`` adds the shared tiers of the same run — Redis batched get and peer fetch of
32 MiB chunks against loopback TCP (``--s3``: and S3 on moto's server), as ``kvstack bench
shared`` measures them — under ``"shared"``. ``--device cuda`` measures instead the store and
retrieve of chunks on the GPU (:mod:`kvstack.bench.micro.kv_device`).
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvstack.bench.micro import kv_report
from kvstack.bench.micro.kv_figures import ShapeResult
from kvstack.bench.micro.kv_measure import CLOCKS, Shape, Variant, measure_shape
from kvstack.bench.results import save
from kvstack.errors import require
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig
from kvstack.kv.tensors import torch

__all__ = ["positive_int", "run"]

MAIN_SHAPE = Shape("llama-3-8b", 32, 8, 128, 256, torch.bfloat16)  # 32 MiB per chunk
SMALL_SHAPE = Shape("toy-150m", 12, 4, 64, 256, torch.float16)  # 3 MiB per chunk
LOOKUP_TOKENS = 128 * 1024
VARIANTS = [
    Variant("file", False, "none"),
    Variant("file+fsync", True, "none"),
    Variant("file+zstd", False, "zstd"),
    Variant("file+lz4", False, "lz4"),
    Variant("file+mac", False, "none", mac=True),  # with the cluster secret
]
# (tier, operation, bar as a fraction of the reference) on the main shape.
BARS = [
    ("cpu", "store", 0.8),
    ("cpu", "retrieve", 0.8),
    ("cpu+mac", "store", 0.8),  # the same bar with the cluster secret on
    ("cpu+mac", "retrieve", 0.8),
    ("file", "store", 0.7),
    ("file", "retrieve", 0.7),
    ("file+fsync", "store", 0.7),
    ("file+fsync", "retrieve", 0.7),
]
LOOKUP_BAR_MS = 5.0


def run(argv: list[str]) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    if args.device:
        from kvstack.bench.micro.kv_device import run_device

        device = run_device(MAIN_SHAPE, args.device, args.quick, args.rounds, args.dir)
        save("kv", argv, {**device, "args": vars(args)}, args.json, started=started)
        return 0 if device["byte_identical"] else 1
    require("rich", "bench")  # the progress display; names the extra if missing
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if args.threads:
        torch.set_num_threads(args.threads)
    chunks = {MAIN_SHAPE.name: 3 if args.quick else 8, SMALL_SHAPE.name: 8 if args.quick else 32}
    rounds = args.rounds or (2 if args.quick else 6)  # even: both orders equally often
    root = Path(tempfile.mkdtemp(prefix="kvstack-bench-kv-", dir=args.dir))
    err = Console(stderr=True)  # the progress goes to stderr: stdout has the tables
    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as progress:
            task = progress.add_task("starting", total=None)

            def step(text: str) -> None:
                progress.update(task, description=text)

            results = [
                measure_shape(
                    shape,
                    chunks[shape.name],
                    rounds,
                    root / shape.name,
                    VARIANTS,
                    step,
                    CLOCKS[args.clock],
                )
                for shape in (MAIN_SHAPE, SMALL_SHAPE)
            ]
            step("lookup of a 128K-token prompt")
            lookup = measure_lookup(root / "lookup", reps=20 if args.quick else 50)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = build_report(results, lookup, _settings(args, rounds, chunks, root))
    report["args"] = vars(args)
    print(kv_report.markdown(report))
    if args.shared:
        from kvstack.bench.micro import shared_report, shared_tiers

        print()
        shared = shared_tiers.run_shared_tier_bench(
            1 if args.quick else 8, 1 if args.quick else 7, args.s3
        )
        print(shared_report.markdown(shared))
        report["shared"] = shared
    save("kv", argv, report, args.json, started=started)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench kv", description=__doc__.split("\n\n")[1])
    p.add_argument("--json", metavar="FILE", help="the result file (default: bench-results/kv/)")
    p.add_argument("--quick", action="store_true", help="fewer chunks and rounds (smoke test)")
    p.add_argument("--dir", help="directory for the file tiers (default: the system temp dir)")
    p.add_argument("--rounds", type=positive_int, help="rounds per figure (median taken)")
    p.add_argument("--threads", type=positive_int, help="torch threads (default: torch's)")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: elapsed time (default); cpu: this process's CPU time, steadier on a busy "
        "shared machine but blind to disk waits (fsync figures are then meaningless)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="also the shared tiers: Redis and peer against loopback TCP (needs redis-server)",
    )
    p.add_argument("--s3", action="store_true", help="with --shared: also S3 on moto's server")
    p.add_argument(
        "--device",
        help="store and retrieve chunks that live on this torch device (cuda, cuda:1; cpu runs "
        "the same path on CPU tensors) against PyTorch's pinned copy (kv_device)",
    )
    return p


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def measure_lookup(root: Path, reps: int) -> dict[str, float]:
    """Median milliseconds of ``KVCache.lookup`` on a 128K-token prompt whose 512 chunks are
    all stored (the longest walk), from a list and a numpy array, and on a miss."""
    rng = random.Random(0)
    tokens = [rng.randrange(128_000) for _ in range(LOOKUP_TOKENS)]
    config = KVConfig(
        model="bench@1",
        chunk_size=256,
        tiers=["cpu://?size=160MiB", f"file://{root}?size=1GiB"],
    )
    with KVCache(config) as cache:
        cache.store(tokens, torch.zeros(2, 2, LOOKUP_TOKENS, 2, 64, dtype=torch.float16))
        cache.flush()
        if cache.lookup(tokens) != LOOKUP_TOKENS:
            raise RuntimeError("the lookup benchmark's prompt was not fully stored")
        import numpy as np

        array = np.array(tokens, dtype=np.int64)
        missing = [7, *tokens[1:]]  # the first chunk differs: nothing matches
        disk_only = KVCache(config, tiers=cache.tiers[1:])
        return {
            "hit_list_ms": _median_ms(lambda: cache.lookup(tokens), reps),
            "hit_numpy_ms": _median_ms(lambda: cache.lookup(array), reps),
            "hit_file_tier_only_ms": _median_ms(lambda: disk_only.lookup(tokens), reps),
            "miss_ms": _median_ms(lambda: cache.lookup(missing), reps),
        }


def _median_ms(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def build_report(
    results: list[ShapeResult], lookup: dict[str, float], settings: dict[str, Any]
) -> dict[str, Any]:
    main = results[0]
    report: dict[str, Any] = {
        "memcpy_gbps": main.memcpy_gbps,
        "file_write_gbps": main.file_write_gbps,
        "file_read_gbps": main.file_read_gbps,
        "file_write_fsync_gbps": main.file_write_fsync_gbps,
        "tiers": {name: asdict(t) for name, t in main.tiers.items()},
        "lookup_ms_128k": lookup["hit_list_ms"],
        "lookup": lookup,
        "shapes": {r.shape: asdict(r) for r in results},
        "settings": settings,
    }
    bars: dict[str, Any] = {}
    for tier, op, bar in BARS:
        ratio = getattr(main.tiers[tier], f"{op}_ratio")
        bars[f"{tier} {op}"] = {"ratio": ratio, "bar": bar, "ok": ratio >= bar}
    ms = lookup["hit_list_ms"]
    bars["lookup 128K"] = {"ms": ms, "bar_ms": LOOKUP_BAR_MS, "ok": ms < LOOKUP_BAR_MS}
    report["bars"] = bars
    return report


def _settings(
    args: argparse.Namespace, rounds: int, chunks: dict[str, int], root: Path
) -> dict[str, Any]:
    return {
        "quick": args.quick,
        "rounds": rounds,
        "chunks": chunks,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "dir": str(root.parent),
        "filesystem": _filesystem(root.parent),
    }


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (from /proc/mounts; "unknown" elsewhere)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    best = ("", "unknown")
    resolved = str(path.resolve())
    for fields in mounts:
        point = fields[1]
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, fields[2])
    return best[1]
