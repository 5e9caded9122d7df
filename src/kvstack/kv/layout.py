"""The KV layout a cache accepts: dtype and per-token shape ``(num_layers, num_kv_heads,
head_dim)``, fixed by configuration or by the first store.

Stored KV is ``[num_layers, 2, num_tokens, num_kv_heads, head_dim]``; a chunk of ``n`` tokens
is the same with ``num_tokens = n``. Anything else is rejected with a ``ValueError`` that names
the problem, before anything is stored.
"""

from __future__ import annotations

import threading
from typing import Any

from kvstack.kv.format import DTYPES
from kvstack.kv.tensors import dtype_name, torch

__all__ = ["KVLayout"]


class KVLayout:
    def __init__(self, dtype: str | None = None, shape: tuple[int, int, int] | None = None) -> None:
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"unsupported KV dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        self.dtype = dtype
        self.shape = shape  # (num_layers, num_kv_heads, head_dim)
        self._lock = threading.Lock()

    def check(self, kv: Any, num_tokens: int) -> None:
        """Validate ``kv`` for ``num_tokens`` tokens; the first valid store fixes the layout."""
        if not isinstance(kv, torch.Tensor):
            raise ValueError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
        if kv.dim() != 5 or kv.shape[1] != 2:
            raise ValueError(
                "kv must have shape [num_layers, 2, num_tokens, num_kv_heads, head_dim], "
                f"got {list(kv.shape)}"
            )
        if kv.shape[2] != num_tokens:
            raise ValueError(f"kv holds {kv.shape[2]} tokens but {num_tokens} token ids were given")
        dtype = dtype_name(kv.dtype)
        if dtype not in DTYPES:
            raise ValueError(f"unsupported KV dtype {dtype}; supported: {', '.join(DTYPES)}")
        shape = (int(kv.shape[0]), int(kv.shape[3]), int(kv.shape[4]))
        with self._lock:
            want_dtype = self.dtype or dtype
            want_shape = self.shape or shape
            if dtype != want_dtype:
                raise ValueError(f"kv dtype {dtype} does not match the cache's {want_dtype}")
            if shape != want_shape:
                raise ValueError(
                    f"kv shape (num_layers, num_kv_heads, head_dim) = {shape} does not match "
                    f"the cache's {want_shape}"
                )
            self.dtype, self.shape = want_dtype, want_shape

    def matches(self, chunk: torch.Tensor, num_tokens: int, like: torch.Tensor | None) -> bool:
        """Whether a retrieved chunk has the layout of ``num_tokens`` tokens (and of ``like``,
        the first chunk of the same retrieval, when the layout is not fixed yet)."""
        if chunk.dim() != 5 or chunk.shape[1] != 2 or chunk.shape[2] != num_tokens:
            return False
        shape = (int(chunk.shape[0]), int(chunk.shape[3]), int(chunk.shape[4]))
        if self.dtype is not None and dtype_name(chunk.dtype) != self.dtype:
            return False
        if self.shape is not None and shape != self.shape:
            return False
        if like is None:
            return True
        return chunk.dtype == like.dtype and shape == (like.shape[0], like.shape[3], like.shape[4])
