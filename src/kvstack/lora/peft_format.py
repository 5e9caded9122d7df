"""Checks of the PEFT LoRA format without loading any weights.

``inspect_adapter(dir, base, …)`` reads ``adapter_config.json`` and the safetensors header
(8-byte little-endian length, then JSON) and checks: LoRA only, no DoRA, no extra modules;
every tensor is a ``lora_A``/``lora_B`` weight of a target module in a layer the base model
has, with the shapes that module and the rank imply; offsets are contiguous and cover the file
exactly; the file is no larger than its rank and the base model's dimensions allow.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstack.errors import VerificationError
from kvstack.lora.basemodel import BaseModelDims

__all__ = ["AdapterInfo", "TensorInfo", "inspect_adapter", "read_safetensors_header"]

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_HEADER_BYTES = 16 << 20
_TENSOR_RE = re.compile(
    r"^base_model\.model\.(?:.*\.)?layers\.(?P<layer>\d+)\.(?:.*\.)?(?P<module>[A-Za-z0-9_]+)"
    r"\.lora_(?P<ab>[AB])\.weight$"
)
_HEADER_SLACK_BYTES = 64 << 10  # JSON header: names and offsets, ~200 bytes per tensor


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    num_tensors: int
    weights_bytes: int


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """Parse and check a safetensors header; tensors sorted by offset."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise VerificationError("bad_header", f"{path.name} is shorter than 8 bytes")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise VerificationError("bad_header", f"{path.name}: header length {length} too big")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError:
        raise VerificationError("bad_header", f"{path.name}: header is not JSON") from None
    if not isinstance(header, dict):
        raise VerificationError("bad_header", f"{path.name}: header is not an object")
    header.pop("__metadata__", None)
    tensors = sorted(
        (_tensor(name, entry) for name, entry in header.items()), key=lambda t: t.start
    )
    _check_layout(path.name, tensors, size - 8 - length)
    return tensors


def _tensor(name: str, entry: Any) -> TensorInfo:
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        info = TensorInfo(name, str(dtype), tuple(int(d) for d in shape), int(start), int(end))
    except (KeyError, TypeError, ValueError):
        raise VerificationError("bad_header", f"tensor {name!r}: malformed entry") from None
    if info.dtype not in _DTYPE_BYTES:
        raise VerificationError("bad_header", f"tensor {name!r}: unsupported dtype {info.dtype}")
    return info


def _check_layout(file: str, tensors: list[TensorInfo], data_bytes: int) -> None:
    offset = 0
    for t in tensors:
        expected = _DTYPE_BYTES[t.dtype]
        for dim in t.shape:
            expected *= dim
        if t.start != offset or t.end - t.start != expected:
            raise VerificationError("bad_header", f"{file}: tensor {t.name!r} has bad offsets")
        offset = t.end
    if offset != data_bytes:
        raise VerificationError(
            "bad_header", f"{file}: tensors cover {offset} bytes but the data is {data_bytes}"
        )


def read_adapter_config(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise VerificationError("bad_config", f"adapter_config.json: {exc}") from None
    if not isinstance(cfg, dict):
        raise VerificationError("bad_config", "adapter_config.json is not an object")
    if cfg.get("peft_type") != "LORA":
        raise VerificationError("bad_config", f"peft_type {cfg.get('peft_type')!r} is not LORA")
    for key in ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise VerificationError("bad_config", f"{key} is not supported")
    rank, modules = cfg.get("r"), cfg.get("target_modules")
    if not isinstance(rank, int) or rank <= 0:
        raise VerificationError("bad_config", f"rank r={rank!r} must be a positive integer")
    if not isinstance(modules, list) or not modules or not all(isinstance(m, str) for m in modules):
        raise VerificationError("bad_config", "target_modules must be a non-empty list of names")
    return cfg


def inspect_adapter(
    path: Path, base: BaseModelDims, supported: tuple[str, ...], max_bytes: int
) -> AdapterInfo:
    cfg = read_adapter_config(path / "adapter_config.json")
    rank, modules = int(cfg["r"]), tuple(sorted(cfg["target_modules"]))
    unsupported = [m for m in modules if m not in supported or base.module_dims(m) is None]
    if unsupported:
        raise VerificationError("unsupported_module", f"target modules {unsupported}")
    weights = path / "adapter_model.safetensors"
    limit = min(max_bytes, _size_limit(base, modules, rank))
    if weights.stat().st_size > limit:
        raise VerificationError(
            "too_large",
            f"weights are {weights.stat().st_size} bytes; rank {rank} and the base "
            f"model's dimensions allow at most {limit}",
        )
    tensors = read_safetensors_header(weights)
    for tensor in tensors:
        _check_tensor(tensor, base, modules, rank)
    alpha = float(cfg.get("lora_alpha", rank))
    return AdapterInfo(rank, alpha, modules, len(tensors), weights.stat().st_size)


def _size_limit(base: BaseModelDims, modules: tuple[str, ...], rank: int) -> int:
    per_layer = 0
    for module in modules:
        dims = base.module_dims(module)
        assert dims is not None  # checked by the caller
        per_layer += rank * (dims[0] + dims[1]) * 4  # float32 at most
    num_tensors = 2 * len(modules) * base.num_layers
    return 8 + base.num_layers * per_layer + _HEADER_SLACK_BYTES + 256 * num_tensors


def _check_tensor(t: TensorInfo, base: BaseModelDims, modules: tuple[str, ...], rank: int) -> None:
    match = _TENSOR_RE.match(t.name)
    if match is None:
        raise VerificationError("unexpected_tensor", f"{t.name!r} is not a LoRA A/B weight")
    layer, module = int(match["layer"]), match["module"]
    if module not in modules:
        raise VerificationError("unexpected_tensor", f"{t.name!r}: {module} is not targeted")
    if layer >= base.num_layers:
        raise VerificationError(
            "shape_mismatch", f"{t.name!r}: layer {layer} but {base.name} has {base.num_layers}"
        )
    in_features, out_features = base.module_dims(module) or (0, 0)
    expected = (rank, in_features) if match["ab"] == "A" else (out_features, rank)
    if t.shape != expected:
        raise VerificationError(
            "shape_mismatch",
            f"{t.name!r} has shape {list(t.shape)}, expected {list(expected)} "
            f"(rank {rank}, base model {base.name})",
        )
