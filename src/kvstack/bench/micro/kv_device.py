"""``kvstack bench kv --device cuda``: store and retrieve chunks that live on the device.

``KVCache.put_chunks`` of device tensors into a ``cpu://`` tier (pinned with ``pin_memory=true``
on CUDA) and a ``file://`` tier, and ``get_chunks_into`` device tensors, on the chunk shape of
``kvstack bench kv`` (Llama-3-8B, 32 MiB chunks). The reference, measured in the same rounds
over the same bytes: PyTorch's own pinned ``copy_(non_blocking=True)`` device-to-host (store) and
host-to-device (retrieve). Every retrieve is compared byte for byte with what was stored.
``--device cpu`` runs the same code on CPU tensors (the reference is then a memcpy).
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
from pathlib import Path
from typing import Any

from kvstack.bench.micro.gpu_measure import timed, torch_copy, with_index
from kvstack.bench.micro.kv_measure import Shape, kv_like
from kvstack.kv.cache import KVCache
from kvstack.kv.config import KVConfig
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import torch

__all__ = ["measure_device_tiers", "print_device_report", "run_device"]


def run_device(
    shape: Shape, device: str, quick: bool, rounds: int | None, root: str | None
) -> dict[str, Any]:
    """``kvstack bench kv --device DEVICE``: measure and print; the caller saves the result."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"kvstack bench kv: --device {device}, but torch sees no CUDA device")
    target = with_index(torch.device(device))
    report = measure_device_tiers(
        shape, 3 if quick else 8, rounds or (2 if quick else 6), target,
        Path(root) if root else None,
    )  # fmt: skip
    print_device_report(report)
    return report


def measure_device_tiers(
    shape: Shape, num_chunks: int, rounds: int, device: torch.device, root: Path | None = None
) -> dict[str, Any]:
    """Median GB/s (and spread) of each tier's store and retrieve of device chunks, the
    reference copies, their per-round ratios, and whether every byte came back."""
    cuda = device.type == "cuda"
    chunks = [kv_like(shape, i).to(device) for i in range(num_chunks)]
    outs = [torch.empty_like(c) for c in chunks]
    host = [torch.empty(c.shape, dtype=c.dtype, pin_memory=cuda) for c in chunks]
    total = num_chunks * shape.chunk_bytes
    size_mib = 2 * total // 2**20 + 16
    stream = torch.cuda.Stream(device) if cuda else None  # type: ignore[no-untyped-call]
    samples: dict[str, list[float]] = {}
    identical = True
    with tempfile.TemporaryDirectory(prefix="kvstack-bench-kv-device-", dir=root) as tmp:
        tiers = {
            "cpu": f"cpu://?size={size_mib}MiB&pin_memory={'true' if cuda else 'false'}",
            "file": f"file://{tmp}?size={2 * size_mib}MiB",
        }
        for name, url in tiers.items():
            config = KVConfig(model="bench-device@1", chunk_size=shape.chunk_tokens, tiers=[url])
            with KVCache(config) as cache:
                for r in range(rounds + 1):  # round 0 warms up (arena faulted in, pinned)
                    keys = [_key(f"{name}-{r}-{i}") for i in range(num_chunks)]
                    figures = _one_round(cache, keys, chunks, outs, host, stream)
                    identical &= all(
                        torch.equal(_u8(o), _u8(c)) for o, c in zip(outs, chunks, strict=True)
                    )
                    for figure, seconds in figures.items():
                        if r:
                            samples.setdefault(f"{name}.{figure}", []).append(total / seconds / 1e9)
    return _summary(shape, num_chunks, device, samples, identical)


def _one_round(
    cache: KVCache,
    keys: list[ChunkKey],
    chunks: list[torch.Tensor],
    outs: list[torch.Tensor],
    host: list[torch.Tensor],
    stream: torch.cuda.Stream | None,
) -> dict[str, float]:
    device = chunks[0].device
    for out in outs:
        out.zero_()
    figures = {
        "ref_store": sum(torch_copy(h, c, stream) for h, c in zip(host, chunks, strict=True)),
        "store": timed(device, lambda: _store(cache, keys, chunks)),
        "ref_retrieve": sum(torch_copy(o, h, stream) for o, h in zip(outs, host, strict=True)),
    }
    for out in outs:
        out.zero_()
    figures["retrieve"] = timed(device, lambda: _retrieve(cache, keys, outs))
    return figures


def _store(cache: KVCache, keys: list[ChunkKey], chunks: list[torch.Tensor]) -> None:
    if cache.put_chunks(keys, chunks) != len(keys) or not cache.flush():
        raise RuntimeError("the cache did not store every benchmark chunk")


def _retrieve(cache: KVCache, keys: list[ChunkKey], outs: list[torch.Tensor]) -> None:
    if cache.get_chunks_into(keys, outs) != len(keys):
        raise RuntimeError("the cache missed a chunk it had just stored")


def _summary(
    shape: Shape, num_chunks: int, device: torch.device, samples: dict[str, list[float]],
    identical: bool,
) -> dict[str, Any]:  # fmt: skip
    def spread(name: str) -> dict[str, float]:
        values = samples[name]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def ratio(name: str, ref: str) -> float:
        return statistics.median(a / b for a, b in zip(samples[name], samples[ref], strict=True))

    tiers = {
        tier: {
            "store_gbps": spread(f"{tier}.store"),
            "retrieve_gbps": spread(f"{tier}.retrieve"),
            "ref_store_gbps": spread(f"{tier}.ref_store"),
            "ref_retrieve_gbps": spread(f"{tier}.ref_retrieve"),
            "store_ratio": ratio(f"{tier}.store", f"{tier}.ref_store"),
            "retrieve_ratio": ratio(f"{tier}.retrieve", f"{tier}.ref_retrieve"),
        }
        for tier in ("cpu", "file")
    }
    return {
        "shape": shape.name,
        "device": str(device),
        "chunk_bytes": shape.chunk_bytes,
        "num_chunks": num_chunks,
        "rounds": len(samples["cpu.store"]),
        "tiers": tiers,
        "byte_identical": identical,
    }


def print_device_report(report: dict[str, Any]) -> None:
    print(
        f"kvstack bench kv on {report['device']}: {report['shape']}, "
        f"{report['num_chunks']} chunks of {report['chunk_bytes'] / 2**20:.1f} MiB, "
        f"median of {report['rounds']} (min-max); reference: PyTorch's copy_ of the same bytes "
        "(pinned, non-blocking on CUDA)"
    )
    for tier, t in report["tiers"].items():
        for op in ("store", "retrieve"):
            g, ref = t[f"{op}_gbps"], t[f"ref_{op}_gbps"]
            print(
                f"  {tier:5} {op:8} {g['median']:7.2f} GB/s ({g['min']:.2f}-{g['max']:.2f})"
                f"  ref {ref['median']:7.2f}  ratio {t[f'{op}_ratio']:.2f}x"
            )
    print(f"  byte-identical: {report['byte_identical']}")


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _key(text: str) -> ChunkKey:
    return ChunkKey(hashlib.blake2b(text.encode(), digest_size=16).digest())
