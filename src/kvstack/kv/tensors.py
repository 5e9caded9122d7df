"""torch for the KV layer, plus dtype names and zero-copy byte views.

Importing this module without torch raises MissingExtraError naming the ``kv`` extra.
"""

from __future__ import annotations

from kvstack.errors import MissingExtraError

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingExtraError(
        "the KV cache layer needs torch; install it with: pip install 'kvstack[kv]'"
    ) from exc

__all__ = ["byte_view", "dtype_name", "torch", "torch_dtype"]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable memoryview of a contiguous CPU tensor's bytes (no copy)."""
    if not tensor.is_contiguous():
        raise ValueError("chunk tensors must be contiguous")
    flat = tensor.reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]
