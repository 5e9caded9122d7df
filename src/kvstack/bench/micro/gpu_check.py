"""The GPU check of the connector's data path (run by ``benchmarks/gpu/check.py``).

For each model shape (Llama-3-8B; Llama-3-70B's share of one GPU at TP=8), KV dtype (bf16,
fp8 copied as bytes) and paged layout (per-layer, cross-layer; :mod:`.paged_layouts`), on one
request of ``tokens`` tokens in 256-token chunks:

1. the connector's copy-out (device to pinned host) and load (pinned host to device) against
   PyTorch's pinned non-blocking ``copy_`` of the same bytes, alternating which runs first, the
   ratio taken per round (:mod:`.gpu_measure`); the loaded blocks must equal the source blocks;
2. round trips through ``SaveQueue`` and ``SyncLoader`` into a ``cpu://`` tier (pinned on CUDA)
   and a ``file://`` tier, byte-identical or reported as not;
3. a matmul on the compute stream alone and with the transfer running (:mod:`.gpu_overlap`).

Once per run: the link's peak as PyTorch measures it (one large pinned copy each way) and
``kvstack bench kv --device`` on the same device (:mod:`.kv_device`). :func:`run_check` returns
one JSON-able dict; :mod:`.gpu_report` prints it and judges the targets.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kvstack.bench.micro import gpu_measure as m
from kvstack.bench.micro.gpu_overlap import measure_overlap
from kvstack.bench.micro.gpu_report import WAYS
from kvstack.bench.micro.kv import MAIN_SHAPE
from kvstack.bench.micro.kv_device import measure_device_tiers
from kvstack.bench.micro.kv_measure import Shape
from kvstack.bench.micro.paged_layouts import LAYOUTS, PagedShape, build_paged
from kvstack.integrations.vllm.streams import CopyStream, make_stream
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig
from kvstack.kv.tensors import torch

__all__ = ["CheckPlan", "plan_for", "run_check", "spread"]

BLOCK_SIZE = 16  # vLLM's default on GPUs
SHAPES = (
    PagedShape("llama-3-8b", 32, 8, 128, BLOCK_SIZE, torch.bfloat16),
    PagedShape("llama-3-70b-tp8", 80, 1, 128, BLOCK_SIZE, torch.bfloat16),  # 8 KV heads / 8
)
SMALL_SHAPES = (PagedShape("small", 4, 2, 32, BLOCK_SIZE, torch.bfloat16),)
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


@dataclass(frozen=True)
class CheckPlan:
    device: str
    shapes: tuple[PagedShape, ...]
    tokens: int  # one request's prompt
    chunk_tokens: int
    rounds: int  # copy figures per configuration
    round_trips: int  # per tier and configuration
    matmul_n: int
    matmul_iters: int
    overlap_rounds: int
    link_bytes: int
    kv_bench_shape: Shape  # kvstack bench kv --device: its chunk shape and count
    kv_bench_chunks: int


def plan_for(device: str, small: bool) -> CheckPlan:
    """The full check on a GPU (under 3 minutes on one H200), or small shapes for CI."""
    if small:
        small_kv = Shape("small", 4, 2, 32, 64, torch.bfloat16)
        return CheckPlan(device, SMALL_SHAPES, 256, 64, 2, 1, 128, 4, 1, 8 << 20, small_kv, 2)
    return CheckPlan(device, SHAPES, 4096, 256, 7, 3, 8192, 40, 3, 1 << 30, MAIN_SHAPE, 8)


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated measurements, with the measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "samples": values,
    }


def run_check(
    plan: CheckPlan, root: Path | None, step: Callable[[str], None] = print
) -> dict[str, Any]:
    device = m.with_index(torch.device(plan.device))
    plan = replace(plan, device=str(device))
    step("link peak")
    result: dict[str, Any] = {"plan": _plan_json(plan), "link_peak": _link_peak(plan, device)}
    result["configs"] = []
    for shape in plan.shapes:
        for dtype_name, dtype in DTYPES.items():
            for layout in LAYOUTS:
                step(f"{shape.name} {dtype_name} {layout}")
                config = _check_config(plan, shape._replace(dtype=dtype), layout, root)
                result["configs"].append({"dtype": dtype_name, **config})
    step("kvstack bench kv on the device")
    result["kv_bench"] = measure_device_tiers(
        plan.kv_bench_shape, plan.kv_bench_chunks, plan.rounds, device, root
    )
    return result


def _plan_json(plan: CheckPlan) -> dict[str, Any]:
    out = asdict(plan)
    out["shapes"] = [
        {**s._asdict(), "dtype": str(s.dtype), "page_bytes": s.page_bytes} for s in plan.shapes
    ]
    kv = plan.kv_bench_shape
    out["kv_bench_shape"] = {**kv._asdict(), "dtype": str(kv.dtype), "chunk_bytes": kv.chunk_bytes}
    return out


def _link_peak(plan: CheckPlan, device: torch.device) -> dict[str, Any]:
    """One large pinned copy each way: what the link gives PyTorch (GB/s)."""
    dev = torch.empty(plan.link_bytes, dtype=torch.uint8, device=device)
    host = torch.empty(plan.link_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    stream = _side_stream(device)
    m.torch_copy(host, dev, stream)  # warm-up
    d2h = [plan.link_bytes / m.torch_copy(host, dev, stream) / 1e9 for _ in range(plan.rounds)]
    h2d = [plan.link_bytes / m.torch_copy(dev, host, stream) / 1e9 for _ in range(plan.rounds)]
    return {"bytes": plan.link_bytes, "d2h_gbps": spread(d2h), "h2d_gbps": spread(h2d)}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    if device.type != "cuda":
        return None
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _check_config(
    plan: CheckPlan, shape: PagedShape, layout: str, root: Path | None
) -> dict[str, Any]:
    device = torch.device(plan.device)
    per_chunk, num_chunks = plan.chunk_tokens // shape.block_size, plan.tokens // plan.chunk_tokens
    alloc = build_paged(shape, layout, 2 * num_chunks * per_chunk + 2, device)
    t = m.PagedTransfer.plan(alloc, num_chunks, per_chunk)
    copies = _copies(plan, t)
    transfer_s = copies.pop("_transfer_s")
    trips = {tier: _round_trips(plan, t, tier, root) for tier in ("cpu", "file")}
    overlap = measure_overlap(t, transfer_s, plan.matmul_n, plan.matmul_iters, plan.overlap_rounds)
    del alloc, t
    return {
        "shape": shape.name,
        "layout": layout,
        "page_bytes": shape.page_bytes,
        "request_bytes": num_chunks * per_chunk * shape.page_bytes * shape.num_layers,
        **copies,
        "round_trips": trips,
        "overlap": {
            "matmul": f"{plan.matmul_iters} x mm({plan.matmul_n}x{plan.matmul_n})",
            "alone_ms": spread([s * 1e3 for s in overlap.alone_s]),
            "with_transfer_ms": spread([s * 1e3 for s in overlap.with_transfer_s]),
            "slowdown": overlap.slowdown,
            "transfer_repeats": overlap.transfer_repeats,
            "covered": overlap.covered,
            "with_torch_ms": spread([s * 1e3 for s in overlap.with_torch_s]),
            "torch_slowdown": overlap.torch_slowdown,
            "torch_repeats": overlap.torch_repeats,
            "torch_covered": overlap.torch_covered,
        },
    }


def _copies(plan: CheckPlan, t: m.PagedTransfer) -> dict[str, Any]:
    device = t.paged.device
    dev = torch.empty(t.num_bytes, dtype=torch.uint8, device=device)
    host = torch.empty(t.num_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    side = _side_stream(device)
    out_stream = make_stream(device, True, "kvstack-copy-out")
    load_stream = make_stream(device, True, "kvstack-load", follow_compute=False)
    layer_stream = make_stream(device, True, "kvstack-layers")  # SyncLoader's, when pipelined
    seconds: dict[str, list[float]] = {k: [] for k in TIMED}
    identical = True
    try:
        for r in range(plan.rounds + 1):  # round 0 warms up
            m.clear_blocks(t.paged, t.dst_chunks)
            runs = _timed_runs(t, host, dev, side, (out_stream, load_stream, layer_stream))
            for way in runs:
                if r % 2:  # the other order in odd rounds: neither always runs first
                    way.reverse()
                for name, run in way:
                    took = run()
                    if r:
                        seconds[name].append(took)
                    if name.startswith("h2d"):  # each load must have written every byte
                        identical &= m.pages_equal(t.paged, t.src_chunks, t.dst_chunks)
                        m.clear_blocks(t.paged, t.dst_chunks)
    finally:
        out_stream.close()
        load_stream.close()
        layer_stream.close()
    transfer_s = statistics.median(seconds["d2h"]) + statistics.median(seconds["h2d"])
    figures = _copy_figures(t.num_bytes, seconds)
    return {**figures, "copy_byte_identical": identical, "_transfer_s": transfer_s}


# The connector's copies (gpu_report.WAYS) and PyTorch's copy of the same bytes, per direction.
TIMED = ("torch_d2h", "torch_h2d", *WAYS)


def _timed_runs(
    t: m.PagedTransfer,
    host: torch.Tensor,
    dev: torch.Tensor,
    side: torch.cuda.Stream | None,
    streams: tuple[CopyStream, CopyStream, CopyStream],
) -> list[list[tuple[str, Callable[[], float]]]]:
    out_stream, load_stream, layer_stream = streams
    return [
        [
            ("torch_d2h", lambda: m.torch_copy(host, dev, side)),
            ("d2h", lambda: m.connector_d2h(t, out_stream)),
            ("d2h_layers", lambda: m.connector_d2h(t, out_stream, per_layer=True)),
        ],
        [
            ("torch_h2d", lambda: m.torch_copy(dev, host, side)),
            ("h2d", lambda: m.connector_h2d(t, load_stream)),
            ("h2d_layers", lambda: m.connector_h2d(t, layer_stream, per_layer=True)),
        ],
    ]


def _copy_figures(num_bytes: int, seconds: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for way in WAYS:
        mine, ref = seconds[way], seconds[f"torch_{way[:3]}"]
        out[way] = {
            "connector_gbps": spread([num_bytes / s / 1e9 for s in mine]),
            "torch_gbps": spread([num_bytes / s / 1e9 for s in ref]),
            # per round: the connector over PyTorch in the same round (seconds apart)
            "ratio": spread([b / a for a, b in zip(mine, ref, strict=True)]),
        }
    return out


def _round_trips(
    plan: CheckPlan, t: m.PagedTransfer, tier: str, root: Path | None
) -> dict[str, Any]:
    cuda = t.paged.device.type == "cuda"
    size_mib = 2 * t.num_bytes // 2**20 + 8
    with tempfile.TemporaryDirectory(prefix="kvstack-gpu-check-", dir=root) as tmp:
        url = {
            "cpu": f"cpu://?size={size_mib}MiB&pin_memory={'true' if cuda else 'false'}",
            "file": f"file://{tmp}?size={2 * size_mib}MiB",
        }[tier]
        config = KVConfig(model="gpu-check@1", chunk_size=plan.chunk_tokens, tiers=[url])
        with KVCache(config) as cache:
            trips = [m.round_trip(t, cache, f"{tier}-{r}") for r in range(plan.round_trips + 1)]
    trips = trips[1:]  # the first warms up (arena faulted in and pinned, files created)
    return {
        "url": url.replace(tmp, "<tmp>"),
        "store_gbps": spread([t.num_bytes / x.store_s / 1e9 for x in trips]),
        "retrieve_gbps": spread([t.num_bytes / x.retrieve_s / 1e9 for x in trips]),
        "stored_chunks": [x.stored_chunks for x in trips],
        "loaded_blocks": [x.loaded_blocks for x in trips],
        "expected_chunks": len(t.src_chunks),
        "byte_identical": all(x.byte_identical for x in trips),
    }
