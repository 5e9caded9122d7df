"""Page keys and common prefixes for the radix tree: the hot loops, kept to C-level slices."""

from __future__ import annotations

from kvstack.index.radix_node import PageKey

__all__ = ["common_prefix", "page_key"]


def page_key(tokens: list[int], pos: int, page_size: int) -> PageKey:
    """The child key of the page starting at ``pos``."""
    return tuple(tokens[pos : pos + page_size])


def common_prefix(key: list[int], tokens: list[int], pos: int, page_size: int) -> int:
    """Whole pages that ``key`` and ``tokens[pos:]`` share, in tokens.

    Binary search over page counts with slice comparisons: each comparison runs in C, so a
    32K-token node costs a dozen slice compares instead of 32K Python steps."""
    limit = min(len(key), len(tokens) - pos) // page_size
    low, high = 0, limit  # pages known equal / upper bound
    while low < high:
        mid = (low + high + 1) // 2
        n = mid * page_size
        if key[:n] == tokens[pos : pos + n]:
            low = mid
        else:
            high = mid - 1
    return low * page_size
